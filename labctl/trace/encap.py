"""Following a packet through encapsulation: the inner packet is the one followed, the outer one is
the wire that carries it, and encapsulation and decapsulation are hops of its path. Pure: what the
events mean (the probes are :mod:`labctl.follow.tunnelprobes`'s).

VXLAN over IPv4 (an IPv4 packet inside): the outer packet's events are the points it passes
(``xmit_vx`` is ``xmit``, ``netif_rx_vx`` is ``netif_rx``...: :data:`VARIANTS`), each fetching the
*inner* packet's header, so that they join its journey, and the outer header's addresses, UDP port
and VNI (``osa``, ``oda``, ``odp``, ``ovni``), which their hop's note says (:func:`note`):
``outer 10.1.0.2 > 10.2.0.2 udp/4789 vni 42``. ``encap`` (``udp_tunnel_xmit_skb``, the VXLAN header
pushed) and ``decap`` (``vxlan_rcv``) are hops of their own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

__all__ = ["OUTER", "POINTS", "VARIANTS", "note", "noted"]

POINTS = (  # (name, where, role, title), as labctl.trace.hops.Point takes them
    ("encap", "udp_tunnel_xmit_skb", "stack", "encapsulated (VXLAN)"),
    ("decap", "vxlan_rcv", "stack", "decapsulated (VXLAN)"),
)
VARIANTS = {"dev_queue_vx": "dev_queue", "xmit_vx": "xmit", "netif_rx_vx": "netif_rx", "ip_fwd_vx": "ip_fwd",
            "ip_local_vx": "ip_local", "encap_vx": "encap", "decap_vx": "decap"}
OUTER = {"dev_queue_vx": "vxlan", "xmit_vx": "vxlan", "netif_rx_vx": "vxlan", "ip_fwd_vx": "vxlan",
         "ip_local_vx": "vxlan"}
"""The events of an outer packet, and its encapsulation."""


def _num(fields: Mapping[str, str], name: str) -> int | None:
    try:
        return int(fields[name], 0)
    except (KeyError, ValueError):
        return None


def _ip(value: int | None) -> str:
    """An IPv4 address read little-endian from network order."""
    return "?" if value is None else str(ipaddress.IPv4Address((value & 0xFFFFFFFF).to_bytes(4, "little")))


def _port(value: int | None) -> str:
    return "?" if value is None else str(int.from_bytes((value & 0xFFFF).to_bytes(2, "little"), "big"))


def vni(value: int | None) -> int | None:
    """A VXLAN header's second word (VNI and a reserved byte), read little-endian, as the VNI."""
    return None if value is None else int.from_bytes((value & 0xFFFFFFFF).to_bytes(4, "little"), "big") >> 8


def noted(text: str, point: str, fields: Mapping[str, str]) -> str:
    """``text`` (a hop's note) with :func:`note`'s after it."""
    return "; ".join(x for x in (text, note(point, fields)) if x)


def note(point: str, fields: Mapping[str, str]) -> str:
    """What a hop of ``point`` says of its encapsulation: the outer header of an outer packet's event
    (``outer 10.1.0.2 > 10.2.0.2 udp/4789 vni 42``), the VNI at ``encap`` and ``decap``; '' else."""
    v = vni(_num(fields, "ovni"))
    if fields.get("outer"):
        return (f"outer {fields['outer'].upper()} {_ip(_num(fields, 'osa'))} > {_ip(_num(fields, 'oda'))} "
                f"udp/{_port(_num(fields, 'odp'))}" + (f" vni {v}" if v is not None else ""))
    if point in ("encap", "decap") and v is not None:
        return f"VXLAN vni {v}"
    return ""
