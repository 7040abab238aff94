"""Is there a crash on a guest's console: the one detector (:mod:`labctl.debug.crash` re-exports
it with the oopses' decoding). A leaf of the standard library, so that ``exec`` (which gives up on
a guest whose kernel crashed) and ``status`` (which calls it crashed) read a console without the
debug package.

Imports never: anything of labctl's
"""

from __future__ import annotations

from pathlib import Path

CRASH_MARKERS = (b"Kernel panic", b"BUG:", b"Oops:", b"general protection fault")
PANIC = b"Kernel panic - not syncing"
TAIL_BYTES = 65536


def console_end(path: Path, size: int = TAIL_BYTES) -> bytes:
    """The last ``size`` bytes of a console log (b'' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read()
    except OSError:
        return b""


def crashed(console: bytes) -> bool:
    """True when console text shows an oops, BUG, general protection fault or panic."""
    return any(m in console for m in CRASH_MARKERS)


_SEEN: dict[str, tuple[int, int, bool]] = {}  # console -> size, mtime, crashed


def console_crashed(console: Path) -> bool:
    """Whether the last 64 KiB of a guest's console file show a crash; the file is read again only
    once it changed (the status of a room's guests is asked each second by its live pages)."""
    try:
        st = console.stat()
    except OSError:
        return False
    seen = _SEEN.get(str(console))
    if seen is not None and seen[:2] == (st.st_size, st.st_mtime_ns):
        return seen[2]
    try:
        with console.open("rb") as f:
            f.seek(max(0, st.st_size - 65536))
            result = crashed(f.read())
    except OSError:
        return False
    if len(_SEEN) > 4096:
        _SEEN.clear()
    _SEEN[str(console)] = (st.st_size, st.st_mtime_ns, result)
    return result


def panicked(console: bytes) -> bool:
    """True when the kernel panicked (the guest is dead, whatever else runs)."""
    return PANIC in console
