"""The subset of pcap-filter syntax (``tcpdump``'s) that labctl follows packets by: IPv4, IPv6 and ARP, on a VLAN.

:func:`parse` turns a filter into a small tree; the tree is evaluated on a packet's header fields on
the host (:meth:`Node.match`) and translated, once per family, into the kernel's own event filter
(ftrace's filter grammar) over the fields the follow probes fetch (:func:`kernel_filter`), so that
only matching packets are recorded in the guests: a family the filter cannot match gets no probes at
all. The caller checks the text with libpcap first (``tcpdump -d -- TEXT``; :func:`refuse_options`
before that, so that a filter is never taken for one of tcpdump's options); this parser then says
clearly which primitives it does not follow.

Supported, as pcap means them::

    [src|dst|src or dst|src and dst] host ADDR        (IPv4: IPv4 and ARP packets; IPv6: IPv6 ones)
    [src|dst|...] net ADDR/LEN | net ADDR mask MASK | net 10.1     (a dotted prefix: 10.1 = /16; IPv6 prefixes too)
    [tcp|udp] [src|dst|...] port N                    (IPv4 and IPv6)
    icmp | icmp6 | tcp | udp | ip | ip6 | arp | ip proto N | ip6 proto N | proto N
    ip host ADDR, ip6 net NET, arp host ADDR ...      (a family before host, net, src, dst)
    and, or, not (also &&, ||, !), parentheses; a bare value after and/or repeats the last
    primitive's qualifiers, as in pcap (``host 10.0.0.1 or 10.0.0.2``)
    vlan | vlan ID                                    (a top-level conjunct only: vlan 10 and EXPR, EXPR and vlan 10)

``vlan [ID]`` selects journeys, not headers (:class:`Vlan`): those that pass 802.1Q VLAN ``ID`` (any
without one) at some hop (:mod:`labctl.trace.vlanhops`: a packet is untagged on ``eth1.10``, tagged
on its parent and the wire), the rest of the filter on the packet's own header as usual; nothing of
it goes into the kernel's filter. pcap's ``vlan`` moves the offsets of what follows it, which has no
sense for a journey: it is taken only as a conjunct of the whole filter, either side of ``and``,
once (:func:`vlan_of`).

Families: ``4`` (IPv4), ``6`` (IPv6), :data:`ARP`. For ARP, a packet's source and destination
addresses are the sender's and target's protocol (IPv4) addresses, as pcap reads them.

Byte order: the probes fetch header fields as the little-endian integers a guest's CPU reads from
network-order bytes, so an address 10.1.0.2 is ``0x0200010a`` and port 80 is ``0x5000`` there;
``skb->protocol`` (``pr``) too: IPv6's 0x86dd is ``0xdd86``, ARP's 0x0806 is ``0x608``.

* :mod:`.tree`: the tree, its evaluation on a packet and its kernel filters;
* :mod:`.parser`: the text into the tree.

Standard library only.

Imports never: labctl.trace, labctl.follow, labctl.steps, labctl.bundle, labctl.report, labctl.backends, labctl.cli, labctl.state, labctl.up, labctl.live, labctl.training
"""

from __future__ import annotations

from labctl.pktfilter.parser import parse, tokenize
from labctl.pktfilter.tree import (
    ARP,
    FAMILIES,
    FilterError,
    Node,
    Packet,
    Vlan,
    families,
    kernel_filter,
    refuse_options,
    vlan_of,
)

__all__ = ["ARP", "FAMILIES", "FilterError", "Node", "Packet", "Vlan", "families", "kernel_filter", "parse",
           "refuse_options", "tokenize", "vlan_of"]
