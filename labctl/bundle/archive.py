"""Pack a run directory into one ``.tar.gz`` to hand to someone else.

The archive is reproducible: members in sorted order, each under
``<run dir name>/``, owner 0/0 with no user or group names, whole-second
mtimes and a gzip header without a time stamp or file name. Packing the same
directory twice gives the same bytes. Sockets and FIFOs are left out, and so
are symbolic links that point outside the run directory.

A guest's vmcore (``guests/<guest>/vmcore``: its whole memory when it crashed, keys and all) is
left out unless asked (``vmcores``): a bundle handed to a colleague carries no guest's secrets by
surprise. Its summary, in the report, stays.
"""

from __future__ import annotations

import gzip
import logging
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from labctl.bundle.layout import check_bundle_dir, is_vmcore
from labctl.errors import LabctlError, UsageError
from labctl.paths import atomic_file, is_temp_of

log = logging.getLogger(__name__)

SUFFIX = ".tar.gz"


def default_archive(run_dir: Path) -> Path:
    """``<run_dir>.tar.gz`` next to the run directory."""
    return run_dir.with_name(run_dir.name + SUFFIX)


def archive_path(run_dir: Path, out: Path | None, force: bool = False) -> Path:
    """Where to write: ``out``, ``out/<name>.tar.gz`` if it is a directory, or the default.

    :raise UsageError: when ``out`` names a file that exists (unless ``force``) or is in no directory.
    """
    if out is None:
        return default_archive(run_dir)
    out = out.expanduser().absolute()
    if out.is_dir():
        return out / (run_dir.name + SUFFIX)
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent}: no such directory", hint="create it first or pick another -o path")
    if (out.exists() or out.is_symlink()) and not force:
        raise UsageError(f"{out} exists", hint="pick another -o path, or pass --force to replace it")
    return out


def entries(root: Path) -> list[Path]:
    """Everything under ``root`` sorted by path (a directory before its contents); symlinks are not followed."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        found += [Path(dirpath, name) for name in dirnames + filenames]
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _symlink_inside(path: Path, root: Path) -> bool:
    target = os.readlink(path)
    return not os.path.isabs(target) and (path.parent / target).resolve().is_relative_to(root)


def _tarinfo(tar: tarfile.TarFile, path: Path, root: Path) -> tarfile.TarInfo | None:
    if path.is_symlink() and not _symlink_inside(path, root):
        log.warning("left out %s: symbolic link out of the run directory", path)
        return None
    info = tar.gettarinfo(str(path), arcname=f"{root.name}/{path.relative_to(root).as_posix()}")
    if not (info.isreg() or info.isdir() or info.issym()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = int(info.mtime)
    return info


def _write_tar(root: Path, raw: BinaryIO, skip: Callable[[Path], bool]) -> None:
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_root_info(tar, root))
        for path in entries(root):
            if skip(path):
                continue
            info = _tarinfo(tar, path, root)
            if info is None:
                continue
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def _root_info(tar: tarfile.TarFile, root: Path) -> tarfile.TarInfo:
    info = tar.gettarinfo(str(root), arcname=root.name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = int(info.mtime)
    return info


def vmcores_of(run_dir: Path) -> list[Path]:
    """The guests' vmcores in a bundle, relative to it."""
    guests = run_dir / "guests"
    found = sorted(p.relative_to(run_dir) for p in guests.glob("*/*")) if guests.is_dir() else []
    return [p for p in found if is_vmcore(p)]


PRIVATE = 0o600


def pack(run_dir: Path, out: Path | None = None, force: bool = False, vmcores: bool = False) -> Path:
    """Pack ``run_dir`` into a ``.tar.gz`` (default ``<run_dir>.tar.gz`` beside it) and return its path;
    the guests' vmcores only when ``vmcores`` (:func:`vmcores_of` names them). The archive is 0600
    either way: the bundle's console logs and bpftrace files are, and so is a vmcore.

    Refuses (UsageError) a directory without manifest.json, and an ``out``
    file that exists unless ``force``.
    """
    root = check_bundle_dir(run_dir)
    dest = archive_path(root, out, force)
    dest = dest.parent.resolve() / dest.name  # a link at dest itself is replaced, never followed
    left_out = set() if vmcores else {root / p for p in vmcores_of(root)}
    try:
        # 0600: it carries the console logs (kernel logs), script text and, asked, the guests' memory
        with atomic_file(dest, PRIVATE) as raw:  # O_EXCL|O_NOFOLLOW in a checked directory, then renamed
            _write_tar(root, raw, skip=lambda p: p == dest or p in left_out
                       or (p.parent == dest.parent and is_temp_of(p.name, dest.name)))
    except OSError as exc:
        raise LabctlError(f"cannot write {dest}: {exc.strerror or exc}") from exc
    return dest
