"""What labctl keeps in its cache of packs and URLs, and removing it when nothing uses it::

    <cache>/packs/<digest>/             a packed file unpacked (:mod:`.unpack`)
    <cache>/images/<name>/pack-<sha>/   its image, installed in the image cache
    <cache>/fetched/<sha>               a file fetched from an http(s) URL (:mod:`.fetch`)
    <cache>/git/<sha>/                  a git repository's fetched commits and their trees (:mod:`.gitfetch`)

A labctl process that uses one of them pins it for the rest of its life (:func:`pin`: a shared
``flock`` on ``.NAME.pin`` beside it, taken before the entry is made or read). :func:`prune`
takes that lock exclusive without waiting, so it never removes an entry that a running labctl is
unpacking, preparing or bringing a lab up from; nor one that a lab that is up names (its state
names the unpacked lab's files or the image it runs on; a git entry, by its repository's URL, is
named by the lab file's source ``git+...@COMMIT#PATH``); nor one with a file open (a QEMU reading
its root file system).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from labctl.paths import cache_dir, check_within
from labctl.proc import files_open_under

_PINS: list[int] = []  # this process's pins: held until it exits


def _pin_file(entry: Path) -> Path:
    return entry.parent / f".{entry.name}.pin"


def pin(entry: Path) -> None:
    """Keep ``entry`` (made or not yet) from :func:`prune` for as long as this process lives;
    waits while a prune is deciding about it.

    :raise UnsafePath: for an entry outside the cache.
    """
    check_within(entry, cache_dir())
    entry.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(_pin_file(entry), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(_pin_file(entry)))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # a prune removed the entry and its pin file meanwhile: pin the new one
    _PINS.append(fd)


@dataclass(frozen=True)
class Entry:
    """One entry: its kind, path, bytes on disk, and what it is (a git one: its repository's URL)."""

    kind: str  # "pack", "pack image", "fetched", "git"
    path: Path
    size: int
    what: str = ""

    def named_in(self, texts: Iterable[str]) -> bool:
        keys = [str(self.path)] + ([self.what] if self.kind == "git" and self.what else [])
        return any(k in t for t in texts for k in keys)


def entries() -> list[Entry]:
    """Every entry of the cache (see the module), largest first."""
    root = cache_dir()
    found: list[Entry] = []
    for kind, paths in (("pack", _listed(root / "packs")), ("fetched", _listed(root / "fetched")),
                        ("git", _listed(root / "git")),
                        ("pack image", [p for d in _listed(root / "images") for p in _listed(d)
                                        if p.name.startswith("pack-")])):
        for p in paths:
            what = _read(p / "url") if kind == "git" else ""
            found.append(Entry(kind, p, _disk_size(p), what))
    return sorted(found, key=lambda e: -e.size)


def prune(in_use: Iterable[str]) -> tuple[list[Entry], list[Entry]]:
    """Remove every entry that nothing uses (see the module); ``in_use``: the state of each lab that
    is up, as text. The entries removed, and those kept because something uses them."""
    texts = list(in_use)
    removed, kept = [], []
    for entry in entries():
        fd = os.open(_pin_file(entry.path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                kept.append(entry)
                continue
            if entry.named_in(texts) or (entry.path.is_dir() and files_open_under(entry.path)):
                kept.append(entry)
                continue
            if entry.path.is_dir() and not entry.path.is_symlink():
                shutil.rmtree(entry.path)
            else:
                entry.path.unlink()
            for extra in (entry.path.parent / f".{entry.path.name}.lock", _pin_file(entry.path)):
                extra.unlink(missing_ok=True)  # the pin last, still locked: pin() then makes a new one
            removed.append(entry)
        finally:
            os.close(fd)
    return removed, kept


def _listed(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


def _read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def _disk_size(p: Path) -> int:
    """Bytes on disk under ``p`` (holes not counted, a file linked twice once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for f in [p, *p.rglob("*")] if p.is_dir() and not p.is_symlink() else [p]:
        try:
            st = os.lstat(f)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total
