"""Lab addresses: interface IPs, v4 and v6 (usable, unique, one subnet per L2 domain and family, no overlaps in a
guest) and MACs."""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
from collections.abc import Collection
from dataclasses import dataclass

from labctl.lab.checker import Checker, describe, join
from labctl.lab.ifaces import Address
from labctl.lab.model import MGMT_SUBNET
from labctl.lab.specs import AddrSpec, GuestSpec, NicSpec
from labctl.lab.yamlpos import YamlMap, YamlSeq

_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
_MGMT_WHY = "reserved for labctl's management network"
_LINK_LOCAL_WHY = "link-local addresses are the kernel's own (every lab interface has one)"


def parse_ip(text: str) -> Address:
    """Parse a lab interface address ``a.b.c.d/len`` or ``x:y::z/len``.

    Raises ValueError with a user-facing message if it is malformed, lacks
    the prefix length, is not a usable host address (network, broadcast,
    loopback, multicast, link-local...) or lies in labctl's management subnet.
    """
    address, slash, _prefix = text.partition("/")
    v6 = ":" in address
    family = "IPv6" if v6 else "IPv4"
    try:
        ipaddress.IPv6Address(address) if v6 else ipaddress.IPv4Address(address)
    except ValueError:
        raise ValueError(f"invalid {family} address '{text}'") from None
    if not slash:
        raise ValueError(f"missing prefix length in '{text}' (e.g. {text}/{64 if v6 else 24})")
    try:
        iface: Address = ipaddress.IPv6Interface(text) if v6 else ipaddress.IPv4Interface(text)
    except ValueError:
        raise ValueError(f"invalid prefix length in '{text}' (expected 0..{128 if v6 else 32})") from None
    problem = _unusable6(iface) if isinstance(iface, ipaddress.IPv6Interface) else _unusable(iface)
    if problem:
        raise ValueError(problem)
    return iface


def _unusable(iface: ipaddress.IPv4Interface) -> str | None:
    """Why ``iface`` cannot be a lab host address, or None if it can."""
    ip, net = iface.ip, iface.network
    if ip.is_loopback or ip.is_multicast:
        kind = "loopback" if ip.is_loopback else "multicast"
        return f"{ip} is a {kind} address"
    if ip in _THIS_NETWORK or ip.is_reserved:
        return f"{ip} is not a usable host address"
    if net.prefixlen <= 30 and ip == net.network_address:
        return f"{iface} is the network address of {net}"
    if net.prefixlen <= 30 and ip == net.broadcast_address:
        return f"{iface} is the broadcast address of {net}"
    if ip in MGMT_SUBNET:
        return f"{ip} is in {MGMT_SUBNET}, {_MGMT_WHY}"
    if net.overlaps(MGMT_SUBNET):
        return f"{iface} overlaps {MGMT_SUBNET}, {_MGMT_WHY}"
    return None


def _unusable6(iface: ipaddress.IPv6Interface) -> str | None:
    """Why ``iface`` cannot be a lab host address, or None if it can (the management NIC has no IPv6)."""
    ip, net = iface.ip, iface.network
    if ip.is_loopback or ip.is_unspecified:
        return f"{ip} is the {'loopback' if ip.is_loopback else 'unspecified'} address"
    if ip.is_multicast:
        return f"{ip} is a multicast address"
    if ip.is_link_local:
        return f"{ip} is a link-local address: {_LINK_LOCAL_WHY}"
    if ip.ipv4_mapped is not None or ip.is_reserved:
        return f"{ip} is not a usable host address"
    if net.prefixlen <= 126 and ip == net.network_address:
        return f"{iface} is the subnet-router anycast address of {net}"
    return None


def parse_addresses(check: Checker, m: YamlMap, path: str, key: str = "ip") -> list[AddrSpec]:
    """``m[key]``: one address or a list of them (IPv4 and IPv6 alike), each usable and listed once."""
    value, where = m.get(key), join(path, key)
    if value is None:
        return []
    if isinstance(value, YamlSeq):
        items = [(v, value.item_line(i), f"{where}[{i}]") for i, v in enumerate(value)]
        if not items:
            check.add(m.value_line(key), where, "expected an address or a list of addresses, got an empty list")
    else:
        items = [(value, m.value_line(key), where)]
    out: list[AddrSpec] = []
    for raw, line, at in items:
        if not isinstance(raw, str):
            check.add(line, at, f"expected a string, got {describe(raw)}")
            continue
        try:
            address = parse_ip(raw)
        except ValueError as exc:
            check.add(line, at, str(exc))
            continue
        twice = next((a for a in out if a.address.ip == address.ip), None)
        if twice is not None:
            check.add(line, at, f"{address.ip} is listed twice (line {twice.line})")
            continue
        out.append(AddrSpec(address, line, at))
    return out


@dataclass
class _Holder:
    """An interface that holds addresses (a NIC, VLAN, bond or bridge), with its L2 domain."""

    guest: str
    label: str  # guest.iface
    domain: tuple[str, int] | None  # (root network, VLAN id or 0); None: unknown (reported elsewhere)
    addresses: list[AddrSpec]


class _Domains:
    """Which lab networks are one L2 domain: a bridge or bond joins its members' networks."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, net: str) -> str:
        while self.parent.get(net, net) != net:
            net = self.parent[net]
        return net

    def join(self, nets: list[str]) -> None:
        roots = sorted({self.find(n) for n in nets})
        for r in roots[1:]:
            self.parent[r] = roots[0]

    def members(self, root: str, networks: list[str]) -> list[str]:
        return sorted({n for n in networks if self.find(n) == root})


def _holders(guests: list[GuestSpec], domains: _Domains) -> list[_Holder]:
    out: list[_Holder] = []
    for g in guests:
        nic_net = {n.name: n.network for n in g.nics if n.name}
        for m in g.masters:
            nets = [nic_net[x] for x in m.members if nic_net.get(x)]
            domains.join([n for n in nets if n])
    for g in guests:
        nic_net = {n.name: n.network for n in g.nics if n.name}
        for nic in g.nics:
            root = (domains.find(nic.network), 0) if nic.network else None
            out.append(_Holder(g.name, nic.label, root, nic.addresses))
            out += [_Holder(g.name, f"{g.name}.{v.name}", (root[0], v.id) if root else None, v.addresses)
                    for v in nic.vlans if v.name]
        for m in g.masters:
            nets = [nic_net[x] for x in m.members if nic_net.get(x)]
            root = (domains.find(nets[0]), 0) if nets and nets[0] else None
            out.append(_Holder(g.name, f"{g.name}.{m.name}", root, m.addresses))
            out += [_Holder(g.name, f"{g.name}.{v.name}", (root[0], v.id) if root else None, v.addresses)
                    for v in m.vlans if v.name]
    return out


def check_ips(check: Checker, guests: list[GuestSpec], networks: list[str]) -> None:
    """Lab-wide address rules: unique addresses, one subnet per L2 domain and family (a network, or
    networks a guest's bridge or bond joins, or a VLAN on them), no overlaps in a guest.

    An address already reported as a duplicate, or of an interface whose network is unknown, is
    not checked further, to avoid follow-on noise.
    """
    domains = _Domains()
    holders = _holders(guests, domains)
    owner: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, tuple[_Holder, AddrSpec]] = {}
    subnet_of: dict[tuple[tuple[str, int], int], tuple[_Holder, AddrSpec]] = {}
    checked: list[tuple[_Holder, AddrSpec]] = []
    for h in holders:
        for a in h.addresses:
            first = owner.setdefault(a.address.ip, (h, a))
            if first != (h, a):
                check.add(a.line, a.path, f"{a.address.ip} is already used by {first[0].label} (line {first[1].line})")
            elif h.domain is not None:
                _check_subnet(check, h, a, subnet_of.setdefault((h.domain, a.address.version), (h, a)), domains,
                              networks)
                checked.append((h, a))
    for _guest, group in itertools.groupby(checked, key=lambda item: item[0].guest):
        _check_overlaps(check, list(group), domains, networks)


def _domain_text(domain: tuple[str, int], domains: _Domains, networks: list[str]) -> str:
    """``lan``, ``lan+wan`` (joined by a bridge or bond), ``VLAN 10 on lan``."""
    root, vid = domain
    name = "+".join(domains.members(root, networks)) or root
    return f"VLAN {vid} on {name}" if vid else name


def _check_subnet(check: Checker, h: _Holder, a: AddrSpec, first: tuple[_Holder, AddrSpec], domains: _Domains,
                  networks: list[str]) -> None:
    """Report ``a`` if its subnet differs from the one ``first`` set for the domain and family."""
    assert h.domain is not None
    subnet = first[1].address.network
    if first == (h, a) or a.address.network == subnet:
        return
    why = "has a different prefix length than" if a.address.ip in subnet else "is not in"
    where = _domain_text(h.domain, domains, networks)
    whose = f"the subnet {subnet} of {where}" if h.domain[1] else f"{where}'s subnet {subnet}"
    message = f"{a.address} {why} {whose} (set by {first[0].label}, line {first[1].line})"
    check.add(a.line, a.path, message)


def _check_overlaps(check: Checker, items: list[tuple[_Holder, AddrSpec]], domains: _Domains,
                    networks: list[str]) -> None:
    """Report addresses of one guest whose subnets overlap an earlier one's in another L2 domain."""
    for later_index, (h, a) in enumerate(items):
        for earlier, ea in items[:later_index]:
            assert h.domain is not None and earlier.domain is not None
            if h.domain != earlier.domain and a.address.version == ea.address.version \
                    and a.address.network.overlaps(ea.address.network):
                where = _domain_text(earlier.domain, domains, networks)
                message = (f"{a.address} overlaps {earlier.label}'s subnet {ea.address.network} "
                           f"on {'network ' if not earlier.domain[1] else ''}{where} (line {ea.line})")
                check.add(a.line, a.path, message)
                break


def assign_macs(check: Checker, lab: str, nics: list[NicSpec]) -> None:
    """Reject duplicate explicit MACs, then give every other NIC its default MAC."""
    owner: dict[str, NicSpec] = {}
    for nic in nics:
        if nic.mac is None:
            continue
        first = owner.setdefault(nic.mac, nic)
        if first is not nic:
            message = f"{nic.mac} is already used by {first.label} (line {first.mac_line})"
            check.add(nic.mac_line, f"{nic.path}.mac", message)
    for nic in nics:
        if nic.mac is None:
            nic.mac = default_mac(lab, nic.guest, nic.name or f"nics[{nic.index}]", owner)
            owner[nic.mac] = nic


def mgmt_mac(lab: str, guest: str) -> str:
    """Deterministic MAC of a guest's management NIC: ``52:55:00:`` + 3 bytes of the SHA-256 of
    ``"{lab}/{guest}/mgmt0"``, a prefix no lab NIC's default (:func:`default_mac`) shares."""
    d = hashlib.sha256(f"{lab}/{guest}/mgmt0".encode()).digest()
    return "52:55:00:" + ":".join(f"{b:02x}" for b in d[:3])


def default_mac(lab: str, guest: str, nic: str, taken: Collection[str] = ()) -> str:
    """Deterministic MAC for a NIC: ``52:54:00:`` + 3 bytes of a SHA-256.

    The hash is of ``"{lab}/{guest}/{nic}"``; while the result is in
    ``taken``, ``"#1"``, ``"#2"``... are appended to that string.
    """
    seed = f"{lab}/{guest}/{nic}"
    for attempt in itertools.count():
        key = seed if attempt == 0 else f"{seed}#{attempt}"
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        mac = "52:54:00:" + ":".join(f"{byte:02x}" for byte in digest[:3])
        if mac not in taken:
            return mac
    raise AssertionError("unreachable")  # pragma: no cover


