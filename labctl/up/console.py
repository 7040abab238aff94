"""A guest's serial console as ``up`` reads it: labctl's READY and FAILED lines,
the NIC drivers the READY line names, and the lines a person needs when
something went wrong. Whether the kernel crashed is :mod:`labctl.debug.crash`'s call.
"""

from __future__ import annotations

from pathlib import Path

from labctl.debug import CRASH_MARKERS

READY = b"LABCTL-READY"
FAILED = b"LABCTL-FAILED"



def console_tail(path: Path | str, lines: int = 15) -> str:
    """What a person needs from a console log: from the first panic/oops
    marker on (at most 25 lines), else the last ``lines`` lines."""
    try:
        data = Path(path).read_bytes()[-65536:]
    except OSError:
        return ""
    text = data.decode(errors="replace").replace("\r", "").strip().splitlines()
    for i, line in enumerate(text):
        if any(m.decode() in line for m in (FAILED, *CRASH_MARKERS)):
            return "\n".join(text[i:i + 25])
    return "\n".join(text[-lines:])


def ready_drivers(console: bytes) -> dict[str, str]:
    """NIC name -> driver from a console's ``LABCTL-READY host uptime nic=driver...`` line."""
    for line in console.splitlines():
        if line.startswith(READY):
            words = line.decode(errors="replace").split()[3:]
            return dict(w.split("=", 1) for w in words if "=" in w)
    return {}


