"""Whether a QEMU labctl started is still that QEMU: read from ``/proc`` alone, so that ``status``
asks it without loading the backend (:func:`labctl.backends.guest_alive`)."""

from __future__ import annotations

from labctl.guestrecord import GuestRecord
from labctl.proc import pid_alive, pid_cmdline


def alive(rec: GuestRecord) -> bool:
    """True while the guest's QEMU runs: its pid lives and is QEMU with this guest's QMP socket
    (a reused pid is not the guest)."""
    return pid_alive(rec.pid) and any(rec.qmp in arg for arg in pid_cmdline(rec.pid))
