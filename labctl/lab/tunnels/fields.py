"""Checks shared by the tunnel kinds' options: an address of one family, a port, an interface name,
a number in a range; each returns the option as text, or None (absent, or reported)."""

from __future__ import annotations

import ipaddress

from labctl.lab.checker import Checker, describe, join
from labctl.lab.yamlpos import YamlMap

__all__ = ["address", "integer", "interface", "port", "put"]


def put(out: dict[str, str], key: str, value: str | int | None) -> None:
    """``out[key] = str(value)`` unless ``value`` is None."""
    if value is not None:
        out[key] = str(value)


def address(check: Checker, m: YamlMap, key: str, path: str, version: int | None = None,
            multicast: bool = False) -> str | None:
    """``m[key]``: a unicast address (``multicast``: a multicast one) of IPv``version`` (None: either)."""
    text = check.string(m, key, path)
    if text is None:
        return None
    line, where = m.value_line(key), join(path, key)
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        check.add(line, where, f"invalid address '{text}' (an IPv4 or IPv6 address, no prefix length)")
        return None
    if version is not None and ip.version != version:
        check.add(line, where, f"{ip} is an IPv{ip.version} address: this tunnel needs IPv{version}")
        return None
    if multicast and not ip.is_multicast:
        check.add(line, where, f"{ip} is not a multicast address (a group is one: 239.1.1.1, ff05::1)")
        return None
    if not multicast and (ip.is_multicast or ip.is_unspecified or ip.is_loopback):
        check.add(line, where, f"{ip} cannot be a tunnel's end (a unicast address of a guest)")
        return None
    return str(ip)


def integer(check: Checker, m: YamlMap, key: str, path: str, low: int, high: int) -> int | None:
    """``m[key]``: an integer in ``low..high``."""
    return check.integer(m, key, path, (low, high))


def port(check: Checker, m: YamlMap, key: str, path: str) -> int | None:
    """``m[key]``: a UDP port, 1..65535."""
    return check.integer(m, key, path, (1, 65535))


def interface(check: Checker, m: YamlMap, key: str, path: str) -> str | None:
    """``m[key]``: a name an interface of the guest can have (which one is checked with the guest)."""
    from labctl.lab.netconf import iface_name  # netconf imports this package's parser

    value = m.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        check.add(m.value_line(key), join(path, key), f"expected an interface name, got {describe(value)}")
        return None
    return iface_name(check, value, m.value_line(key), join(path, key))
