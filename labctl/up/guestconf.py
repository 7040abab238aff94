"""The configuration a guest's init reads from fw_cfg (``guest/init``)."""

from __future__ import annotations

from labctl.backends import MGMT_ADDR
from labctl.lab import MGMT_NIC, Guest


def render(guest: Guest, mgmt_mac: str, standby_sshd: bool = False) -> str:
    """One record per line; every token was validated (no spaces, no quoting needed).

    ``standby_sshd``: the boot is to become the post-boot snapshot and nothing logs in before
    it is taken: init starts no sshd that listens, only the standby that waits for its host key
    (``guest/init``; labctl hands it the guest's own key once the snapshot is taken).
    """
    lines = [f"hostname {guest.name}", f"nic {mgmt_mac} {MGMT_NIC} {MGMT_ADDR}"]
    if standby_sshd:
        lines.append("sshd standby")
    for nic in guest.nics:
        opts = []
        if nic.mtu:
            opts.append(f"mtu={nic.mtu}")
        if nic.queues > 1:
            opts.append(f"queues={nic.queues}")
        lines.append(" ".join(["nic", nic.mac, nic.name, str(nic.ip) if nic.ip else "-", *opts]))
    return "\n".join(lines) + "\n"
