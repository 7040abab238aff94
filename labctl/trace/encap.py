"""Following a packet through encapsulation: the inner packet is the one followed, the outer one is
the wire that carries it, and encapsulation and decapsulation are hops of its path. Pure: what the
events mean (the probes are :mod:`labctl.follow.tunnelprobes`'s, each tunnel kind's header layouts
:class:`labctl.lab.tunnels.framing.Framing`\\ s of its module).

IPv4, IPv6 or ARP inside IPv4 (inside IPv6 too for VXLAN and Geneve to an IPv6 remote), in VXLAN,
Geneve, GRE, GRETAP or IP in IP (IPv4 only): the outer
packet's events are the points it passes, named by the point, the inner packet's family
(:data:`FAMILIES`) and the framing's tag (``xmit_vx``, ``netif_rx6_gnv``, ``ip_fwd_arp_gtapk``...
are ``xmit``, ``netif_rx``, ``ip_fwd``: :data:`VARIANTS`), each fetching the *inner* packet's header
(its family's fields: :func:`labctl.trace.hops.identity` tells which), so that they join its journey, and the outer header's addresses (``osa``, ``oda``; an
IPv6 one's ``os6a``-``os6d``, ``od6a``-``od6d``), the UDP port
(``odp``), the VNI or GRE key (``oid``; ``ovni`` in VXLAN's events of before) and a GRE sequence number
(``oseq``), which their hop's note says (:func:`note`): ``outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni
42``, ``outer GRE 10.1.0.2 > 10.2.0.2 key 5``, ``outer GRE 10.1.0.2 > 10.2.0.2 key 5 seq 3 csum`` (a
tunnel with ``csum`` and ``seq``), ``outer IPIP 10.1.0.2 > 10.2.0.2``. ``encap_TAG`` and ``decap_TAG`` (``encap6_TAG``, ``decap_arp_TAG``) are the hops
``encap`` and ``decap``, at their framing's functions (:func:`where`: ``udp_tunnel_xmit_skb``,
``vxlan_rcv``, ``geneve_udp_encap_recv``, ``ip_tunnel_xmit``, ``gre_rcv``, ``ipip_rcv``), their
note the id (``VXLAN vni 42``, ``GRE key 5``, ``IPIP``). WireGuard has no outer packet's events (it is
encrypted), its ``encap_wg`` (``wg_xmit``: ``WireGuard, encrypted``) and ``decap_wg``
(``wg_allowedips_lookup_src``: ``WireGuard, decrypted``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from labctl.lab import KINDS, Framing

__all__ = ["EVENTS", "FAMILIES", "FRAMINGS", "OUTER", "OUTER_POINTS", "POINTS", "VARIANTS", "mark", "note", "noted", "where"]

FRAMINGS: dict[str, Framing] = {f.tag: f for k in KINDS.values() for f in k.framings}
OUTER_POINTS = ("dev_queue", "xmit", "netif_rx", "ip_fwd", "ip_local", "ip6_fwd", "ip6_local")
"""The points an outer packet passes (its probes are these points' own, at the outer packet; an outer
IPv6 header's are IPv6's forward and input)."""
DROPS = ("drop", "drop_tx", "drop_pulled")
"""The outer packet's drop events (``drop_vx``, ``drop_tx6_gnv``...): the point ``drop``, wherever its
header was (received; on its way out; delivered, its IPv4 header pulled)."""
POINTS = (  # (name, where, role, title), as labctl.trace.hops.Point takes them; where: VXLAN's (see where())
    ("encap", "udp_tunnel_xmit_skb", "stack", "encapsulated (a tunnel's header pushed)"),
    ("decap", "vxlan_rcv", "stack", "decapsulated (a tunnel's header taken off)"),
)
FAMILIES = ("", "6", "_arp")
"""What an event's name has after its point for an inner IPv4, IPv6 or ARP packet (``xmit6_vx``)."""
EVENTS: dict[str, tuple[str, str]] = {
    **{f"{p}{fam}_{tag}": (p, tag) for tag in FRAMINGS for p in (*OUTER_POINTS, "encap", "decap") for fam in FAMILIES},
    **{f"{d}{fam}_{tag}": ("drop", tag) for tag in FRAMINGS for d in DROPS for fam in FAMILIES}}
"""Each tunnel probe's event name: (its point, its framing's tag); the inner packet's family is its
fields' (:func:`labctl.trace.hops.identity`)."""
VARIANTS = {name: point for name, (point, _) in EVENTS.items()}
OUTER = {name: tag for name, (point, tag) in EVENTS.items() if point in (*OUTER_POINTS, "drop")}
"""The events of an outer packet, and its framing."""


def mark(event: str, fields: dict[str, str]) -> None:
    """An event of a tunnel's probe (``event``, its name) says its framing: ``outer`` (the outer
    packet's) or ``tunnel`` (encap, decap) is its tag."""
    if event in EVENTS:
        fields["outer" if event in OUTER else "tunnel"] = EVENTS[event][1]


def _num(fields: Mapping[str, str], name: str) -> int | None:
    try:
        return int(fields[name], 0)
    except (KeyError, ValueError):
        return None


def _be(value: int, size: int) -> int:
    """A network-order field of ``size`` bytes that the probe read little-endian, as its number."""
    return int.from_bytes((value & (2 ** (8 * size) - 1)).to_bytes(size, "little"), "big")


def _ip(value: int | None) -> str:
    return "?" if value is None else str(ipaddress.IPv4Address(_be(value, 4)))


def _outer_ip(fields: Mapping[str, str], side: str) -> str:
    """The outer header's source (``side`` "s") or destination address: IPv4's (``osa``), or IPv6's
    four words (``os6a``...``os6d``), each read little-endian."""
    words = [_num(fields, f"o{side}6{c}") for c in "abcd"]
    if any(w is None for w in words):
        return _ip(_num(fields, f"o{side}a"))
    return str(ipaddress.IPv6Address(b"".join((w or 0).to_bytes(4, "little") for w in words)))


def vni(value: int | None) -> int | None:
    """A VXLAN or Geneve header's second word (VNI and a reserved byte), read little-endian, as the VNI."""
    return None if value is None else _be(value, 4) >> 8


def _ident(f: Framing, fields: Mapping[str, str]) -> str:
    """``vni 42``, ``key 5`` (the id the event fetched), then a GRE header's sequence number and
    checksum (``key 5 seq 3 csum``), or ''."""
    raw = _num(fields, "oid")
    if raw is None and f.tag == "vx":
        raw = _num(fields, "ovni")
    seq = _num(fields, "oseq") if f.seq_at else None
    return " ".join(x for x in (
        f"{f.ident} {vni(raw) if f.ident == 'vni' else _be(raw, 4)}" if f.ident and raw is not None else "",
        f"seq {_be(seq, 4)}" if seq is not None else "",
        "csum" if f.csum else "") if x)


def _framing(fields: Mapping[str, str], key: str) -> Framing | None:
    return FRAMINGS.get(fields.get(key) or "")


def noted(text: str, point: str, fields: Mapping[str, str]) -> str:
    """``text`` (a hop's note) with :func:`note`'s after it."""
    return "; ".join(x for x in (text, note(point, fields)) if x)


def note(point: str, fields: Mapping[str, str]) -> str:
    """What a hop of ``point`` says of its encapsulation: the outer header of an outer packet's event
    (``outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42``), the framing and its id at ``encap`` and
    ``decap`` (``VXLAN vni 42``; an event of before, without its framing: VXLAN's); '' else."""
    f = _framing(fields, "outer")
    if f is not None:
        port = _num(fields, "odp")
        udp = f" udp/{'?' if port is None else _be(port, 2)}" if f.port_key else ""
        ident = _ident(f, fields)
        return f"outer {f.title} {_outer_ip(fields, 's')} > {_outer_ip(fields, 'd')}{udp}" + (f" {ident}" if ident else "")
    if point not in ("encap", "decap"):
        return ""
    f = _framing(fields, "tunnel")
    if f is None:  # VXLAN's events of before (no framing said): the VNI alone
        v = vni(_num(fields, "ovni"))
        return f"VXLAN vni {v}" if v is not None else ""
    if f.encrypted:
        return f"{f.title}, {'encrypted' if point == 'encap' else 'decrypted'}"
    return " ".join(x for x in (f.title, _ident(f, fields)) if x)


def where(point: str, fields: Mapping[str, str]) -> str | None:
    """The function of an ``encap`` or ``decap`` hop (its framing's), or None (the point's own)."""
    f = _framing(fields, "tunnel")
    if f is None or point not in ("encap", "decap"):
        return None
    site = f.encap if point == "encap" else f.decap
    return site.name if site is not None else None
