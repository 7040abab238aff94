"""How lab networks are wired, without root.

Each lab NIC is a QEMU ``dgram`` netdev. On labctl's own machine it is a
unix datagram socket in the run directory:

* ``unix-dgram``: a network with two members links them directly (each
  socket sends to the other);
* ``switch``: a network with three or more gets labctl's L2 switch
  (:mod:`labctl.net.switch`) and every member sends to the switch;
* ``alone``: a single member sends to a socket nobody binds.
* ``tap``: a network with a multiqueue NIC (``queues`` > 1), when labctl runs
  as root with the qemu backend: each member is a tap device (one queue per
  NIC queue) on a bridge, both in a network namespace of the lab's own
  (:mod:`labctl.up.taps`), so nothing of it is on the host's network. QEMU
  gets the tap's queues as file descriptors, and the guest real multiqueue.

Guests on a remote libvirt host have no run directory there, and guests on
different hosts share no file system, so their links are UDP:

* ``udp-tunnel``: two members, each bound to its host's address (127.0.0.1
  when both are on the same remote host) and sending to the other's.

A network of three or more guests that is not on labctl's own machine would
need a switch on a remote host; that is refused with a clear error. The plan
is data: the backend turns it into argv, ``labctl up --show-command`` and
``labctl status --json`` show it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from labctl.errors import UsageError
from labctl.net.ports import free_port

if TYPE_CHECKING:
    from labctl.lab import HostPlace, Lab

DIRECT = "unix-dgram"
SWITCH = "switch"
ALONE = "alone"
UDP = "udp-tunnel"
TAP = "tap"


@dataclass(frozen=True)
class UdpAddr:
    """A UDP endpoint of a tunnel: an address on one host and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TapDev:
    """A tap device with ``queues`` queues on ``bridge``, in the lab's network namespace;
    ``fds`` are its queues' file descriptors once labctl opened them (QEMU inherits them)."""

    name: str
    bridge: str
    queues: int
    fds: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"tap {self.name} on bridge {self.bridge}" + (f" ({self.queues} queues)" if self.queues > 1 else "")


@dataclass(frozen=True)
class Port:
    """One lab NIC's attachment: its own socket (or tap) and where it sends."""

    guest: str
    nic: str
    network: str
    local: Path | UdpAddr | TapDev
    remote: Path | UdpAddr | None


class PortRecord(TypedDict):
    """A network member's endpoints in :class:`SegmentRecord`."""

    guest: str
    nic: str
    host: str | None
    local: str
    remote: str | None


class SegmentRecord(TypedDict):
    """:meth:`Segment.to_dict`: a network's plan as ``state.json`` (``networks``) and the bundle keep it."""

    network: str
    mechanism: str
    switch: str | None
    ports: list[PortRecord]


@dataclass(frozen=True)
class Segment:
    """One lab network: its mechanism and, for a switch, the switch socket."""

    network: str
    mechanism: str
    ports: tuple[Port, ...]
    switch_socket: Path | None

    def to_dict(self, hosts: dict[str, HostPlace] | None = None) -> SegmentRecord:
        """JSON view: the mechanism and each member's endpoints (and host)."""
        return {"network": self.network, "mechanism": self.mechanism,
                "switch": str(self.switch_socket) if self.switch_socket else None,
                "ports": [{"guest": p.guest, "nic": p.nic,
                           "host": hosts[p.guest].name if hosts and p.guest in hosts else None,
                           "local": str(p.local), "remote": None if p.remote is None else str(p.remote)}
                          for p in self.ports]}


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 right now (QEMU binds it moments later).

    On a remote host it is only a guess; a clash makes that guest fail to start.
    """
    return free_port(socket.SOCK_DGRAM)


def plan_networks(lab: Lab, net_dir: Path, hosts: dict[str, HostPlace] | None = None,
                  udp_port: Callable[[], int] = free_udp_port, taps: bool = False) -> dict[str, Segment]:
    """Assign every NIC an endpoint and pick each network's mechanism.

    ``hosts`` maps guests to their hosts (None: every guest on this machine);
    ``taps``: networks with a multiqueue NIC may be tap networks (root, qemu backend).

    :raise UsageError: for a network labctl cannot wire across its hosts.
    """
    segments: dict[str, Segment] = {}
    for idx, (name, net) in enumerate(lab.networks.items()):
        members = list(net.members)
        places = {hosts[g].uri: hosts[g] for g, _ in members} if hosts else {}
        if len(places) > 1 or any(p.remote for p in places.values()):
            segments[name] = _udp_segment(name, members, hosts or {}, udp_port)
            continue
        if taps and needs_tap(lab, members):
            segments[name] = _tap_segment(lab, idx, name, members)
            continue
        segments[name] = _unix_segment(lab, idx, name, members, net_dir)
    return segments


def needs_tap(lab: Lab, members: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> bool:
    """True when a member NIC asks for several queues (only a tap gives them)."""
    return any(lab.guests[g].nic(n).queues > 1 for g, n in members)


def _tap_segment(lab: Lab, idx: int, name: str, members: list[tuple[str, str]]) -> Segment:
    """A network of taps on one bridge (names fit IFNAMSIZ: ``lt<net>m<member>``, ``lb<net>``)."""
    bridge = f"lb{idx}"
    ports = tuple(Port(g, n, name, TapDev(f"lt{idx}m{j}", bridge, lab.guests[g].nic(n).queues), None)
                  for j, (g, n) in enumerate(members))
    return Segment(name, TAP, ports, None)


def _unix_segment(lab: Lab, idx: int, name: str, members: list[tuple[str, str]], net_dir: Path) -> Segment:
    """A network whose members all run on labctl's machine: unix sockets (and a switch)."""
    local = {m: net_dir / f"n{idx}-{m[0]}-{_nic_index(lab, *m)}.sock" for m in members}
    if len(members) == 2:
        a, b = members
        ports = (_port(a, name, local[a], local[b]), _port(b, name, local[b], local[a]))
        return Segment(name, DIRECT, ports, None)
    if len(members) >= 3:
        hub = net_dir / f"n{idx}-switch.sock"
        return Segment(name, SWITCH, tuple(_port(m, name, local[m], hub) for m in members), hub)
    # one member (or none): QEMU needs a peer address; nobody binds it
    return Segment(name, ALONE, tuple(_port(m, name, local[m], net_dir / f"n{idx}-nobody.sock")
                                      for m in members), None)


def _udp_segment(name: str, members: list[tuple[str, str]], hosts: dict[str, HostPlace],
                 udp_port: Callable[[], int]) -> Segment:
    """A network on remote hosts or across hosts: a point-to-point UDP tunnel.

    :raise UsageError: for three or more members, or a tunnel between a
        loopback address and a routable one.
    """
    on = sorted({hosts[g].name for g, _ in members})
    if len(members) >= 3:
        where = f"spans hosts {', '.join(on)}" if len(on) > 1 else f"is on remote host {on[0]}"
        raise UsageError(f"network {name} has {len(members)} guests and {where}: labctl links guests "
                         "on remote hosts or across hosts only in pairs (UDP tunnels), and runs its "
                         "switch only on this machine",
                         hint="split the network into two-guest links, or place its guests on this machine")
    if len(members) == 1:
        (m,) = members
        addr = _tunnel_address(hosts[m[0]], hosts[m[0]])
        return Segment(name, ALONE, (_port(m, name, UdpAddr(addr, udp_port()), UdpAddr(addr, udp_port())),), None)
    a, b = members
    ha, hb = hosts[a[0]], hosts[b[0]]
    _check_reachable(name, ha, hb)
    ea = UdpAddr(_tunnel_address(ha, hb), udp_port())
    eb = UdpAddr(_tunnel_address(hb, ha), udp_port())
    return Segment(name, UDP, (_port(a, name, ea, eb), _port(b, name, eb, ea)), None)


def _tunnel_address(own: HostPlace, peer: HostPlace) -> str:
    """The address ``own`` binds for a tunnel to ``peer`` (loopback when they are the same host)."""
    return "127.0.0.1" if own.uri == peer.uri else own.address


def _check_reachable(network: str, a: HostPlace, b: HostPlace) -> None:
    """Refuse a tunnel where one end would send to the other's loopback on another machine.

    :raise UsageError: when exactly one of the two addresses is a loopback address.
    """
    if a.uri == b.uri:
        return
    loops = {h.name: _is_loopback(h.address) for h in (a, b)}
    if len(set(loops.values())) == 2:
        lo = next(n for n, v in loops.items() if v)
        raise UsageError(f"network {network} joins host {a.name} ({a.address}) and host {b.name} "
                         f"({b.address}): {lo}'s address is a loopback address the other host cannot reach",
                         hint=f"set hosts.{lo}.address to an address of {lo} that the other host can reach")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def port_of(segments: dict[str, Segment], guest: str, nic: str) -> Port:
    for seg in segments.values():
        for p in seg.ports:
            if p.guest == guest and p.nic == nic:
                return p
    raise KeyError(f"{guest}.{nic}")


def _nic_index(lab: Lab, guest: str, nic: str) -> int:
    return next(n.index for n in lab.guests[guest].nics if n.name == nic)


def _port(member: tuple[str, str], network: str, local: Path | UdpAddr, remote: Path | UdpAddr | None) -> Port:
    return Port(member[0], member[1], network, local, remote)
