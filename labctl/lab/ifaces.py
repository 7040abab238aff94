"""A guest's network settings as the resolved model holds them: addresses (IPv4 and IPv6, several a
NIC), 802.1Q VLANs, bonds and bridges of lab NICs, routes and sysctls; and the views of them the
other stages share (every interface of a guest as a row, the ``{{GUEST.IFACE.ip}}`` addresses).

The views read ``Lab.to_dict()``'s form (a lab's state, a bundle's manifest) and tolerate what an
older labctl wrote (a NIC's single ``ip``, no ``addresses``, no bonds).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:
    from labctl.lab.firewall import FirewallRecord
    from labctl.lab.xdp import TcRecord, XdpRecord

__all__ = [
    "BOND_MODES",
    "DEFAULT_MIIMON",
    "PRIMARY_MODES",
    "Address",
    "Bond",
    "BondRecord",
    "Bridge",
    "BridgeRecord",
    "GuestSysctlRecord",
    "IfaceSettings",
    "IfaceView",
    "NetSettings",
    "Route",
    "RouteRecord",
    "Sysctl",
    "Vlan",
    "VlanRecord",
    "address_keys",
    "firewall_lines",
    "first_ip",
    "net_settings",
    "net_settings_text",
    "nic_addresses",
    "nic_interfaces",
    "sysctl_path",
]

Address = ipaddress.IPv4Interface | ipaddress.IPv6Interface
"""An address of a lab interface, with its prefix length."""

BOND_MODES = ("balance-rr", "active-backup", "balance-xor", "broadcast", "802.3ad", "balance-tlb", "balance-alb")
PRIMARY_MODES = ("active-backup", "balance-tlb", "balance-alb")
"""Bond modes in which a ``primary`` member means something."""

DEFAULT_MIIMON = 100
"""Milliseconds between a bond's link checks (the kernel's default, 0, never notices a member's carrier loss)."""


def first_ip(addresses: Sequence[Address], version: int | None = None) -> Address | None:
    """The first address of ``version`` (4 or 6); with None, the first IPv4 one, else the first."""
    if version is None:
        return first_ip(addresses, 4) or (addresses[0] if addresses else None)
    return next((a for a in addresses if a.version == version), None)


def _texts(addresses: Iterable[Address]) -> list[str]:
    return [str(a) for a in addresses]


class VlanRecord(TypedDict):
    """:meth:`Vlan.to_dict`: a VLAN in a lab's recorded state."""

    id: int
    name: str
    addresses: list[str]


class BondRecord(TypedDict):
    """:meth:`Bond.to_dict`."""

    name: str
    mode: str
    members: list[str]
    addresses: list[str]
    vlans: list[VlanRecord]
    miimon: int
    primary: str | None


class BridgeRecord(TypedDict):
    """:meth:`Bridge.to_dict`."""

    name: str
    members: list[str]
    addresses: list[str]
    vlans: list[VlanRecord]


class RouteRecord(TypedDict):
    """:meth:`Route.to_dict`: ``to`` is ``default`` or the prefix; ``family`` ``ipv4`` or ``ipv6``."""

    to: str
    via: str | None
    dev: str | None
    metric: int | None
    family: str


class GuestSysctlRecord(TypedDict):
    """A sysctl in ``Guest.to_dict()``'s ``sysctls``."""

    name: str
    value: str


@dataclass(frozen=True)
class Vlan:
    """An 802.1Q sub-interface (``name``, default ``PARENT.ID``) of a NIC, bond or bridge."""

    id: int
    name: str
    addresses: tuple[Address, ...] = ()
    line: int = 0

    def to_dict(self) -> VlanRecord:
        return {"id": self.id, "name": self.name, "addresses": _texts(self.addresses)}


@dataclass(frozen=True)
class Bond:
    """A bond of lab NICs (``members``, in order) in ``mode``; ``miimon`` ms between link checks."""

    name: str
    mode: str
    members: tuple[str, ...]
    addresses: tuple[Address, ...] = ()
    vlans: tuple[Vlan, ...] = ()
    miimon: int = DEFAULT_MIIMON
    primary: str | None = None
    line: int = 0

    def to_dict(self) -> BondRecord:
        return {"name": self.name, "mode": self.mode, "members": list(self.members),
                "addresses": _texts(self.addresses), "vlans": [v.to_dict() for v in self.vlans],
                "miimon": self.miimon, "primary": self.primary}


@dataclass(frozen=True)
class Bridge:
    """A Linux bridge of lab NICs (``members``), without STP: its ports forward from the start."""

    name: str
    members: tuple[str, ...]
    addresses: tuple[Address, ...] = ()
    vlans: tuple[Vlan, ...] = ()
    line: int = 0

    def to_dict(self) -> BridgeRecord:
        return {"name": self.name, "members": list(self.members), "addresses": _texts(self.addresses),
                "vlans": [v.to_dict() for v in self.vlans]}


@dataclass(frozen=True)
class Route:
    """A static route: to ``to`` (``0.0.0.0/0`` or ``::/0`` for a default route) via ``via``, out of
    ``dev``, or both; ``metric`` None leaves the kernel's."""

    to: ipaddress.IPv4Network | ipaddress.IPv6Network
    via: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    dev: str | None = None
    metric: int | None = None
    line: int = 0

    @property
    def version(self) -> int:
        return self.to.version

    @property
    def destination(self) -> str:
        """``default`` or the prefix, as ``ip route`` shows it."""
        return "default" if self.to.prefixlen == 0 else str(self.to)

    def text(self) -> str:
        """``10.2.0.0/24 via 10.1.0.1 dev eth1 metric 10``, as ``ip route`` would take it."""
        parts = [self.destination]
        if self.via is not None:
            parts += ["via", str(self.via)]
        if self.dev is not None:
            parts += ["dev", self.dev]
        if self.metric is not None:
            parts += ["metric", str(self.metric)]
        return " ".join(parts)

    def to_dict(self) -> RouteRecord:
        return {"to": self.destination, "via": str(self.via) if self.via is not None else None, "dev": self.dev,
                "metric": self.metric, "family": f"ipv{self.version}"}


def sysctl_path(name: str) -> str:
    """The ``/proc/sys`` path of a sysctl name, as sysctl(8) reads it: dots separate its parts and
    a ``/`` inside a part is a dot of an interface name (``net.ipv4.conf.eth1/10.rp_filter`` is
    ``net/ipv4/conf/eth1.10/rp_filter``)."""
    return "/".join(part.replace("/", ".") for part in name.split("."))


@dataclass(frozen=True)
class Sysctl:
    """A sysctl set before ``up`` returns: ``name`` as sysctl(8) writes it, ``value`` as text."""

    name: str
    value: str
    line: int = 0

    @property
    def path(self) -> str:
        """Below ``/proc/sys``."""
        return sysctl_path(self.name)


# --------------------------------------------------------------------------- views of the dict form


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def nic_addresses(iface: Mapping[str, Any]) -> list[str]:
    """A NIC's (or VLAN's, bond's, bridge's) addresses from its dict: ``addresses``, else an older
    labctl's single ``ip``."""
    listed = [str(a) for a in _list(iface.get("addresses")) if isinstance(a, str)]
    if listed or "addresses" in iface:
        return listed
    ip = iface.get("ip")
    return [ip] if isinstance(ip, str) and ip else []


@dataclass(frozen=True)
class IfaceView:
    """One interface of a guest as people are shown it.

    ``kind``: ``nic``, ``vlan``, ``bond`` or ``bridge``; ``detail``: what it is beyond its kind
    (``vlan 10 of eth1``, ``active-backup of eth2, eth3``); ``network``: the lab network its frames
    reach (a VLAN's: its parent's, with the tag); ``master``: the bond or bridge a NIC is in.
    """

    name: str
    kind: str
    detail: str
    addresses: tuple[str, ...]
    network: str = ""
    master: str | None = None
    parent: str | None = None

    @property
    def address_text(self) -> str:
        """The addresses, or where they are (``in bond0``), or ''."""
        if self.master:
            return f"in {self.master}"
        return ", ".join(self.addresses)


def _vlan_views(parent: str, network: str, vlans: object) -> list[IfaceView]:
    out = []
    for v in _list(vlans):
        v = _map(v)
        vid = v.get("id")
        out.append(IfaceView(str(v.get("name") or f"{parent}.{vid}"), "vlan", f"vlan {vid} of {parent}",
                             tuple(nic_addresses(v)), f"{network} (tag {vid})" if network else f"tag {vid}",
                             parent=parent))
    return out


def nic_interfaces(guest: Mapping[str, Any]) -> list[IfaceView]:
    """A guest's NICs, bonds and bridges (``Guest.to_dict()``): each NIC followed by its VLANs, then
    each bond and each bridge followed by theirs (with its tunnels and VRFs:
    :func:`labctl.lab.guestnet.guest_interfaces`)."""
    masters: dict[str, str] = {}
    for kind in ("bonds", "bridges"):
        for m in _list(guest.get(kind)):
            for member in _list(_map(m).get("members")):
                masters[str(member)] = str(_map(m).get("name"))
    out: list[IfaceView] = []
    for n in _list(guest.get("nics")):
        n = _map(n)
        name, network = str(n.get("name", "")), str(n.get("network", ""))
        out.append(IfaceView(name, "nic", str(n.get("model", "")), tuple(nic_addresses(n)), network,
                             masters.get(name)))
        out += _vlan_views(name, network, n.get("vlans"))
    nets = {str(_map(n).get("name")): str(_map(n).get("network", "")) for n in _list(guest.get("nics"))}
    for kind in ("bonds", "bridges"):
        for m in _list(guest.get(kind)):
            m = _map(m)
            name, members = str(m.get("name")), [str(x) for x in _list(m.get("members"))]
            network = ", ".join(dict.fromkeys(nets.get(x, "?") for x in members))
            detail = (f"{m.get('mode')} bond of " if kind == "bonds" else "bridge of ") + ", ".join(members)
            out.append(IfaceView(name, "bond" if kind == "bonds" else "bridge", detail,
                                 tuple(nic_addresses(m)), network))
            out += _vlan_views(name, network, m.get("vlans"))
    return out


def address_keys(guest: str, views: Iterable[tuple[str, Sequence[Address]]]) -> dict[str, str]:
    """``{{GUEST.IFACE.ip}}`` and friends for one guest's interfaces ``(name, addresses)``: ``ip`` is
    the first IPv4 address (the first IPv6 one when there is none), ``ip4`` and ``ip6`` the first
    of each family; without its prefix length."""
    out = {}
    for name, addresses in views:
        for key, version in (("ip", None), ("ip4", 4), ("ip6", 6)):
            a = first_ip(addresses, version)
            if a is not None:
                out[f"{guest}.{name}.{key}"] = str(a.ip)
    return out


IfaceSettings = TypedDict("IfaceSettings", {
    "what": str,  # nic, or the kind and what it is (vlan 10 of eth1, bond active-backup bond of eth2, eth3)
    "addresses": list[str],
    "in": NotRequired[str],  # the bond or bridge it is a member of
    "xdp": NotRequired[str],  # a NIC's XDP program: what it is, and its object's digest
    "tc": NotRequired[str],  # its tc program
})
""":class:`NetSettings`' view of one interface."""


class NetSettings(TypedDict):
    """:func:`net_settings`: a guest's network settings, for comparing two runs (empty parts left out)."""

    interfaces: dict[str, IfaceSettings]
    routes: NotRequired[list[str]]
    sysctls: NotRequired[dict[str, str]]
    firewall: NotRequired[list[str]]  # each line of the nft script labctl writes


def _program_text(x: XdpRecord | TcRecord) -> str:
    return str(x.get("summary")) + (f" sha256 {str(x['sha256'])[:12]}" if x.get("sha256") else "")


def net_settings(guest: Mapping[str, Any], interfaces: Iterable[IfaceView]) -> NetSettings:
    """What a guest's network settings are, for comparing two runs: each of its ``interfaces``'
    addresses and what it is, its routes and its sysctls (``Guest.to_dict()`` form; empty parts left
    out; :func:`labctl.lab.guestnet.net_settings` gives it every interface)."""
    ifaces: dict[str, IfaceSettings] = {}
    for v in interfaces:
        ifaces[v.name] = {"what": v.kind if v.kind == "nic" else f"{v.kind} {v.detail}", "addresses": list(v.addresses)}
        if v.master:
            ifaces[v.name]["in"] = v.master
    for n in _list(guest.get("nics")):  # a NIC's XDP and tc programs: what each is, and its object's digest
        name = str(_map(n).get("name"))
        xdp: XdpRecord | None = _map(n).get("xdp")
        tc: TcRecord | None = _map(n).get("tc")
        if isinstance(xdp, Mapping) and xdp and name in ifaces:
            ifaces[name]["xdp"] = _program_text(xdp)
        if isinstance(tc, Mapping) and tc and name in ifaces:
            ifaces[name]["tc"] = _program_text(tc)
    routes = [_route_text(r) for r in _list(guest.get("routes"))]
    sysctls = {str(k): str(v) for k, v in (_sysctl_item(s) for s in _list(guest.get("sysctls"))) if k}
    firewall = firewall_lines(guest, detail=True)
    out: NetSettings = {"interfaces": ifaces}
    if routes:
        out["routes"] = routes
    if sysctls:
        out["sysctls"] = sysctls
    if firewall:
        out["firewall"] = firewall
    return out


def firewall_lines(guest: Mapping[str, Any], detail: bool = False) -> list[str]:
    """A guest's firewall (``Guest.to_dict()`` form) as short lines (:meth:`~labctl.lab.firewall.Firewall.summary`),
    or with ``detail`` each line of the nft script labctl writes (for comparing two runs); an nft
    file's line says its sha256 too, so two runs whose files differ compare different."""
    fw: FirewallRecord | None = guest.get("firewall")
    if not isinstance(fw, Mapping):
        return []
    from labctl.lab.firewall import Firewall  # here: firewall.py imports the model, which imports this module

    parsed = Firewall.from_dict(fw)
    out = parsed.summary()
    if detail:
        out = [ln.strip() for ln in parsed.script()[0].splitlines()] + [ln for ln in out if ln.startswith("nft file ")]
    f = fw.get("file")
    if isinstance(f, Mapping) and f.get("sha256"):
        out = [f"{line} sha256 {str(f['sha256'])[:12]}" if line.startswith("nft file ") else line for line in out]
    return out


def net_settings_text(guest: Mapping[str, Any], more: Sequence[str] = ()) -> list[str]:
    """A guest's routes, sysctls and firewall (``Guest.to_dict()`` form) as lines: ``routes: default via
    10.1.0.254; fd00:9::/48 via fd00:1::2``, ``sysctls: net.ipv4.ip_forward=1, ...`` and
    ``firewall: nat: masquerade out eth2`` (none: []); ``more`` (the tunnels' and VRFs' lines) go
    before the firewall's."""
    routes = [_route_text(r) for r in _list(guest.get("routes"))]
    sysctls = [f"{k}={v}" for k, v in (_sysctl_item(s) for s in _list(guest.get("sysctls"))) if k]
    return ((["routes: " + "; ".join(routes)] if routes else []) + (["sysctls: " + ", ".join(sysctls)] if sysctls else [])
            + list(more) + [f"firewall: {line}" for line in firewall_lines(guest)])


def _route_text(route: object) -> str:
    r = _map(route)
    parts = [str(r.get("to") or "?")]
    parts += [f"{k} {r[k]}" for k in ("via", "dev", "metric") if r.get(k) is not None]
    return " ".join(parts)


def _sysctl_item(item: object) -> tuple[str, str]:
    s = _map(item)
    return str(s.get("name") or ""), str(s.get("value") if s.get("value") is not None else "")
