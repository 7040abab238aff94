"""Changing a running lab's links: impairments (netem in the guest) and link state (QMP ``set_link``).

Used by ``up`` (the lab file's impairments), ``labctl impair``, ``labctl link``
and the steps runner; every change is recorded in ``network.json``
(:mod:`labctl.state.netstate`) once it is in force, so ``labctl status`` shows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labctl.backends import Backend, get_backend, netdev_id
from labctl.errors import GuestError, LabStateError, UsageError
from labctl.lab import Impairment, Nic, close_match
from labctl.net import apply_command

if TYPE_CHECKING:
    from labctl.lab import NicRecord
    from labctl.ssh import Session
from labctl.state import LabState, update_netstate

APPLY_TIMEOUT = 60.0


def lab_nic(state: LabState, guest: str, nic: str) -> NicRecord:
    """The resolved lab NIC ``guest.nic`` of a lab that is up (its ``index`` names its netdev).

    :raise UsageError: for a guest or NIC the lab does not have (exit 2).
    """
    guests = state.guest_specs()
    if guest not in guests:
        raise UsageError(f"lab '{state.lab}' has no guest '{guest}'{close_match(guest, guests)}",
                         hint=f"its guests: {', '.join(guests) or 'none'}")
    nics = {n["name"]: n for n in guests[guest]["nics"]}
    if nic not in nics:
        raise UsageError(f"guest {guest} of lab '{state.lab}' has no lab NIC '{nic}'{close_match(nic, nics)}",
                         hint=f"its lab NICs: {', '.join(nics) or 'none'} (mgmt0 is labctl's own)")
    return nics[nic]


def netdev(state: LabState, guest: str, nic: str) -> str:
    """The QEMU netdev id of a lab NIC (as :func:`labctl.backends.netdev_id` names it)."""

    n = lab_nic(state, guest, nic)
    return netdev_id(Nic(n["name"], n["model"], n["network"], (), n["mac"], 1, None, int(n["index"])))


def apply_impairment(state: LabState, guest: str, nic: str, imp: Impairment | None,
                     session: Session | None = None) -> None:
    """Put ``imp`` in force on ``guest.nic`` (None or empty: no impairment) and record it.

    :raise UsageError: for an unknown NIC. :raise GuestError: when the guest refuses it.
    """
    from labctl.ssh import Session  # paramiko: when a guest is spoken to

    lab_nic(state, guest, nic)
    own = session is None
    s = session or Session(state.endpoint(guest))
    try:
        res = s.run(apply_command(nic, imp), timeout=APPLY_TIMEOUT)
    finally:
        if own:
            s.close()
    if res.status != 0:
        why = (res.stderr or res.stdout).decode(errors="replace").strip().splitlines()
        raise GuestError(f"guest {guest} refused the impairment of {nic} ({imp.describe() if imp else 'none'}): "
                         f"{why[-1] if why else f'tc exited with status {res.status}'}")
    with update_netstate(state.path) as record:
        record.set_impairment(guest, nic, imp)


def set_link(state: LabState, guest: str, nic: str, up: bool, backend: Backend | None = None) -> None:
    """Take the NIC's link down or up (the guest sees its carrier go) and record it.

    :raise UsageError: for an unknown NIC. :raise MachineError: when QEMU refuses it.
    """
    name = netdev(state, guest, nic)
    rec = state.guests.get(guest)
    if rec is None:
        raise LabStateError(f"lab '{state.lab}' has no running guest '{guest}'")
    (backend or get_backend(state.backend)).qmp(rec, "set_link", {"name": name, "up": up})
    with update_netstate(state.path) as record:
        record.set_link(guest, nic, up)


def lab_impairments(state: LabState) -> dict[tuple[str, str], Impairment]:
    """The impairments the lab file sets on its NICs, by (guest, nic)."""
    out = {}
    for gname, g in state.guest_specs().items():
        for n in g["nics"]:
            if imp := n.get("impair"):
                out[(gname, n["name"])] = Impairment.from_dict(imp)
    return out
