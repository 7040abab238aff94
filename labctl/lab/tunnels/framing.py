"""How a tunnel kind's packets sit in the outer packet, and where the kernel wraps and unwraps them:
what ``labctl follow`` needs to follow the inner packet on the wire (its probes:
:mod:`labctl.follow.tunnelprobes`; what their events mean: :mod:`labctl.trace.encap`). Pure data,
one :class:`Framing` (or one per header layout) in each kind's module.

Offsets count from the end of the outer IP header (IPv4's 20 bytes without options, or IPv6's 40
without extension headers: a framing's ``outer``), where the UDP header (VXLAN, Geneve), the GRE
header or the inner IPv4 header (IP in IP) starts. The inner packet is
IPv4, IPv6 or ARP (a framing's ``families``), the same offsets for each: the inner Ethernet
header's EtherType or GRE's protocol field (``proto_at``) says which. A framing is *exact*: its
guards (the outer IP protocol, the UDP port, the tunnel header's first 32 bits) keep a packet whose
header has another layout (a Geneve header with options, a GRE header without the checksum its tunnel
sends) out, as the
offsets would be wrong for it. An *encrypted* framing (WireGuard) has its encapsulation only: the
outer packet cannot be matched by its inner header, nor the packet before it is decrypted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ARP", "ETHERTYPES", "LAYER2", "LAYER3", "Framing", "Site"]

ARP = 0x806  # the follow filter's family of ARP messages (labctl.pktfilter's ARP: its EtherType)
ETHERTYPES = {4: 0x0800, 6: 0x86DD, ARP: ARP}
"""Each family's EtherType (an inner Ethernet header's, or GRE's protocol field)."""
LAYER2 = (4, 6, ARP)
"""The families an Ethernet-carrying framing carries (VXLAN, Geneve, GRETAP)."""
LAYER3 = (4, 6)
"""The families GRE and WireGuard carry."""


@dataclass(frozen=True)
class Site:
    """A kernel function that encapsulates or decapsulates the kind's packets, for a kprobe:
    ``function`` (``vxlan_rcv``; ``MODULE:NAME`` when another module has a function of that name),
    the register that holds the skb there, where the outer IPv4 header ends from ``skb->data`` there
    (``at``: -8 when the UDP header is not pushed yet) and the register that holds the outer IP
    protocol, when the function is shared by kinds of two protocols (``ip_tunnel_xmit``'s 4th argument)."""

    function: str
    skb: str
    at: int
    proto: str = ""

    @property
    def name(self) -> str:
        """The function without its module (``gre_rcv``), as a hop shows it."""
        return self.function.rpartition(":")[2]


@dataclass(frozen=True)
class Framing:
    """One header layout of a tunnel kind: ``tag`` names its probes (``xmit_TAG``), ``title`` is what
    the hops' notes call its outer header (``outer GRE 10.1.0.2 > 10.2.0.2 key 5``), ``proto`` the
    outer IP protocol, ``inner`` where the inner packet's header is (after any inner Ethernet header);
    ``word``: the tunnel header's first 32 bits (network order), the same in each of its packets,
    at ``word_at``; ``ident``: what the id at ``ident_at`` is (``vni``: 24 bits then a reserved byte;
    ``key``: 32 bits); ``port_key``: the tunnel option that gives the outer UDP destination port
    (``port``: its default); ``seq_at``: where a sequence number is (GRE's, 32 bits; 0: none);
    ``csum``: the header carries a checksum (GRE's); ``encrypted``: the outer packet is not matched,
    and there is no ``decap``; ``families``: the inner packets it carries (4, 6, :data:`ARP`), told
    apart by the EtherType at ``proto_at`` (the inner Ethernet header's, GRE's protocol field; None:
    IPv4 only, or WireGuard's, whose encapsulation has the inner packet's ``skb->protocol``); ``outer``:
    the outer header's family (4; 6: a tunnel to an IPv6 remote, its IP protocol the next header)."""

    tag: str
    title: str
    proto: int
    inner: int
    encap: Site
    decap: Site | None
    word: int | None = None
    word_at: int = 0
    ident: str = ""
    ident_at: int = 0
    port_key: str = ""
    port: int = 0
    seq_at: int = 0
    csum: bool = False
    encrypted: bool = False
    proto_at: int | None = None
    families: tuple[int, ...] = (4,)
    outer: int = 4

    @property
    def outer_len(self) -> int:
        """The outer IP header's length: IPv4's without options, IPv6's without extension headers."""
        return 20 if self.outer == 4 else 40

    def word_for(self, ethertype: int) -> int | None:
        """The tunnel header's first 32 bits for an inner packet of ``ethertype`` (:data:`ETHERTYPES`):
        GRE's protocol field is in them (``proto_at``), another framing's are the same for each."""
        if self.word is None or self.proto_at is None or not self.word_at <= self.proto_at <= self.word_at + 2:
            return self.word
        shift = 8 * (self.word_at + 2 - self.proto_at)
        return self.word & ~(0xFFFF << shift) | ethertype << shift
