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

PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")


def downloads_dir() -> Path:
    return cache_dir() / "downloads"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def apt_download(package: str, into: Path | None = None) -> Path:
    """The .deb of ``package`` (candidate version), downloaded once into ``into`` (default: :func:`downloads_dir`).

    :raise ImageError: when apt cannot find or fetch it.
    """
    package_name(package)
    downloads = into or downloads_dir()
    downloads.mkdir(parents=True, exist_ok=True)
    version = _apt_candidate(package)
    name = f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    target = downloads / name
    if target.is_file():
        return target
    tmp = downloads / f".tmp-{package}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", "--", f"{package}={version}"],
            timeout=1800, cwd=tmp)
        debs = list(tmp.glob("*.deb"))
        if len(debs) != 1:
            raise ImageError(f"apt-get download {package} gave no .deb")
        debs[0].rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


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
    """The version apt would install of ``package``, or None when the archive has no such package.

    Remembered (``<cache>/downloads/candidates.json``) until apt's own state changes: asking
    apt costs most of a second, and every ``up`` asks for its kernels.
    """
    memo_file = downloads_dir() / "candidates.json"
    state = _apt_state()
    try:
        memo = json.loads(memo_file.read_text())
        if memo.get("apt") == state and package in memo.get("packages", {}):
            found = memo["packages"][package]
            return found if isinstance(found, str) else None
    except (OSError, ValueError, AttributeError):
        memo = {}
    version = _ask_apt(package)
    if not isinstance(memo, dict) or memo.get("apt") != state:
        memo = {"apt": state, "packages": {}}
    memo["packages"][package] = version
    with contextlib.suppress(OSError):
        downloads_dir().mkdir(parents=True, exist_ok=True)
        atomic_write(memo_file, json.dumps(memo, indent=1) + "\n")
    return version


def package_name(package: str) -> str:
    """``package`` when it is a Debian package's name (policy 5.6.1), never an option or a path.

    :raise ImageError: when it is not.
    """
    if PACKAGE.fullmatch(package) is None:
        raise ImageError(f"{package!r} is not a Debian package's name")
    return package


def _ask_apt(package: str) -> str | None:
    out = run(["apt-cache", "policy", "--", package_name(package)], timeout=60, check=False).stdout.decode()
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            cand = line.split(":", 1)[1].strip()
            if cand and cand != "(none)":
                return cand
    return None


def _apt_candidate(package: str) -> str:
    version = candidate(package)
    if version is None:
        raise ImageError(f"apt knows no package '{package}'", hint="run 'apt-get update'")
    return version
