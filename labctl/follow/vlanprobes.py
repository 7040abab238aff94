"""The probes that see a packet inside an 802.1Q tag in the frame itself (what their events mean:
:mod:`labctl.trace.vlanhops`).

A NIC that strips and inserts no tags (virtio-net: ``rx-vlan-offload: off [fixed]``) has the tag in
the frame at two follow points: on receive, ``netif_receive_skb`` runs before the stack takes the
tag out of the frame (``skb_vlan_untag``), so ``skb->data`` is at the tag and the network header 4
bytes on; on transmit, the tag a VLAN device put into ``skb->vlan_tci`` is pushed into the frame
before the driver (``validate_xmit_vlan``), so at ``net_dev_start_xmit`` the network header is 18
bytes after ``skb->data``, not 14. Each of those points gets one more probe per family the filter
can match (``netif_rx_q``, ``xmit_q``; ``netif_rx6_q``..., ``xmit_arp_q``), reading the header 4
bytes further, with the follow filter behind ``skb->protocol`` 802.1Q (``pr == 0x81``) and the
tag's encapsulated type the family's (``et``); each also fetches the tag's TCI (``tci``: its VLAN
ID). Only for a filter with ``vlan`` (:func:`labctl.pktfilter.vlan_of`): without, those hops are
not shown, and no packet pays for the probes.
"""

from __future__ import annotations

from labctl.follow.probes import ProbePoint, point_definition
from labctl.pktfilter import ARP, Node, kernel_filter, vlan_of

__all__ = ["TAGGED_POINTS", "definitions", "tagged_filter"]

TAG = 4
TAGGED_POINTS = tuple(
    ProbePoint(f"{name}{suffix}_q", "e", place, "$skbaddr", at + TAG, dev=True, family=family)
    for family, suffix in ((4, ""), (6, "6"), (ARP, "_arp"))
    for name, place, at in (("netif_rx", "net.netif_receive_skb", 0), ("xmit", "net.net_dev_start_xmit", 14)))
_TYPES = {4: 0x0800, 6: 0x86DD, ARP: 0x0806}
_Q = 0x8100


def _le16(value: int) -> int:
    """A network-order 16-bit value as the guest's CPU reads it (0x8100 is 0x81)."""
    return int.from_bytes(value.to_bytes(2, "big"), "little")


def tagged_filter(filt: str, family: int) -> str:
    """The follow filter ``filt`` of ``family`` for its packet inside an 802.1Q tag: ``skb->protocol``
    is the tag's type there, the family's own is the tag's encapsulated type."""
    guard = f"pr == {_le16(_Q):#x} && et == {_le16(_TYPES[family]):#x}"
    own = f"pr == {_le16(_TYPES[family]):#x}"
    return filt.replace(own, guard, 1) if filt.startswith(own) else f"{guard} && {filt}"


def definitions(group: str, node: Node, off: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    """The guest's probes for tagged frames (``dynamic_events`` lines) and their filters: none for a
    filter without ``vlan``, none for a family it cannot match."""
    if vlan_of(node) is None:
        return [], {}
    defs, filters = [], {}
    for p in TAGGED_POINTS:
        filt, extra = kernel_filter(node, p.family)
        if filt is None:
            continue
        data = f"+{off['skb_data']}({p.skb})"
        pr = f" pr=+{off['skb_protocol']}({p.skb}):u16" if p.family == 4 else ""  # IPv6's and ARP's fetch it
        defs.append(point_definition(group, p, off, extra)
                    + f"{pr} et=+{p.ip_at - 2}({data}):u16 tci=+{p.ip_at - TAG}({data}):u16")
        filters[p.name] = tagged_filter(filt, p.family)
    return defs, filters
