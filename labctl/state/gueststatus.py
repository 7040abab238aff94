"""The live status of each guest of a lab that is up (``labctl status``, the class, the web): its
records read, its console checked for a crash, its backend asked whether the machine exists
(imported then: ``status`` with no lab up loads no backend, and a QEMU guest's is read from
``/proc`` without loading its backend). :mod:`labctl.up.status` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import labctl.state.netstate as netstate  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.crashcheck import console_crashed
from labctl.errors import LabctlError
from labctl.state.runstate import UP, LabState


@dataclass
class GuestStatus:
    name: str
    state: str  # running, stopped, crashed
    ssh: str
    gdb: str | None
    accel: str
    pid: int
    nics: list[dict[str, object]] = field(default_factory=list)
    host: str | None = None  # the libvirt host's name in the lab
    settings: dict[str, object] = field(default_factory=dict)  # its bonds, bridges, routes, sysctls and firewall


def guest_statuses(state: LabState) -> list[GuestStatus]:
    """Live status of every guest of a lab that is up (its backend says whether each machine exists:
    loaded here, when there is a lab to ask about)."""
    from labctl.backends import guest_alive

    record = netstate.load(state.path)
    out = []
    for name, rec in state.guests.items():
        try:
            alive: bool | None = guest_alive(state.backend, rec)
        except LabctlError:
            alive = None  # its host is unreachable
        st = "crashed" if console_crashed(Path(rec.console)) else "unreachable" if alive is None \
            else "running" if alive else "stopped"
        if state.phase != UP:
            st = "incomplete" if state.incomplete else "starting"
        resolved = state.resolved["guests"][name]
        nics = [{**n, "driver": state.drivers.get(name, {}).get(n["name"], ""),
                 "link": "up" if record.link_up(name, n["name"]) else "down",
                 "impair": record.impair.get(netstate.nic_key(name, n["name"])) or {},
                 **({"vlan_offloads": offloads} if (offloads := state.offloads.get(name, {}).get(n["name"])) else {}),
                 **{kind: {k: v for k, v in n[kind].items() if k != "object"} for kind in ("xdp", "tc") if n.get(kind)}}
                for n in resolved["nics"]]
        gdb = rec.gdb
        host = h.get("name") if (h := state.hosts.get(name)) is not None else None
        settings: dict[str, object] = {k: resolved.get(k) or [] for k in ("bonds", "bridges", "routes", "sysctls")}
        settings["firewall"] = resolved.get("firewall")
        settings.update({k: resolved[k] for k in ("tunnels", "vrfs") if resolved.get(k)})  # labctl.lab.tunnels
        out.append(GuestStatus(name, st, f"127.0.0.1:{rec.ssh_port}", gdb, rec.accel, rec.pid, nics, host, settings))
    return out
