"""Out-of-tree modules built against a kernel tree (or Debian's headers) in a persistent build
directory per tree and module source (``~/.cache/labctl/modbuild/``), and not built at all when
nothing the last build read has changed.

kbuild's ``.cmd`` files list every file a build step read (the sources, each header with its
``include/config/`` guards). After a build, each one's size, modification time and digest are
recorded with the tree's ``Module.symvers`` and ``.config``, modpost and the compiler
(:func:`record`); the next kernel of the tree skips ``make`` when all of them are as recorded,
by time or else by content (:func:`unchanged`) -- a change to ``net/core/dev.c`` costs nothing
here, one to a header the module includes rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from labctl.paths import atomic_write, cache_dir, resource_dir

RECORD = ".labctl-inputs.json"
_WILDCARD = re.compile(r"\$\(wildcard ([^)]+)\)")


def build_dir(build: Path, name: str) -> Path:
    """The persistent build directory of module ``name`` against kernel ``build``: one per tree and
    module source, kept between kernels of the tree so that kbuild rebuilds incrementally."""
    source = resource_dir("guest") / "modules" / name
    digest = hashlib.sha256(str(build.resolve()).encode())
    for f in sorted(p for p in source.rglob("*") if p.is_file()):
        digest.update(f.relative_to(source).as_posix().encode() + b"\0" + f.read_bytes())
    return cache_dir() / "modbuild" / f"{name}-{digest.hexdigest()[:16]}"


def _inputs(src: Path, build: Path) -> list[Path]:
    """Every file the last build of ``src`` read, as its ``.cmd`` files list them, plus the tree's
    symbol versions and configuration and the compiler."""
    paths: set[Path] = set()
    for cmd in src.glob(".*.cmd"):
        for line in cmd.read_text(errors="replace").splitlines():
            line = line.strip().rstrip("\\").strip()
            if not line or line.startswith(("cmd_", "savedcmd_", "$(deps_")) or line.endswith(":"):
                continue
            if line.startswith(("source_", "deps_")):
                line = line.partition(":=")[2].strip()
            for token in [*_WILDCARD.findall(line), *_WILDCARD.sub("", line).split()]:
                if token.startswith("$(") or token.endswith(":"):
                    continue
                paths.add(build / token if not token.startswith("/") else Path(token))
    paths |= {build / "Module.symvers", build / ".config", build / "include" / "config" / "auto.conf",
              build / "scripts" / "mod" / "modpost", build / "scripts" / "module.lds"}
    gcc = shutil.which("gcc")
    if gcc:
        paths.add(Path(os.path.realpath(gcc)))
    return sorted(paths)


def _stamp(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def record(src: Path, build: Path) -> None:
    """After a build: what it read, each file's size, change time and content digest."""
    inputs = {str(p): (stamp + [_digest(p)] if (stamp := _stamp(p)) else None) for p in _inputs(src, build)}
    atomic_write(src / RECORD, json.dumps({"build": str(build), "inputs": inputs}) + "\n")


def _same(path: Path, recorded: object) -> bool:
    """Whether ``path`` is as recorded: the same size and change time, or else the same content (the
    tree's build rewrites Module.symvers and regenerated headers with the same bytes)."""
    now = _stamp(path)
    if recorded is None or now is None:
        return recorded is None and now is None
    if not isinstance(recorded, list) or len(recorded) != 3:
        return False
    return now == recorded[:2] or (now[0] == recorded[0] and _digest(path) == recorded[2])


def unchanged(src: Path, build: Path) -> bool:
    """Whether the module built in ``src`` is current: built against ``build``, its ``.ko`` there,
    and every file the build read unchanged since."""
    try:
        data = json.loads((src / RECORD).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("build") != str(build) or not isinstance(data.get("inputs"), dict):
        return False
    if not list(src.glob("*.ko")):
        return False
    return all(_same(Path(p), recorded) for p, recorded in data["inputs"].items())
