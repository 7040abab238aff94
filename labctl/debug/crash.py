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

# The detector itself is a leaf (labctl.crashcheck): exec and status watch a console without this package.
from labctl.crashcheck import CRASH_MARKERS as CRASH_MARKERS  # noqa: PLC0414
from labctl.crashcheck import PANIC as PANIC  # noqa: PLC0414
from labctl.crashcheck import TAIL_BYTES as TAIL_BYTES  # noqa: PLC0414
from labctl.crashcheck import console_crashed as console_crashed  # noqa: PLC0414
from labctl.crashcheck import console_end as console_end  # noqa: PLC0414
from labctl.crashcheck import crashed as crashed  # noqa: PLC0414
from labctl.crashcheck import panicked as panicked  # noqa: PLC0414
from labctl.debug.oops import parse_oopses
from labctl.debug.oops_text import render_oops
from labctl.debug.symbolize import Symbolizer
from labctl.kernel import Kernel

log = logging.getLogger(__name__)

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
