"""Copy a guest's step directory into the bundle without trusting the guest.

Every step command runs as root in the guest, so whatever the guest sends
back is hostile until proven otherwise. The guest sends its directory as a
tar stream (``tar -cf - .``); :func:`extract` writes only regular files and
directories, each strictly inside the destination:

* no absolute names, no ``..``, no empty or over-long components, no
  control characters in a name;
* nothing but regular files and directories: symbolic and hard links,
  devices, FIFOs and sockets are skipped (and reported), so nothing on the
  host is ever followed or created outside the bundle;
* files are created with ``O_EXCL | O_NOFOLLOW`` in directories this
  function made itself, mode 0644, but 0600 for what holds a program's text,
  its output or the kernel's log (:func:`private`: ``bpftrace*``, ``dmesg*``);
* a budget: a guest cannot fill the host's disk. Every entry counts its tar
  header (:data:`HEADER`, 512 bytes) besides its data, so the budget bounds
  entries too (empty files, links, directories), and a cap on entries may be
  given on top (a step's copy-back: :data:`DEFAULT_ENTRIES`). The first entry
  over either ends the copy: it and the rest are not copied (one line says so).

Debian 12's Python 3.11.2 has no ``tarfile`` extraction filters, hence the
rules here rather than ``filter="data"``.
"""

from __future__ import annotations

import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO

MAX_COMPONENT = 255
MAX_DEPTH = 32
DEFAULT_BUDGET = 8 << 30  # bytes per guest and step
DEFAULT_ENTRIES = 10_000  # entries per guest and step (a step's results: logs, traces, captures)
HEADER = 512  # what an entry counts against the budget besides its data
_CHUNK = 1 << 20


@dataclass
class Extracted:
    """What :func:`extract` did: files written, and what it refused (name: reason)."""

    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    truncated: bool = False  # the budget or the cap on entries ran out
    entries: int = 0  # entries of the stream taken (files, directories and those skipped)

    @property
    def used(self) -> int:
        """What counts against the budget: the files' bytes, and a header for each entry."""
        return self.bytes + HEADER * self.entries


def safe_parts(name: str) -> tuple[str, ...] | None:
    """The components of a member name when it stays inside the destination, else None."""
    if not name or name.startswith("/") or any(ord(c) < 0x20 or c == "\x7f" for c in name):
        return None
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if not parts or len(parts) > MAX_DEPTH:
        return None
    if any(p == ".." or len(p.encode()) > MAX_COMPONENT for p in parts):
        return None
    return parts


def _kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return "symbolic link"
    if m.islnk():
        return "hard link"
    if m.ischr() or m.isblk():
        return "device file"
    if m.isfifo():
        return "FIFO"
    return "special file"


def _directory(dest: Path, parts: tuple[str, ...]) -> Path | None:
    """``dest/parts...`` as a real directory made here (None if a non-directory is in the way)."""
    path = dest
    for part in parts:
        path = path / part
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        except OSError:
            return None
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):  # a file (never a link: none is ever made) is in the way
            return None
    return path


PRIVATE_PREFIXES = ("bpftrace", "dmesg")


def private(name: str) -> bool:
    """A file the bundle keeps 0600: a bpftrace program (which may come from a root-only file), its
    output and log, the guest kernel's log."""
    return name.startswith(PRIVATE_PREFIXES)


def _write(src: IO[bytes], target: Path, size: int) -> int:
    mode = 0o600 if private(target.name) else 0o644
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    written = 0
    with os.fdopen(fd, "wb") as out:
        while written < size:
            chunk = src.read(min(_CHUNK, size - written))
            if not chunk:
                break
            out.write(chunk)
            written += len(chunk)
    return written


def size_text(n: int) -> str:
    """``n`` bytes as the budget is given: 512 B, 64 KiB, 4 GiB."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} B"


def _over(result: Extracted, member: tarfile.TarInfo, budget: int, max_entries: int | None) -> str | None:
    """Why ``member`` (and what follows it) is not taken, or None."""
    if max_entries is not None and result.entries >= max_entries:
        return f"over the cap of {max_entries} entries"
    size = member.size if member.isfile() else 0
    if result.used + HEADER + size > budget:
        return f"over the copy budget of {size_text(budget)} (512 bytes an entry besides its data)"
    return None


def extract(stream: BinaryIO, dest: Path, budget: int = DEFAULT_BUDGET,
            max_entries: int | None = None) -> Extracted:
    """Extract the tar ``stream`` into the directory ``dest`` (which must exist), by the rules above:
    at most ``budget`` bytes (headers counted) and ``max_entries`` entries.

    :raise tarfile.TarError: when the stream is not a tar archive at all.
    """
    result = Extracted()
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if member.isdir() and member.name.strip("/") in ("", "."):
                continue  # the step directory itself ("." of ``tar -cf - .``)
            over = _over(result, member, budget, max_entries)
            if over is not None:
                result.skipped.append(f"{member.name.strip('/')}: {over}; it and the rest were not copied")
                result.truncated = True
                break
            result.entries += 1
            parts = safe_parts(member.name)
            if parts is None:
                result.skipped.append(f"{member.name!r}: a name outside the step directory")
                continue
            shown = "/".join(parts)
            if member.isdir():
                if _directory(dest, parts) is None:
                    result.skipped.append(f"{shown}: a file is in the way")
                continue
            if not member.isfile():
                result.skipped.append(f"{shown}: a {_kind(member)}")
                continue
            parent = _directory(dest, parts[:-1])
            src = tar.extractfile(member)
            if parent is None or src is None:
                result.skipped.append(f"{shown}: a file is in the way")
                continue
            try:
                result.bytes += _write(src, parent / parts[-1], member.size)
                result.files += 1
            except FileExistsError:
                result.skipped.append(f"{shown}: sent twice")
            except OSError as exc:
                result.skipped.append(f"{shown}: {exc.strerror or exc}")
    return result
