"""What QEMU's record/replay cannot record, said before anything starts.

QEMU 7.2 records a guest only under TCG with one virtual CPU (``-icount`` needs single-threaded
TCG; KVM runs the guest's instructions where QEMU cannot count them), and only the inputs that go
through QEMU's recorded paths: a virtio-9p share reads host files that the recording does not hold
(its replay would read whatever they are then), and a guest on a remote host has its QEMU there.
A replay keeps each netdev's kind (see ``labctl.backends.qemu.rrargv``), and a tap netdev's kind needs the lab's tap
device: guests on tap networks are not recorded either. A step's ``{link: GUEST.NIC, state: ...}``
on a recorded guest's own NIC is a monitor command (``set_link``) the recording does not hold: its
replay would see the link up where the run saw it down.
"""

from __future__ import annotations

import functools
import re

from labctl.lab.model import DEFAULT_HOST, Lab
from labctl.lab.netopts import LinkSpec

RECORD_BACKEND = "qemu"
_TEMPLATE = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def record_refusals(lab: Lab, name: str, accel: str, backend: str) -> list[str]:
    """Why guest ``name`` of ``lab`` cannot be recorded under ``accel`` (kvm, tcg or auto) on
    ``backend``; empty: it can."""
    guest = lab.guests[name]
    taps = [f"{g}.{n}" for nic in guest.nics for g, n in lab.networks[nic.network].members
            if lab.guests[g].nic(n).queues > 1]
    why = []
    if backend != RECORD_BACKEND:
        why.append(f"the {backend} backend: labctl records guests it starts itself (backend: qemu)")
    if accel == "kvm":
        why.append("KVM: record/replay counts the guest's instructions, which only TCG does (--accel tcg)")
    if guest.cpus != 1:
        why.append(f"{guest.cpus} vCPUs: a recording runs on single-threaded TCG, one vCPU (cpus: 1)")
    if guest.shares:
        why.append("a virtio-9p share: the host files it reads are not in the recording")
    if guest.host != DEFAULT_HOST:
        why.append(f"host {guest.host}: its QEMU runs on another machine")
    if taps:
        why.append(f"a tap network (the multi-queue NIC {taps[0]} needs one): its replay would need the lab's taps")
    if linked := _links_set(lab, name):
        why.append(f"step {linked[0]} sets the link of {linked[1]} (QMP set_link): the recording does not hold it")
    return [f"guest {guest.name} cannot be recorded: {w}" for w in why]


def _links_set(lab: Lab, name: str) -> tuple[str, str] | None:
    """The first step, and the NIC, whose ``link`` entry names a NIC of guest ``name`` (with each
    matrix row's values put in its template)."""
    for step in lab.steps:
        for entry in step.run:
            if not isinstance(entry, LinkSpec):
                continue
            rows: tuple[dict[str, str], ...] = step.matrix or ({},)
            for row in rows:
                nic = _TEMPLATE.sub(functools.partial(_value, row), entry.nic)
                if nic.split(".", 1)[0] == name:
                    return step.name, nic
    return None


def _value(row: dict[str, str], m: re.Match[str]) -> str:
    """A ``{{name}}``'s value in a matrix row (the template itself when the row has none)."""
    return row.get(m.group(1), m.group(0))
