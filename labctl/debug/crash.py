"""Crashed guests, the one detector: is there an oops on a console, did the kernel
panic, what are the oopses' titles, and their decoding (the bundle writes it).

``up`` fails a boot on any oops (:func:`crashed`), ``status`` calls such a
guest crashed, and the steps runner gives up on a guest whose kernel
panicked (:func:`panicked`): an oops in a process's context leaves the
rest of the kernel running.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from labctl.debug.oops import parse_oopses
from labctl.debug.oops_text import render_oops
from labctl.debug.symbolize import Symbolizer
from labctl.kernel import Kernel

log = logging.getLogger(__name__)

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


def oops_titles(console_text: str) -> list[str]:
    """Short titles of the oopses in a console log ("BUG: ... in cp_start_xmit")."""
    return [o.title for o in parse_oopses(console_text)]


@dataclass(frozen=True)
class DecodedConsole:
    """Every oops of a console log: titles, the decoded text, and its JSON (None when decoding failed)."""

    titles: list[str]
    text: str
    json: str | None


def decode_console(console: Path, kernel: Kernel) -> DecodedConsole | None:
    """Decode every oops of ``console`` against the guest's ``kernel``; None when the log holds
    none (or cannot be read). Never raises for a missing vmlinux: the text then says why."""
    try:
        text = console.read_text(errors="replace")
    except OSError:
        return None
    oopses = parse_oopses(text)
    if not oopses:
        return None
    titles = [o.title for o in oopses]
    try:
        decoded = Symbolizer(kernel.vmlinux_debug, kernel.debug_modules).decode(oopses)
        lines = [t.plain for i, d in enumerate(decoded, 1) for t in [*render_oops(d, i)]]
        return DecodedConsole(titles, "\n".join(lines) + "\n",
                              json.dumps([d.to_json() for d in decoded], indent=2) + "\n")
    except Exception as exc:  # noqa: BLE001 - decoding is a bonus, the console is the record
        log.warning("decoding the oops in %s failed: %s", console, exc)
        return DecodedConsole(titles, "\n".join(titles) + f"\n(decoding failed: {exc})\n", None)
