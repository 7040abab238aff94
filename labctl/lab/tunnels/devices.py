"""Tunnels and VRFs as the resolved model holds them, and what every tunnel kind is (:class:`Kind`).

A :class:`Tunnel` keeps its kind's options as text (``vni``, ``remote``, ``dstport``...), checked by
its kind when the lab file was read; a :class:`Vrf` its table, the interfaces it enslaves and its
routes. Both render the ``ip`` commands that make them in a guest (:meth:`Tunnel.commands`,
:meth:`Vrf.commands`): argv lists of validated tokens, never a shell string.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from labctl.lab.ifaces import Address, Route, RouteRecord
from labctl.lab.tunnels.framing import Framing

if TYPE_CHECKING:
    from labctl.lab.checker import Checker
    from labctl.lab.yamlpos import YamlMap

__all__ = ["COMMON_KEYS", "Kind", "Tunnel", "TunnelRecord", "Vrf", "VrfRecord"]

COMMON_KEYS = ("type", "ip", "mtu")
"""The keys every tunnel takes; a kind adds its own (:attr:`Kind.keys`)."""


class TunnelRecord(TypedDict):
    """:meth:`Tunnel.to_dict`: a tunnel in a lab's recorded state (``type``: its kind)."""

    name: str
    type: str
    addresses: list[str]
    mtu: int | None
    options: dict[str, str]


class VrfRecord(TypedDict):
    """:meth:`Vrf.to_dict`."""

    name: str
    table: int
    members: list[str]
    routes: list[RouteRecord]


@dataclass(frozen=True)
class Tunnel:
    """A tunnel device of a guest: ``name``, of ``kind`` (a key of the kinds' table), its addresses,
    its MTU (None: the kernel's) and its kind's options as text."""

    name: str
    kind: str
    addresses: tuple[Address, ...] = ()
    options: tuple[tuple[str, str], ...] = ()
    mtu: int | None = None
    line: int = 0
    path: str = ""

    def opt(self, key: str) -> str | None:
        """The option ``key`` as text, or None when not given."""
        return dict(self.options).get(key)

    def to_dict(self) -> TunnelRecord:
        return {"name": self.name, "type": self.kind, "addresses": [str(a) for a in self.addresses],
                "mtu": self.mtu, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, d: TunnelRecord) -> Tunnel:
        """From :meth:`to_dict`'s form (a lab's recorded state)."""
        given = d.get("options")
        options: Mapping[str, str] = given if isinstance(given, Mapping) else {}
        return cls(str(d.get("name")), str(d.get("type")),
                   tuple(ipaddress.ip_interface(str(a)) for a in d.get("addresses") or ()),
                   tuple((str(k), str(v)) for k, v in options.items()),
                   int(mtu) if (mtu := d.get("mtu")) is not None else None)


@dataclass(frozen=True)
class Vrf:
    """A VRF device ``name`` whose routing table is ``table``, enslaving ``members`` (interfaces of
    the guest), with its own ``routes`` (added to its table)."""

    name: str
    table: int
    members: tuple[str, ...] = ()
    routes: tuple[Route, ...] = ()
    line: int = 0
    path: str = ""

    def commands(self) -> list[list[str]]:
        """The ``ip`` argvs that make it (its members are enslaved by :meth:`enslave`)."""
        return [["ip", "link", "add", self.name, "type", "vrf", "table", str(self.table)],
                ["ip", "link", "set", self.name, "up"]]

    def enslave(self, member: str) -> list[str]:
        return ["ip", "link", "set", member, "master", self.name]

    def route(self, r: Route) -> list[str]:
        """``ip route add ... table T``: one of its routes."""
        return ["ip", f"-{r.version}", "route", "add", *r.text().split(), "table", str(self.table)]

    def text(self) -> str:
        """``table 10 of eth2, vx0; 2 routes``."""
        n = len(self.routes)
        return (f"table {self.table} of {', '.join(self.members) or 'no interface'}"
                + (f"; {n} route{'s' if n != 1 else ''}" if n else ""))

    def to_dict(self) -> VrfRecord:
        return {"name": self.name, "table": self.table, "members": list(self.members),
                "routes": [r.to_dict() for r in self.routes]}

    @classmethod
    def from_dict(cls, d: VrfRecord) -> Vrf:
        """From :meth:`to_dict`'s form (a lab's recorded state)."""
        routes = []
        for r in d.get("routes") or ():
            to = str(r.get("to"))
            if to == "default":
                to = "::/0" if r.get("family") == "ipv6" else "0.0.0.0/0"
            via = r.get("via")
            routes.append(Route(ipaddress.ip_network(to), ipaddress.ip_address(via) if via else None,
                                r.get("dev"), r.get("metric")))
        return cls(str(d.get("name")), int(d.get("table") or 0), tuple(str(m) for m in d.get("members") or ()),
                   tuple(routes))


class Kind:
    """What one tunnel kind is: its lab-file keys (beyond :data:`COMMON_KEYS`), which are required,
    how its options are checked, how it is made in a guest and described to people, and how its
    packets are carried (:attr:`framings`, for ``labctl follow``; none: followed on its device only).

    A kind is one module of :mod:`labctl.lab.tunnels` that defines one instance (or two, for a pair
    of kinds such as gre and gretap), listed in :data:`labctl.lab.tunnels.known.KINDS`.
    """

    name: str = ""
    keys: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    layer2: bool = False  # carries Ethernet frames (its device has a MAC)
    remote_keys: tuple[str, ...] = ("remote",)  # options that must be an address of another guest of the lab
    framings: tuple[Framing, ...] = ()  # every header layout its packets can have on the wire

    def options(self, check: Checker, m: YamlMap, path: str) -> dict[str, str]:
        """The kind's options of the tunnel ``m`` as text (each problem reported; a bad one left out)."""
        raise NotImplementedError

    def link(self, t: Tunnel) -> list[str]:
        """The ``ip link add`` argv that makes ``t``."""
        raise NotImplementedError

    def describe(self, t: Tunnel) -> str:
        """What ``t`` is, in a few words (``vxlan 42 to 10.2.0.2:4789 via eth1``)."""
        raise NotImplementedError

    def framing(self, t: Tunnel) -> Framing | None:
        """How ``t``'s packets are carried (its options may choose the layout), or None."""
        return self.framings[0] if self.framings else None

    def framings_of(self, t: Tunnel) -> tuple[Framing, ...]:
        """Every layout ``t``'s packets can have on the wire (a tunnel that carries IPv4 and IPv6 in
        two layouts has both: ``ip6tnl`` of mode ``any``); none: followed on its device only."""
        f = self.framing(t)
        return () if f is None else (f,)

    def commands(self, t: Tunnel) -> list[list[str]]:
        """Every ``ip`` argv that makes ``t``: the link, its MTU, its addresses, up."""
        out = [self.link(t)]
        if t.mtu:
            out.append(["ip", "link", "set", t.name, "mtu", str(t.mtu)])
        out += [["ip", "addr", "add", str(a), "dev", t.name] for a in t.addresses]
        out.append(["ip", "link", "set", t.name, "up"])
        return out
