"""A tiny initramfs written as an uncompressed newc cpio, no external tools."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """One file, directory or symlink in the archive."""

    name: str
    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def _header(ino: int, e: Entry) -> bytes:
    name = e.name.encode() + b"\0"
    fields = [ino, e.mode, 0, 0, 1, 0, len(e.data), 0, 0, *e.rdev, len(name), 0]
    hdr = b"070701" + b"".join(f"{v:08x}".encode() for v in fields) + name
    return hdr + b"\0" * (-len(hdr) % 4)


def write_cpio(entries: list[Entry], out: Path) -> None:
    """Write ``entries`` (parents before children) as a newc archive."""
    with open(out, "wb") as f:
        for ino, e in enumerate([*entries, Entry("TRAILER!!!", 0)], start=1):
            f.write(_header(ino, e))
            f.write(e.data + b"\0" * (-len(e.data) % 4))


def directory(name: str) -> Entry:
    return Entry(name, stat.S_IFDIR | 0o755)


def file(name: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(name, stat.S_IFREG | mode, data)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def chardev(name: str, major: int, minor: int, mode: int = 0o600) -> Entry:
    return Entry(name, stat.S_IFCHR | mode, b"", (major, minor))
