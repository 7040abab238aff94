"""The probes that follow a packet through a VXLAN tunnel (what their events mean: :mod:`labctl.trace.encap`).

When the lab has a VXLAN tunnel, every followed guest gets a probe on each point the *outer* packet
passes (``net_dev_queue``, ``net_dev_start_xmit``, ``netif_receive_skb``, ``ip_forward``,
``ip_local_deliver``) that fetches the inner IPv4 header where it sits in the outer packet (after the
outer Ethernet, IPv4, UDP and VXLAN headers and the inner Ethernet one) with the follow filter on
those fields and the outer UDP destination port one of the lab's VXLAN ports: the router between two
ends follows the inner packet with no tunnel of its own. A guest with a VXLAN tunnel also gets the
encapsulation (``udp_tunnel_xmit_skb``: the VXLAN header pushed, the UDP one not yet) and the
decapsulation (``vxlan_rcv``: at the UDP header). Only inner IPv4 packets over outer IPv4 (an inner
IPv6 or ARP packet is followed on the tunnel's device, not on the wire under it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.follow.probes import ProbePoint, ip_fields
from labctl.pktfilter import Node, kernel_filter

__all__ = ["OUTER_POINTS", "TUNNEL_POINTS", "definitions", "vxlan_ports"]

ETH, IP4, UDP, VXLAN = 14, 20, 8, 8
_INNER = UDP + VXLAN + ETH  # from the outer IPv4 header's end to the inner IPv4 header

# (probe point, where the outer IPv4 header is from skb->data there)
OUTER_POINTS = (
    (ProbePoint("dev_queue_vx", "e", "net.net_dev_queue", "$skbaddr", ETH + IP4 + _INNER, dev=True), ETH),
    (ProbePoint("xmit_vx", "e", "net.net_dev_start_xmit", "$skbaddr", ETH + IP4 + _INNER, dev=True), ETH),
    (ProbePoint("netif_rx_vx", "e", "net.netif_receive_skb", "$skbaddr", IP4 + _INNER, dev=True), 0),
    (ProbePoint("ip_fwd_vx", "p", "ip_forward", "%di", IP4 + _INNER), 0),
    (ProbePoint("ip_local_vx", "p", "ip_local_deliver", "%di", IP4 + _INNER), 0),
)
# (probe point, where the VXLAN header's VNI word is from skb->data there)
TUNNEL_POINTS = (
    (ProbePoint("encap_vx", "p", "udp_tunnel_xmit_skb", "%dx", VXLAN + ETH, dev=True), 4),
    (ProbePoint("decap_vx", "p", "vxlan_rcv", "%si", UDP + VXLAN + ETH, dev=True), UDP + 4),
)


def vxlan_ports(resolved: Mapping[str, Any]) -> list[int]:
    """The UDP ports of the lab's VXLAN tunnels (a lab's resolved dict), sorted; none: no VXLAN."""
    out = set()
    for g in (resolved.get("guests") or {}).values():
        for t in g.get("tunnels") or ():
            if t.get("type") == "vxlan":
                out.add(int((t.get("options") or {}).get("dstport") or 4789))
    return sorted(out)


def _le16(port: int) -> int:
    """A port as the probe reads it (network order, read little-endian)."""
    return int.from_bytes(port.to_bytes(2, "big"), "little")


def _definition(group: str, p: ProbePoint, off: dict[str, int], extra: set[str], fetch: str) -> str:
    data = f"+{off['skb_data']}({p.skb})"
    dev = f" dev=+{off['dev_name']}(+{off['skb_dev']}({p.skb})):string" if p.dev else ""
    return f"{p.kind}:{group}/{p.name} {p.place} skb={p.skb}:x64{dev} {ip_fields(data, p.ip_at, extra)} {fetch}"


def _at(offset: int, data: str) -> str:
    return f"+{offset}({data})"


def definitions(group: str, node: Node, off: dict[str, int], resolved: Mapping[str, Any], guest: str
                ) -> tuple[list[str], dict[str, str]]:
    """The guest's encapsulation probes (``dynamic_events`` lines) and their filters: none when the
    lab has no VXLAN tunnel or the filter matches no IPv4 packet."""
    ports = vxlan_ports(resolved)
    filt, extra = kernel_filter(node, 4)
    if not ports or filt is None:
        return [], {}
    by_port = " || ".join(f"odp == {_le16(p)}" for p in ports)
    defs, filters = [], {}
    for p, outer in OUTER_POINTS:
        data = f"+{off['skb_data']}({p.skb})"
        fetch = (f"osa={_at(outer + 12, data)}:u32 oda={_at(outer + 16, data)}:u32 odp={_at(outer + IP4 + 2, data)}:u16 "
                 f"ovni={_at(outer + IP4 + UDP + 4, data)}:u32")
        defs.append(_definition(group, p, off, extra, fetch))
        filters[p.name] = f"({filt}) && ({by_port})"
    own = any(t.get("type") == "vxlan" for t in ((resolved.get("guests") or {}).get(guest) or {}).get("tunnels") or ())
    for p, vni_at in TUNNEL_POINTS if own else ():
        data = f"+{off['skb_data']}({p.skb})"
        defs.append(_definition(group, p, off, extra, f"ovni={_at(vni_at, data)}:u32"))
        filters[p.name] = filt
    return defs, filters
