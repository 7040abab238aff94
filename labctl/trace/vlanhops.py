"""The 802.1Q VLANs a followed packet travelled on: what ``vlan [ID]`` keeps (:class:`labctl.pktfilter.Vlan`).

A packet is untagged on a VLAN device (``eth1.10``: its hops there), tagged on the parent NIC (in
``skb->vlan_tci``, or in the frame when the NIC strips and inserts no tags) and tagged on the wire
(in the frame, as QEMU saw it on the host side of the NIC). So a journey's VLANs are the IDs of the
VLAN devices its hops are on (the topology's ``vlans``: ``(guest, device)`` → ID), of the tags its
hops read in the frame (the events of :mod:`labctl.follow.vlanprobes`, their ``tci``) and of those its frames on the wire carry (the wire's ``tags``: ``(guest, nic)`` → the
packet's name → IDs, looked up by each of its names: NAT may have renamed it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from labctl.trace.hops import Event

Tags = Mapping[tuple[str, str], Mapping[tuple[object, ...], set[int]]]


def tag_vlan(e: Event) -> int | None:
    """The VLAN ID of the tag an event read in the frame (its ``tci``, network order read little-endian)."""
    tci = e.num("tci")
    return None if tci is None else int.from_bytes((tci & 0xFFFF).to_bytes(2, "little"), "big") & 0xFFF


def journey_vlans(events: Iterable[Event], names: Sequence[tuple[object, ...]],
                  devices: Mapping[tuple[str, str], int], tags: Tags) -> tuple[int, ...]:
    """The VLAN IDs of a packet's journey, sorted: ``events`` its events, ``names`` its names."""
    out: set[int] = set()
    for e in events:
        out |= {v for v in (devices.get((e.guest, e.dev)) if e.dev else None, tag_vlan(e)) if v is not None}
    for seen in tags.values():
        for key in names:
            out |= seen.get(key, set())
    return tuple(sorted(out))


def hop_note(e: Event) -> str:
    """``tagged VLAN 10 in the frame`` for a hop that read the packet inside a tag ("": any other)."""
    vid = tag_vlan(e)
    return "" if vid is None else f"tagged VLAN {vid} in the frame"


def wire_note(nics: Iterable[tuple[str, str]], key: tuple[object, ...], tags: Tags) -> str:
    """``tagged VLAN 10`` for a wire hop whose frames QEMU saw tagged on ``nics``' host side ("": untagged)."""
    vids = sorted({v for n in nics for v in tags.get(n, {}).get(key, set())})
    return f"tagged VLAN {', '.join(map(str, vids))}" if vids else ""
