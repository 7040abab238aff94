"""Debian's archive, as labctl uses it: which version of a package it has, and its .deb, downloaded once.

Packages are downloaded with ``apt-get download`` into ``<cache>/downloads``
(kept: a rebuild or another kernel preparation reuses them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from labctl.errors import ImageError
from labctl.paths import atomic_write, cache_dir
from labctl.proc import run


def downloads_dir() -> Path:
    return cache_dir() / "downloads"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


#: Debian's grammar for a package name and a version (Debian Policy 5.6.1, 5.6.12): data, never an option.
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
_RETRY = "point apt at an archive that has it (e.g. snapshot.debian.org in /etc/apt/sources.list.d), then apt-get update"


def check_name(package: str, version: str | None = None) -> None:
    """Refuse a package name or version that is not of Debian's grammar (a path, an option).

    :raise ImageError: when either is not.
    """
    if not _PACKAGE.fullmatch(package):
        raise ImageError(f"{package!r} is not a Debian package's name")
    if version is not None and not _VERSION.fullmatch(version):
        raise ImageError(f"'{version}' is not a Debian version (package {package})")


def apt_download(package: str, version: str, into: Path | None = None) -> Path:
    """The .deb of ``package`` at exactly ``version``, downloaded once into ``into`` (default:
    :func:`downloads_dir`). Never "the newest": the archive moves, and a kernel's debug info,
    headers and source must be the kernel's own.

    :raise ImageError: when the archive does not carry that version (exit 3), or apt cannot fetch it.
    """
    check_name(package, version)
    downloads = into or downloads_dir()
    downloads.mkdir(parents=True, exist_ok=True)
    name = f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    target = downloads / name
    if target.is_file():
        return target
    require(package, version)
    tmp = downloads / f".tmp-{package}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", "--", f"{package}={version}"],
            timeout=1800, cwd=tmp)
        debs = list(tmp.glob("*.deb"))
        if len(debs) != 1:
            raise ImageError(f"apt-get download {package}={version} gave no .deb")
        debs[0].rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def require(package: str, version: str) -> None:
    """Nothing, when the archive carries ``package`` at ``version``.

    :raise ImageError: naming what the archive has instead, and what to do (exit 3).
    """
    have = versions(package)
    if version in have:
        return
    listed = ", ".join(have[:6]) + (", ..." if len(have) > 6 else "") if have else "no version at all"
    raise ImageError(f"the archive no longer carries {package} {version} (it has {listed})", hint=_RETRY)


# apt's package cache: what it says changes only when these files do (an apt-get update, an install).
APT_STATE = (Path("/var/cache/apt/pkgcache.bin"), Path("/var/lib/apt/lists"), Path("/var/lib/dpkg/status"),
             Path("/etc/apt/preferences.d"), Path("/etc/apt/sources.list.d"))


def _apt_state() -> str:
    parts = []
    for path in APT_STATE:
        try:
            st = path.stat()
            parts.append(f"{path}:{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            parts.append(f"{path}:-")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def candidate(package: str) -> str | None:
    """The version apt would install of ``package`` (the newest it can fetch), or None when the
    archive has no such package."""
    have = versions(package)
    return have[0] if have else None


def versions(package: str) -> list[str]:
    """Every version of ``package`` apt can fetch, newest first (``apt-cache policy``'s version
    table); empty when the archive has no such package.

    Remembered (``<cache>/downloads/apt-versions.json``) until apt's own state changes: asking
    apt costs most of a second, and every ``up`` asks for its kernels.
    """
    check_name(package)
    memo_file = downloads_dir() / "apt-versions.json"
    state = _apt_state()
    try:
        memo = json.loads(memo_file.read_text())
        if memo.get("apt") == state and package in memo.get("packages", {}):
            found = memo["packages"][package]
            if isinstance(found, list) and all(isinstance(v, str) for v in found):
                return list(found)
    except (OSError, ValueError, AttributeError):
        memo = {}
    have = _ask_apt(package)
    if not isinstance(memo, dict) or memo.get("apt") != state:
        memo = {"apt": state, "packages": {}}
    memo["packages"][package] = have
    with contextlib.suppress(OSError):
        downloads_dir().mkdir(parents=True, exist_ok=True)
        atomic_write(memo_file, json.dumps(memo, indent=1) + "\n")
    return have


def parse_policy(text: str) -> list[str]:
    """The versions of ``apt-cache policy PACKAGE``'s version table, newest first (the order
    apt prints them in), without the installed marker and priorities."""
    out: list[str] = []
    in_table = False
    for line in text.splitlines():
        if line.strip() == "Version table:":
            in_table = True
            continue
        if not in_table:
            continue
        # A version line is indented 5 (or "*** " for the installed one); its sources 8.
        words = line.replace("***", " ").split()
        if (len(words) == 2 and not line.startswith("        ") and words[1].lstrip("-").isdigit()
                and _VERSION.fullmatch(words[0]) and words[0] not in out):
            out.append(words[0])
    return out


def _ask_apt(package: str) -> list[str]:
    out = run(["apt-cache", "policy", "--", package], timeout=60, check=False).stdout.decode()
    return [v for v in parse_policy(out) if _fetchable(out, v)]


def _fetchable(policy: str, version: str) -> bool:
    """``version`` has a source besides dpkg's status file (an installed package no archive
    carries any more cannot be downloaded)."""
    lines = policy.splitlines()
    for i, line in enumerate(lines):
        words = line.replace("***", " ").split()
        if len(words) == 2 and words[0] == version and not line.startswith("        "):
            for src in lines[i + 1:]:
                if not src.startswith("        "):
                    break
                if "/var/lib/dpkg/status" not in src:
                    return True
            return False
    return False


def newest_abi(line: str, flavour: str) -> str | None:
    """The newest Debian kernel ABI of ``line`` (``6.1.0``) in ``flavour`` that the archive carries
    (``6.1.0-57``), or None. Debian names each ABI's packages apart (``linux-image-6.1.0-57-amd64-unsigned``)
    and drops old ones from its archive: a recipe that pins an ABI follows its line from then on."""
    have = abis(line, flavour)
    return have[0] if have else None


def abis(line: str, flavour: str) -> list[str]:
    """Every ABI of ``line`` in ``flavour`` the archive carries, newest first (``6.1.0-57``, ``6.1.0-56``, ...)."""
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", line) or not _PACKAGE.fullmatch(flavour):
        return []
    prefix = f"linux-image-{line}-"
    out = run(["apt-cache", "pkgnames", "--", prefix], timeout=60, check=False).stdout.decode()
    pattern = re.compile(re.escape(prefix) + r"([0-9]+)-" + re.escape(flavour) + r"-unsigned")
    numbers = sorted((int(m[1]) for m in map(pattern.fullmatch, out.split()) if m), reverse=True)
    return [f"{line}-{n}" for n in numbers if versions(f"{prefix}{n}-{flavour}-unsigned")]
