"""Lab addresses: NIC IPs (usable, unique, one subnet per network, no overlaps in a guest) and MACs."""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
from collections.abc import Collection

from labctl.lab.checker import Checker
from labctl.lab.model import MGMT_SUBNET
from labctl.lab.specs import NicSpec

_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
_MGMT_WHY = "reserved for labctl's management network"


def parse_ip(text: str) -> ipaddress.IPv4Interface:
    """Parse a lab NIC address ``a.b.c.d/len``.

    Raises ValueError with a user-facing message if it is malformed, lacks
    the prefix length, is IPv6, is not a usable host address (network,
    broadcast, loopback, multicast...) or lies in labctl's management subnet.
    """
    address, slash, _prefix = text.partition("/")
    if ":" in text:
        raise ValueError(f"only IPv4 is supported, got '{text}'")
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise ValueError(f"invalid IPv4 address '{text}'") from None
    if not slash:
        raise ValueError(f"missing prefix length in '{text}' (e.g. {text}/24)")
    try:
        iface = ipaddress.IPv4Interface(text)
    except ValueError:
        raise ValueError(f"invalid prefix length in '{text}' (expected 0..32)") from None
    problem = _unusable(iface)
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


def check_ips(check: Checker, nics: list[NicSpec]) -> None:
    """Lab-wide address rules: unique IPs, one subnet per network, no overlaps in a guest.

    A NIC already reported for a duplicate IP or an unknown network is not
    checked further, to avoid follow-on noise.
    """
    owner: dict[ipaddress.IPv4Address, NicSpec] = {}
    subnet_of: dict[str, NicSpec] = {}
    checked: list[NicSpec] = []
    for nic in nics:
        if nic.ip is None:
            continue
        first = owner.setdefault(nic.ip.ip, nic)
        if first is not nic:
            message = f"{nic.ip.ip} is already used by {first.label} (line {first.ip_line})"
            check.add(nic.ip_line, f"{nic.path}.ip", message)
        elif nic.network is not None:
            _check_subnet(check, nic, subnet_of.setdefault(nic.network, nic))
            checked.append(nic)
    for _guest, group in itertools.groupby(checked, key=lambda nic: nic.guest):
        _check_overlaps(check, list(group))


def _check_subnet(check: Checker, nic: NicSpec, first: NicSpec) -> None:
    """Report ``nic`` if its subnet differs from the one ``first`` set for the network."""
    assert nic.ip is not None and first.ip is not None
    subnet = first.ip.network
    if nic is first or nic.ip.network == subnet:
        return
    why = "has a different prefix length than" if nic.ip.ip in subnet else "is not in"
    message = (
        f"{nic.ip} {why} {nic.network}'s subnet {subnet} "
        f"(set by {first.label}, line {first.ip_line})"
    )
    check.add(nic.ip_line, f"{nic.path}.ip", message)


def _check_overlaps(check: Checker, nics: list[NicSpec]) -> None:
    """Report NICs of one guest whose subnets overlap an earlier NIC's on another network."""
    for later_index, nic in enumerate(nics):
        for earlier in nics[:later_index]:
            assert nic.ip is not None and earlier.ip is not None
            if nic.network != earlier.network and nic.ip.network.overlaps(earlier.ip.network):
                message = (
                    f"{nic.ip} overlaps {earlier.label}'s subnet {earlier.ip.network} "
                    f"on network {earlier.network} (line {earlier.ip_line})"
                )
                check.add(nic.ip_line, f"{nic.path}.ip", message)
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


