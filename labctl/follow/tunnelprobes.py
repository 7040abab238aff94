"""The probes that follow a packet through a tunnel (what their events mean: :mod:`labctl.trace.encap`).

Each tunnel of the lab over outer IPv4 (VXLAN, Geneve, GRE, GRETAP, IP in IP) or IPv6 (VXLAN and
Geneve to an IPv6 remote: their ``vx6`` and ``gnv6`` framings, at IPv6's ``ip6_forward`` and
``ip6_input`` instead of IPv4's ``ip_forward`` and ``ip_local_deliver``) has a
:class:`~labctl.lab.tunnels.framing.Framing`: where the inner header sits in the outer packet, the
families of inner packets it carries (IPv4, IPv6 and ARP inside Ethernet; IPv4 and IPv6 in GRE;
IPv4 in IP in IP) and the guards that make sure it is there. Every followed guest gets, for each
framing of the lab's tunnels and each of its families the follow filter can match, a probe on each
point the *outer* packet passes (``net_dev_queue``, ``net_dev_start_xmit``, ``netif_receive_skb``,
``ip_forward``, ``ip_local_deliver``; ``xmit_vx``, ``xmit6_vx``, ``xmit_arp_vx``...) that fetches the
inner packet's header where it sits (:func:`labctl.follow.probes.ip_fields` of its family), with the
family's follow filter on those fields and the framing's guards on the outer packet (its IP protocol;
the UDP destination port one of the lab's tunnels' of that kind; the tunnel header's first word).
An inner IPv6 or ARP packet's EtherType (the inner Ethernet header's; GRE's protocol field, in its
first word too: :meth:`~labctl.lab.tunnels.framing.Framing.word_for`) is fetched as ``pr``, the field
the family's filter guards (``skb->protocol`` at :mod:`labctl.follow.probes`' own points, the outer
packet's here): the router between two ends follows the inner packet with no tunnel of its own. A guest with
a tunnel of the framing gets the outer packet at fewer points (:data:`TRANSIT`: the wire's ends and
``ip_forward``) and its encapsulation and decapsulation (the framing's
:class:`~labctl.lab.tunnels.framing.Site`\\ s: ``udp_tunnel_xmit_skb`` and ``vxlan_rcv`` or
``geneve_udp_encap_recv``, ``ip_tunnel_xmit`` and ``gre_rcv`` or ``ipip_rcv``), guarded the same way
where the function is shared. The wire captures key a tunnel's frame by its inner header too
(:func:`frame_header`), so that the wire hop says whether the host side saw it. WireGuard's framing is encrypted: its tunnels' guests get ``wg_xmit``
(the encapsulation, of an inner IPv4 or IPv6 packet: ``pr`` is the skb's protocol there) and
``wg_allowedips_lookup_src`` (the decrypted packet, before it is handed to the device) and no outer probe. Only
outer IPv4 without options and outer IPv6 without extension headers (but ``ip6tnl``'s tunnel
encapsulation limit: :mod:`labctl.lab.tunnels.ipip`), an inner IPv6 packet without extension headers, an
inner frame without a VLAN tag.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.follow.probes import ProbePoint, drop_fetch, ip_fields
from labctl.lab import ETHERTYPES, KINDS, Framing, Tunnel
from labctl.pktfilter import ARP, Node, kernel_filter
from labctl.trace import PARSERS, PacketHeader, parse_frame

__all__ = ["DROP_POINTS", "OUTER6_POINTS", "OUTER_POINTS", "definitions", "frame_header", "framings", "inner_header"]

ETH, IP4, IP6 = 14, 20, 40
FAMILY = {etype: family for family, etype in ETHERTYPES.items()}
NAMED = {4: "", 6: "6", ARP: "_arp"}
"""What a probe's name has after its point for an inner packet of each family (``xmit6_vx``, ``encap_arp_gtap``),
as :mod:`labctl.follow.probes`' own points (``xmit6``, ``xmit_arp``)."""

# (point, probe kind, place, skb, where the outer IP header is from skb->data there, fetches the device)
OUTER_POINTS = (
    ("dev_queue", "e", "net.net_dev_queue", "$skbaddr", ETH, True),
    ("xmit", "e", "net.net_dev_start_xmit", "$skbaddr", ETH, True),
    ("netif_rx", "e", "net.netif_receive_skb", "$skbaddr", 0, True),
    ("ip_fwd", "p", "ip_forward", "%di", 0, False),
    ("ip_local", "p", "ip_local_deliver", "%di", 0, False),
)
OUTER6_POINTS = OUTER_POINTS[:3] + (  # an outer IPv6 header's: IPv6's own forward and input
    ("ip6_fwd", "p", "ip6_forward", "%di", 0, False),
    ("ip6_local", "p", "ip6_input", "%di", 0, False),
)
DROP_POINTS = (  # the outer packet freed as a drop (skb:kfree_skb), where its IP header is from skb->data then
    ("drop", "e", "skb.kfree_skb", "$skbaddr", 0, True),  # received, forwarded, filtered (netfilter's hooks)
    ("drop_tx", "e", "skb.kfree_skb", "$skbaddr", ETH, True),  # on its way out: a qdisc, netem, the driver
    ("drop_pulled", "e", "skb.kfree_skb", "$skbaddr", None, True),  # delivered (its IP header pulled): UDP's, the tunnel's own receive
)
"""Where a lab tunnel's outer packet may be dropped, each an event probe that fetches the inner header
there (:func:`definitions`): the drop joins the inner packet's journey, its note the outer header."""


ALL = tuple(p[0] for p in OUTER_POINTS)
ALL6 = tuple(p[0] for p in OUTER6_POINTS)
TRANSIT = ("xmit", "netif_rx", "ip_fwd", "ip6_fwd")
"""The outer points a guest with a tunnel of the framing gets: the wire's two ends (the NIC that
sent or received the outer packet: :mod:`labctl.trace.journey` names the wire, orders the guests'
visits and aligns their clocks by them) and ``ip_forward`` (``ip6_forward``: the framing's packets it
forwards for others). Not ``net_dev_queue`` and ``ip_local_deliver``: each probe costs every packet that passes
its point, followed or not, and for its own tunnels' outer packets these two say nothing its
encapsulation and decapsulation hops do not."""


def _tunnels(guest: Mapping[str, Any]) -> list[Tunnel]:
    return [Tunnel.from_dict(t) for t in guest.get("tunnels") or () if t.get("type") in KINDS]


def framings(resolved: Mapping[str, Any]) -> dict[str, tuple[Framing, list[int]]]:
    """The framings of the lab's tunnels (a lab's resolved dict) by tag, each with the UDP ports its
    tunnels send to (sorted; none for GRE and IP in IP); empty: no tunnel followed on the wire."""
    out: dict[str, tuple[Framing, set[int]]] = {}
    for g in (resolved.get("guests") or {}).values():
        for t in _tunnels(g):
            for f in KINDS[t.kind].framings_of(t):
                ports = out.setdefault(f.tag, (f, set()))[1]
                if f.port_key:
                    ports.add(int(t.opt(f.port_key) or f.port))
    order = [f.tag for k in KINDS.values() for f in k.framings]  # the kinds' table's
    return {tag: (f, sorted(ports)) for tag, (f, ports) in sorted(out.items(), key=lambda x: order.index(x[0]))}


def inner_header(frame: bytes, lab: Mapping[str, tuple[Framing, list[int]]]) -> PacketHeader | None:
    """The inner IPv4, IPv6 or ARP header of an Ethernet frame that carries one of the lab's tunnels'
    packets (an outer IPv4 header without options, or an IPv6 one without extension headers, that
    passes a framing's guards: :func:`framings`' answer; the inner packet's EtherType one of the
    framing's families), or None."""
    if len(frame) < ETH + IP4:
        return None
    if frame[12:14] == b"\x08\x00" and frame[ETH] == 0x45:
        outer, proto = 4, frame[ETH + 9]
    elif frame[12:14] == b"\x86\xdd" and frame[ETH] >> 4 == 6 and len(frame) >= ETH + IP6:
        outer, proto = 6, frame[ETH + 6]
    else:
        return None
    for f, ports in lab.values():
        end = ETH + f.outer_len
        if f.encrypted or f.outer != outer or proto != f.proto:
            continue
        if f.port_key and int.from_bytes(frame[end + 2:end + 4], "big") not in ports:
            continue
        etype = ETHERTYPES[f.families[0]] if f.proto_at is None else int.from_bytes(frame[end + f.proto_at:end + f.proto_at + 2], "big")
        family = FAMILY.get(etype)
        if family not in f.families:
            continue
        word = f.word_for(etype)
        if word is not None and frame[end + f.word_at:end + f.word_at + 4] != word.to_bytes(4, "big"):
            continue
        return PARSERS[etype](frame[end + f.inner:])
    return None


def frame_header(frame: bytes, node: Node, lab: Mapping[str, tuple[Framing, list[int]]]) -> PacketHeader | None:
    """The header of a captured Ethernet frame that the filter ``node`` matches: its own, or the inner
    one of a tunnel's packet it carries (:func:`inner_header`); None when neither matches."""
    for h in (parse_frame(frame), inner_header(frame, lab) if lab else None):
        if h is not None and node.match(h.packet()):
            return h
    return None


def _le(value: int, size: int) -> int:
    """A network-order field as the probe reads it (little-endian)."""
    return int.from_bytes(value.to_bytes(size, "big"), "little")


def _at(offset: int, data: str) -> str:
    return f"{'+' if offset >= 0 else '-'}{abs(offset)}({data})"


def _definition(group: str, p: ProbePoint, off: dict[str, int], extra: set[str], fetch: str) -> str:
    data = f"+{off['skb_data']}({p.skb})"
    dev = f" dev=+{off['dev_name']}(+{off['skb_dev']}({p.skb})):string" if p.dev else ""
    return " ".join(x for x in (f"{p.kind}:{group}/{p.name} {p.place} skb={p.skb}:x64{dev}",
                                ip_fields(data, p.ip_at, extra, p.family), fetch) if x)


def _header(f: Framing, family: int, end: int, data: str) -> tuple[list[str], list[str]]:
    """The fetches and guards of the tunnel header, the outer IP header ending at ``end``; an inner
    IPv6 or ARP packet's EtherType (``proto_at``) is fetched as ``pr``, which its family's filter guards
    (``skb->protocol`` elsewhere: :func:`labctl.pktfilter.kernel_filter`)."""
    fetch, guard = [], []
    word = f.word_for(ETHERTYPES[family])
    if family != 4 and f.proto_at is not None:
        fetch.append(f"pr={_at(end + f.proto_at, data)}:u16")
    if word is not None:
        fetch.append(f"ohd={_at(end + f.word_at, data)}:u32")
        guard.append(f"ohd == {_le(word, 4)}")
    if f.ident:
        fetch.append(f"oid={_at(end + f.ident_at, data)}:u32")
    if f.seq_at:
        fetch.append(f"oseq={_at(end + f.seq_at, data)}:u32")
    return fetch, guard


def _outer_fetch(f: Framing, outer: int, data: str) -> tuple[list[str], list[str]]:
    """The outer header's addresses and protocol (IPv4's ``osa``, ``oda``; IPv6's ``os6a``-``os6d``,
    ``od6a``-``od6d``; ``opr``: the protocol or next header), at ``outer`` from ``data``, and its guard."""
    if f.outer == 4:
        fetch = [f"osa={_at(outer + 12, data)}:u32", f"oda={_at(outer + 16, data)}:u32", f"opr={_at(outer + 9, data)}:u8"]
    else:
        fetch = [f"o{side}6{c}={_at(outer + at + 4 * i, data)}:u32" for side, at in (("s", 8), ("d", 24))
                 for i, c in enumerate("abcd")] + [f"opr={_at(outer + 6, data)}:u8"]
    return fetch, [f"opr == {f.proto}"]


def _outer(group: str, f: Framing, family: int, ports: list[int], off: dict[str, int], filt: str, extra: set[str],
           points: tuple[str, ...] | None = None, drop: str = "") -> tuple[list[str], dict[str, str]]:
    """The outer packet's probes at ``points`` (None: every point of the framing's outer family) and, with ``drop`` (the drop event's reason and location
    fetches, :func:`labctl.follow.probes.drop_definition`'s), at :data:`DROP_POINTS`."""
    defs, filters = [], {}
    iph = f.outer_len
    table = OUTER_POINTS if f.outer == 4 else OUTER6_POINTS
    for point, kind, place, skb, at, dev in table + (DROP_POINTS if drop else ()):
        if points is not None and point not in points and not point.startswith("drop"):
            continue
        outer = -iph if at is None else at
        p = ProbePoint(f"{point}{NAMED[family]}_{f.tag}", kind, place, skb, outer + iph + f.inner, dev=dev, family=family)
        data = f"+{off['skb_data']}({skb})"
        fetch, guard = _outer_fetch(f, outer, data)
        if f.port_key:
            fetch.append(f"odp={_at(outer + iph + 2, data)}:u16")
            guard.append("(" + " || ".join(f"odp == {_le(port, 2)}" for port in ports) + ")")
        more, checks = _header(f, family, outer + iph, data)
        if family != 4 and f.proto_at is None:  # IPv6 in IPv6 (ip6tnl): the outer packet's skb->protocol is IPv6's too
            more.insert(0, f"pr=+{off['skb_protocol']}({skb}):u16")
        defs.append(_definition(group, p, off, extra, " ".join(fetch + more + ([drop] if point.startswith("drop") else []))))
        filters[p.name] = f"({filt}) && " + " && ".join(guard + checks)
    return defs, filters


def _site(group: str, point: str, f: Framing, family: int, off: dict[str, int], filt: str, extra: set[str]
          ) -> tuple[str, str, str]:
    """The probe of ``f``'s encapsulation or decapsulation (``point``) of an inner packet of ``family``:
    its name, its definition and its filter."""
    s = f.encap if point == "encap" or f.decap is None else f.decap
    p = ProbePoint(f"{point}{NAMED[family]}_{f.tag}", "p", s.function, s.skb, s.at + f.inner, dev=True, family=family)
    fetch, guard = _header(f, family, s.at, f"+{off['skb_data']}({s.skb})")
    if family != 4 and f.proto_at is None:  # WireGuard's: the inner packet is the skb's
        fetch.insert(0, f"pr=+{off['skb_protocol']}({s.skb}):u16")
    if s.proto:
        fetch.insert(0, f"opr={s.proto}:u8")
        guard.insert(0, f"opr == {f.proto}")
    return p.name, _definition(group, p, off, extra, " ".join(fetch)), " && ".join([f"({filt})", *guard]) if guard else filt


def definitions(group: str, node: Node, off: dict[str, int], resolved: Mapping[str, Any], guest: str,
                reason: bool = True, symbol: bool = True) -> tuple[list[str], dict[str, str]]:
    """The guest's tunnel probes (``dynamic_events`` lines) and their filters, for each family of inner
    packets the filter can match that a framing carries: none when the lab has no tunnel followed on
    the wire or the filter matches none of them. ``reason``, ``symbol``: the guest's ``skb:kfree_skb``
    has its reason, its tracefs the ``symbol`` type (:class:`labctl.follow.probes.Caps`)."""
    lab = framings(resolved)
    if not lab:
        return [], {}
    own = {f.tag for t in _tunnels((resolved.get("guests") or {}).get(guest) or {}) for f in KINDS[t.kind].framings_of(t)}
    defs, filters = [], {}
    sites: set[tuple[str, str]] = set()
    for family in NAMED:
        filt, extra = kernel_filter(node, family)
        if filt is None:
            continue
        for tag, (f, ports) in lab.items():
            if family not in f.families:
                continue
            if not f.encrypted:
                more, more_filters = _outer(group, f, family, ports, off, filt, extra, TRANSIT if tag in own else None,
                                            drop_fetch(reason, symbol))
                defs += more
                filters.update(more_filters)
            for point in ("encap", "decap")[:1 if f.decap is None else 2] if tag in own else ():
                name, d, flt = _site(group, point, f, family, off, filt, extra)
                same = (d.replace(name, "", 1), flt)  # VXLAN's vxlan_rcv decapsulates over IPv4 and IPv6 alike: once
                if same not in sites:
                    sites.add(same)
                    defs.append(d)
                    filters[name] = flt
    return defs, filters
