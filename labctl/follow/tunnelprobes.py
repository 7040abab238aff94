"""The probes that follow a packet through a tunnel (what their events mean: :mod:`labctl.trace.encap`).

Each tunnel of the lab that carries IPv4 in IPv4 (VXLAN, Geneve, GRE, GRETAP, IP in IP) has a
:class:`~labctl.lab.tunnels.framing.Framing`: where the inner IPv4 header sits in the outer packet
and the guards that make sure it is there. Every followed guest gets, for each framing of the lab's
tunnels, a probe on each point the *outer* packet passes (``net_dev_queue``, ``net_dev_start_xmit``,
``netif_receive_skb``, ``ip_forward``, ``ip_local_deliver``) that fetches the inner IPv4 header where
it sits, with the follow filter on those fields and the framing's guards on the outer packet (its IP
protocol; the UDP destination port one of the lab's tunnels' of that kind; the tunnel header's first
word): the router between two ends follows the inner packet with no tunnel of its own. A guest with
a tunnel of the framing also gets its encapsulation and decapsulation (the framing's
:class:`~labctl.lab.tunnels.framing.Site`\\ s: ``udp_tunnel_xmit_skb`` and ``vxlan_rcv`` or
``geneve_udp_encap_recv``, ``ip_tunnel_xmit`` and ``gre_rcv`` or ``ipip_rcv``), guarded the same way
where the function is shared. The wire captures key a tunnel's frame by its inner header too
(:func:`frame_header`), so that the wire hop says whether the host side saw it. WireGuard's framing is encrypted: its tunnels' guests get ``wg_xmit``
(the encapsulation) and nothing else. Only inner IPv4 packets over outer IPv4 without options (an
inner IPv6 or ARP packet is followed on the tunnel's device, not on the wire under it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.follow.probes import ProbePoint, ip_fields
from labctl.lab import KINDS, Framing, Tunnel
from labctl.pktfilter import Node, kernel_filter
from labctl.trace import PacketHeader, parse_frame, parse_ipv4

__all__ = ["OUTER_POINTS", "definitions", "frame_header", "framings", "inner_header"]

ETH, IP4 = 14, 20

# (point, probe kind, place, skb, where the outer IPv4 header is from skb->data there, fetches the device)
OUTER_POINTS = (
    ("dev_queue", "e", "net.net_dev_queue", "$skbaddr", ETH, True),
    ("xmit", "e", "net.net_dev_start_xmit", "$skbaddr", ETH, True),
    ("netif_rx", "e", "net.netif_receive_skb", "$skbaddr", 0, True),
    ("ip_fwd", "p", "ip_forward", "%di", 0, False),
    ("ip_local", "p", "ip_local_deliver", "%di", 0, False),
)


def _tunnels(guest: Mapping[str, Any]) -> list[Tunnel]:
    return [Tunnel.from_dict(t) for t in guest.get("tunnels") or () if t.get("type") in KINDS]


def framings(resolved: Mapping[str, Any]) -> dict[str, tuple[Framing, list[int]]]:
    """The framings of the lab's tunnels (a lab's resolved dict) by tag, each with the UDP ports its
    tunnels send to (sorted; none for GRE and IP in IP); empty: no tunnel followed on the wire."""
    out: dict[str, tuple[Framing, set[int]]] = {}
    for g in (resolved.get("guests") or {}).values():
        for t in _tunnels(g):
            f = KINDS[t.kind].framing(t)
            if f is not None:
                ports = out.setdefault(f.tag, (f, set()))[1]
                if f.port_key:
                    ports.add(int(t.opt(f.port_key) or f.port))
    order = [f.tag for k in KINDS.values() for f in k.framings]  # the kinds' table's
    return {tag: (f, sorted(ports)) for tag, (f, ports) in sorted(out.items(), key=lambda x: order.index(x[0]))}


def inner_header(frame: bytes, lab: Mapping[str, tuple[Framing, list[int]]]) -> PacketHeader | None:
    """The inner IPv4 header of an Ethernet frame that carries one of the lab's tunnels' packets (an
    outer IPv4 header without options that passes a framing's guards: :func:`framings`' answer), or None."""
    if len(frame) < ETH + IP4 or frame[12:14] != b"\x08\x00" or frame[ETH] != 0x45:
        return None
    end = ETH + IP4
    for f, ports in lab.values():
        if f.encrypted or frame[ETH + 9] != f.proto:
            continue
        if f.port_key and int.from_bytes(frame[end + 2:end + 4], "big") not in ports:
            continue
        if f.word is not None and frame[end + f.word_at:end + f.word_at + 4] != f.word.to_bytes(4, "big"):
            continue
        return parse_ipv4(frame[end + f.inner:])
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
    return " ".join(x for x in (f"{p.kind}:{group}/{p.name} {p.place} skb={p.skb}:x64{dev}", ip_fields(data, p.ip_at, extra),
                                fetch) if x)


def _header(f: Framing, end: int, data: str) -> tuple[list[str], list[str]]:
    """The fetches and guards of the tunnel header, the outer IPv4 header ending at ``end``."""
    fetch, guard = [], []
    if f.word is not None:
        fetch.append(f"ohd={_at(end + f.word_at, data)}:u32")
        guard.append(f"ohd == {_le(f.word, 4)}")
    if f.ident:
        fetch.append(f"oid={_at(end + f.ident_at, data)}:u32")
    if f.seq_at:
        fetch.append(f"oseq={_at(end + f.seq_at, data)}:u32")
    return fetch, guard


def _outer(group: str, f: Framing, ports: list[int], off: dict[str, int], filt: str, extra: set[str]
           ) -> tuple[list[str], dict[str, str]]:
    defs, filters = [], {}
    for point, kind, place, skb, outer, dev in OUTER_POINTS:
        p = ProbePoint(f"{point}_{f.tag}", kind, place, skb, outer + IP4 + f.inner, dev=dev)
        data = f"+{off['skb_data']}({skb})"
        fetch = [f"osa={_at(outer + 12, data)}:u32", f"oda={_at(outer + 16, data)}:u32", f"opr={_at(outer + 9, data)}:u8"]
        guard = [f"opr == {f.proto}"]
        if f.port_key:
            fetch.append(f"odp={_at(outer + IP4 + 2, data)}:u16")
            guard.append("(" + " || ".join(f"odp == {_le(port, 2)}" for port in ports) + ")")
        more, checks = _header(f, outer + IP4, data)
        defs.append(_definition(group, p, off, extra, " ".join(fetch + more)))
        filters[p.name] = f"({filt}) && " + " && ".join(guard + checks)
    return defs, filters


def _site(group: str, point: str, f: Framing, off: dict[str, int], filt: str, extra: set[str]) -> tuple[str, str]:
    """The probe of ``f``'s encapsulation or decapsulation (``point``) and its filter."""
    s = f.encap if point == "encap" or f.decap is None else f.decap
    p = ProbePoint(f"{point}_{f.tag}", "p", s.function, s.skb, s.at + f.inner, dev=True)
    fetch, guard = _header(f, s.at, f"+{off['skb_data']}({s.skb})")
    if s.proto:
        fetch.insert(0, f"opr={s.proto}:u8")
        guard.insert(0, f"opr == {f.proto}")
    return _definition(group, p, off, extra, " ".join(fetch)), " && ".join([f"({filt})", *guard]) if guard else filt


def definitions(group: str, node: Node, off: dict[str, int], resolved: Mapping[str, Any], guest: str
                ) -> tuple[list[str], dict[str, str]]:
    """The guest's tunnel probes (``dynamic_events`` lines) and their filters: none when the lab has
    no tunnel followed on the wire or the filter matches no IPv4 packet."""
    lab = framings(resolved)
    filt, extra = kernel_filter(node, 4)
    if not lab or filt is None:
        return [], {}
    own = {f.tag for t in _tunnels((resolved.get("guests") or {}).get(guest) or {})
           if (f := KINDS[t.kind].framing(t)) is not None}
    defs, filters = [], {}
    for tag, (f, ports) in lab.items():
        if not f.encrypted:
            more, more_filters = _outer(group, f, ports, off, filt, extra)
            defs += more
            filters.update(more_filters)
        for point in ("encap", "decap")[:1 if f.decap is None else 2] if tag in own else ():
            d, filters[f"{point}_{tag}"] = _site(group, point, f, off, filt, extra)
            defs.append(d)
    return defs, filters
