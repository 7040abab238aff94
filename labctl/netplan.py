"""How lab networks are wired on one host, without root.

Each lab NIC is a QEMU ``dgram`` netdev on a unix datagram socket in the run
directory. A network with two members links them directly (each socket
sends to the other); a network with three or more gets labctl's L2 switch
(:mod:`labctl.hub`) and every member sends to the switch. The plan is data:
the backend turns it into argv, ``labctl up --plan`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labctl.lab.model import Lab

DIRECT = "direct"
SWITCH = "switch"
ALONE = "alone"


@dataclass(frozen=True)
class Port:
    """One lab NIC's attachment: its own socket and where it sends."""

    guest: str
    nic: str
    network: str
    local: Path
    remote: Path | None


@dataclass(frozen=True)
class Segment:
    """One lab network: its mechanism and, for a switch, the switch socket."""

    network: str
    mechanism: str
    ports: tuple[Port, ...]
    switch_socket: Path | None


def plan_networks(lab: Lab, net_dir: Path) -> dict[str, Segment]:
    """Assign every NIC a socket and pick each network's mechanism."""
    segments: dict[str, Segment] = {}
    for idx, (name, net) in enumerate(lab.networks.items()):
        members = list(net.members)
        local = {m: net_dir / f"n{idx}-{m[0]}-{_nic_index(lab, *m)}.sock" for m in members}
        if len(members) == 2:
            a, b = members
            ports = (_port(a, name, local[a], local[b]), _port(b, name, local[b], local[a]))
            segments[name] = Segment(name, DIRECT, ports, None)
        elif len(members) >= 3:
            hub = net_dir / f"n{idx}-switch.sock"
            ports = tuple(_port(m, name, local[m], hub) for m in members)
            segments[name] = Segment(name, SWITCH, ports, hub)
        else:  # one member: QEMU needs a peer address; nobody binds it
            ports = tuple(_port(m, name, local[m], net_dir / f"n{idx}-nobody.sock") for m in members)
            segments[name] = Segment(name, ALONE, ports, None)
    return segments


def port_of(segments: dict[str, Segment], guest: str, nic: str) -> Port:
    for seg in segments.values():
        for p in seg.ports:
            if p.guest == guest and p.nic == nic:
                return p
    raise KeyError(f"{guest}.{nic}")


def _nic_index(lab: Lab, guest: str, nic: str) -> int:
    return next(n.index for n in lab.guests[guest].nics if n.name == nic)


def _port(member: tuple[str, str], network: str, local: Path, remote: Path | None) -> Port:
    return Port(member[0], member[1], network, local, remote)
