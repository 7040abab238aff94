"""The 802.1Q VLANs a followed packet travelled on: what ``vlan [ID]`` keeps (:class:`labctl.pktfilter.Vlan`).

A packet is untagged on a VLAN device (``eth1.10``: its hops there), tagged on the parent NIC (in
``skb->vlan_tci``, or in the frame when the NIC inserts no tags) and tagged on the wire (in the
frame, as QEMU saw it on the host side of the NIC). So a journey's VLANs are the IDs of the VLAN
devices its hops are on (the topology's ``vlans``: ``(guest, device)`` → ID) and those the tags of
its frames on the wire carry (the wire's ``tags``: ``(guest, nic)`` → the packet's name → IDs,
looked up by each of its names: NAT may have renamed it). Its probes in the kernel need nothing of
it: the filter's other primitives choose what they record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

Tags = Mapping[tuple[str, str], Mapping[tuple[object, ...], set[int]]]


def journey_vlans(hops: Iterable[tuple[str, str | None]], names: Sequence[tuple[object, ...]],
                  devices: Mapping[tuple[str, str], int], tags: Tags) -> tuple[int, ...]:
    """The VLAN IDs of a packet's journey, sorted: ``hops`` its hops' (guest, device), ``names`` its names."""
    out = {devices[(g, d)] for g, d in hops if d and (g, d) in devices}
    for seen in tags.values():
        for key in names:
            out |= seen.get(key, set())
    return tuple(sorted(out))


def wire_note(nics: Iterable[tuple[str, str]], key: tuple[object, ...], tags: Tags) -> str:
    """``tagged VLAN 10`` for a wire hop whose frames QEMU saw tagged on ``nics``' host side ("": untagged)."""
    vids = sorted({v for n in nics for v in tags.get(n, {}).get(key, set())})
    return f"tagged VLAN {', '.join(map(str, vids))}" if vids else ""
