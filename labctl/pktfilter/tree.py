"""A filter as a tree (:class:`Node` and its kinds), evaluated on a packet's header fields on the host
(:meth:`Node.match`, :class:`Packet`) and translated per family into the follow probes' ftrace filter
(:func:`kernel_filter`, :func:`families`); its ``vlan`` conjunct (:func:`vlan_of`). The syntax, the
families and the byte order are in the package's docstring."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

ARP = 0x806
FAMILIES = (4, 6, ARP)
# each family's guard in the kernel: the IP version byte (and header length), or skb->protocol
GUARDS = {4: "vi >= 69 && vi <= 79", 6: "pr == 0xdd86 && vi >= 96 && vi <= 111", ARP: "pr == 0x608"}

Expr = bool | str
"""A kernel filter expression for one family, or a constant (the node always or never matches it)."""


class FilterError(ValueError):
    """A filter labctl cannot follow by (a syntax error, or a primitive outside its subset)."""


def refuse_options(text: str) -> None:
    """Refuse a filter that a command line would take for an option (it starts with ``-``).

    :raise FilterError: when it does.
    """
    if text.lstrip().startswith("-"):
        raise FilterError(f"'{text}': a filter cannot start with '-'")


@dataclass(frozen=True)
class Packet:
    """The header fields a filter reads: addresses as integers in network order (10.0.0.1 = 0x0a000001;
    IPv6's 128 bits; ARP's sender and target protocol addresses), the IP protocol or IPv6 next header
    (0 for ARP), ports (None for a packet without them: not TCP/UDP, or a later fragment) and the family."""

    saddr: int
    daddr: int
    proto: int
    sport: int | None = None
    dport: int | None = None
    family: int = 4


def _and(a: Expr, b: Expr) -> Expr:
    if a is False or b is False:
        return False
    if a is True:
        return b
    if b is True:
        return a
    return f"({a} && {b})"


def _or(a: Expr, b: Expr) -> Expr:
    if a is True or b is True:
        return True
    if a is False:
        return b
    if b is False:
        return a
    return f"({a} || {b})"


class Node:
    def match(self, p: Packet) -> bool:
        raise NotImplementedError

    def kernel(self, family: int, fields: set[str]) -> Expr:
        """This node for a packet of ``family`` as an ftrace filter expression (or a constant); the
        probe fields it reads beyond each family's own are added to ``fields``."""
        raise NotImplementedError

    def protocols(self, family: int) -> frozenset[int] | None:
        """The IP protocols (IPv6: next headers) a packet of ``family`` this node matches can carry;
        None: any (the node does not say). The follow points of one protocol (``tcp_v4_rcv``) are
        probed only for a filter that can match it: each probe costs every packet at its point."""
        return None


@dataclass(frozen=True)
class And(Node):
    a: Node
    b: Node

    def match(self, p: Packet) -> bool:
        return self.a.match(p) and self.b.match(p)

    def kernel(self, family: int, fields: set[str]) -> Expr:
        a = self.a.kernel(family, fields)
        return False if a is False else _and(a, self.b.kernel(family, fields))

    def protocols(self, family: int) -> frozenset[int] | None:
        a, b = self.a.protocols(family), self.b.protocols(family)
        return b if a is None else a if b is None else a & b


@dataclass(frozen=True)
class Or(Node):
    a: Node
    b: Node

    def match(self, p: Packet) -> bool:
        return self.a.match(p) or self.b.match(p)

    def kernel(self, family: int, fields: set[str]) -> Expr:
        return _or(self.a.kernel(family, fields), self.b.kernel(family, fields))

    def protocols(self, family: int) -> frozenset[int] | None:
        a, b = self.a.protocols(family), self.b.protocols(family)
        return None if a is None or b is None else a | b


@dataclass(frozen=True)
class Not(Node):
    a: Node

    def match(self, p: Packet) -> bool:
        return not self.a.match(p)

    def kernel(self, family: int, fields: set[str]) -> Expr:
        a = self.a.kernel(family, fields)
        return (not a) if isinstance(a, bool) else f"!({a})"


@dataclass(frozen=True)
class Everything(Node):
    """The empty filter: every IPv4, IPv6 and ARP packet."""

    def match(self, p: Packet) -> bool:
        return True

    def kernel(self, family: int, fields: set[str]) -> Expr:
        return True


@dataclass(frozen=True)
class Family(Node):
    """``ip``, ``ip6``, ``arp``."""

    family: int

    def match(self, p: Packet) -> bool:
        return p.family == self.family

    def kernel(self, family: int, fields: set[str]) -> Expr:
        return family == self.family


def _le32(value: int) -> int:
    """A network-order 32-bit value (10.0.0.1 = 0x0a000001) as a little-endian CPU reads it."""
    return int.from_bytes(value.to_bytes(4, "big"), "little")


def _le16(value: int) -> int:
    return int.from_bytes(value.to_bytes(2, "big"), "little")


def _sides(direction: str) -> tuple[str, ...]:
    return {"src": ("s",), "dst": ("d",)}.get(direction, ("s", "d"))


def _join(parts: list[str], direction: str) -> str:
    op = " && " if direction == "src and dst" else " || "
    return parts[0] if len(parts) == 1 else "(" + op.join(parts) + ")"


def _hits(direction: str, hits: list[bool]) -> bool:
    return all(hits) if direction == "src and dst" else any(hits)


# the probes' field names of each family's addresses: whole 32-bit words, and single bytes (networks)
def _addr_words(family: int, side: str) -> list[str]:
    if family == 6:
        return [f"{side}6{c}" for c in "abcd"]
    return [f"{side}addr"] if family == 4 else [_ARP_SIDE[side] + "pa"]


_ARP_SIDE = {"s": "s", "d": "t"}  # ARP's sender and target


def _addr_byte(family: int, side: str, i: int) -> str:
    return {4: f"{side}b{i}", 6: f"{side}6b{i}", ARP: f"{_ARP_SIDE[side]}pb{i}"}[family]


@dataclass(frozen=True)
class Host(Node):
    direction: str  # "src", "dst", "src or dst", "src and dst"
    addr: int
    families: tuple[int, ...] = (4, ARP)  # an IPv4 address: IPv4 and ARP (pcap's "host"); IPv6: (6,)

    def match(self, p: Packet) -> bool:
        if p.family not in self.families:
            return False
        return _hits(self.direction, [(p.saddr if s == "s" else p.daddr) == self.addr for s in _sides(self.direction)])

    def kernel(self, family: int, fields: set[str]) -> Expr:
        if family not in self.families:
            return False
        size = 16 if family == 6 else 4
        raw = self.addr.to_bytes(size, "big")
        parts = []
        for s in _sides(self.direction):
            words = [f"{name} == {_le32(int.from_bytes(raw[4 * i:4 * i + 4], 'big')):#x}"
                     for i, name in enumerate(_addr_words(family, s))]
            if family == ARP:
                fields.add(_ARP_SIDE[s] + "pa")
            parts.append(words[0] if len(words) == 1 else "(" + " && ".join(words) + ")")
        return _join(parts, self.direction)


@dataclass(frozen=True)
class Net(Node):
    direction: str
    addr: int  # network order, host bits zero
    prefix: int
    families: tuple[int, ...] = (4, ARP)

    @property
    def bits(self) -> int:
        return 128 if self.families == (6,) else 32

    @property
    def mask(self) -> int:
        full = (1 << self.bits) - 1
        return (full << (self.bits - self.prefix)) & full if self.prefix else 0

    def match(self, p: Packet) -> bool:
        if p.family not in self.families:
            return False
        return _hits(self.direction, [((p.saddr if s == "s" else p.daddr) & self.mask) == self.addr
                                      for s in _sides(self.direction)])

    def _side(self, family: int, side: str, fields: set[str]) -> str | bool:
        """Whole words equal, then byte by byte: whole bytes equal, the partial byte in its range
        (ftrace cannot mask a field)."""
        if self.prefix == 0:
            return True
        raw = self.addr.to_bytes(self.bits // 8, "big")
        parts = []
        words = _addr_words(family, side)
        whole = self.prefix // 32 if family == 6 or self.prefix == 32 else 0
        for i in range(whole):
            if family == ARP:
                fields.add(words[i])
            parts.append(f"{words[i]} == {_le32(int.from_bytes(raw[4 * i:4 * i + 4], 'big')):#x}")
        for i in range(4 * whole, len(raw)):
            bits = min(8, max(0, self.prefix - 8 * i))
            if bits == 0:
                break
            name = _addr_byte(family, side, i)
            fields.add(name)
            if bits == 8:
                parts.append(f"{name} == {raw[i]}")
            else:
                parts.append(f"{name} >= {raw[i]} && {name} <= {raw[i] + (1 << (8 - bits)) - 1}")
        return parts[0] if len(parts) == 1 and self.prefix == 32 else "(" + " && ".join(parts) + ")"

    def kernel(self, family: int, fields: set[str]) -> Expr:
        if family not in self.families:
            return False
        sides = [self._side(family, s, fields) for s in _sides(self.direction)]
        if any(s is True for s in sides):  # net 0/0 on one side
            return True if self.direction != "src and dst" or all(s is True for s in sides) else next(
                s for s in sides if s is not True)
        return _join([str(s) for s in sides], self.direction)


@dataclass(frozen=True)
class Port(Node):
    direction: str
    port: int
    proto: int | None = None  # tcp or udp only; None: either

    def match(self, p: Packet) -> bool:
        if p.family not in (4, 6) or p.proto not in ((self.proto,) if self.proto else (6, 17)):
            return False
        return _hits(self.direction, [(p.sport if s == "s" else p.dport) == self.port for s in _sides(self.direction)])

    def kernel(self, family: int, fields: set[str]) -> Expr:
        if family not in (4, 6):
            return False
        fields.update({"sport", "dport"} | ({"fo"} if family == 4 else set()))
        pf = "proto" if family == 4 else "nxt"
        proto = f"{pf} == {self.proto}" if self.proto else f"({pf} == 6 || {pf} == 17)"
        ports = _join([f"{s}port == {_le16(self.port):#x}" for s in _sides(self.direction)], self.direction)
        if family == 6:  # no extension headers: ports where fetched
            return f"({proto} && {ports})"
        # the first fragment only (pcap's rule: a later fragment has no ports); ihl 5: ports where fetched
        return f"({proto} && vi == 69 && !(fo & 0xff1f) && {ports})"

    def protocols(self, family: int) -> frozenset[int] | None:
        return frozenset((self.proto,) if self.proto else (6, 17))


@dataclass(frozen=True)
class Proto(Node):
    number: int
    families: tuple[int, ...] = (4,)

    def match(self, p: Packet) -> bool:
        return p.family in self.families and p.proto == self.number

    def kernel(self, family: int, fields: set[str]) -> Expr:
        if family not in self.families:
            return False
        return f"{'proto' if family == 4 else 'nxt'} == {self.number}"

    def protocols(self, family: int) -> frozenset[int] | None:
        return frozenset((self.number,)) if family in self.families else frozenset()


@dataclass(frozen=True)
class Vlan(Node):
    """``vlan`` (``id`` None: any VLAN) or ``vlan ID``: a journey on that 802.1Q VLAN (see the module
    docstring). No packet's own header says it: it matches every packet, here and in the kernel."""

    id: int | None = None

    def match(self, p: Packet) -> bool:
        return True

    def kernel(self, family: int, fields: set[str]) -> Expr:
        return True

    def passes(self, vlans: Collection[int]) -> bool:
        """Whether a journey seen on the VLANs ``vlans`` (their IDs) is on this one."""
        return bool(vlans) if self.id is None else self.id in vlans

    def describe(self) -> str:
        return "vlan" if self.id is None else f"vlan {self.id}"



def _conjuncts(node: Node) -> list[Node]:
    """The filter's top-level conjuncts: ``a and (b and c)`` is a, b, c."""
    return _conjuncts(node.a) + _conjuncts(node.b) if isinstance(node, And) else [node]


def _vlans(node: Node) -> list[Vlan]:
    """Every ``vlan`` primitive in the tree, wherever it is."""
    if isinstance(node, Vlan):
        return [node]
    if isinstance(node, (And, Or)):
        return _vlans(node.a) + _vlans(node.b)
    return _vlans(node.a) if isinstance(node, Not) else []


def vlan_of(node: Node, text: str = "") -> Vlan | None:
    """The filter's ``vlan [ID]``, the journeys it keeps (None: it has none, every journey).

    :raise FilterError: for a ``vlan`` that is not a conjunct of the whole filter (under ``or`` or
        ``not``: pcap's own meaning, offsets that move, has no sense for a journey), or a second one
        (pcap's stacked tags, not followed).
    """
    found = _vlans(node)
    if not found:
        return None
    top = [c for c in _conjuncts(node) if isinstance(c, Vlan)]
    where = f"'{text}': " if text else ""
    if len(top) < len(found):
        raise FilterError(f"{where}labctl follow takes 'vlan' only ANDed with the whole filter ('vlan 10 and "
                          "icmp', 'icmp and vlan 10'), not under 'or' or 'not': it selects the journeys "
                          "that pass the VLAN")
    if len(found) > 1:
        raise FilterError(f"{where}labctl follow takes one 'vlan', not stacked tags "
                          f"({', '.join(v.describe() for v in found)})")
    return found[0]


def kernel_filter(node: Node, family: int = 4) -> tuple[str | None, set[str]]:
    """The ftrace filter of ``node`` for a follow probe of ``family`` (None: the filter matches no packet
    of it, the family needs no probes), and the extra fields it reads (``sb0``.. ``db3``, ``s6b0``..,
    ``spb0``.. for networks, ``sport``/``dport``/``fo`` for ports, ``spa``/``tpa`` for ARP addresses);
    every IPv4 probe also has ``vi`` (IP version and header length), ``proto``, ``saddr`` and
    ``daddr``, every IPv6 one ``pr`` (``skb->protocol``), ``vi``, ``nxt`` and the addresses' words
    ``s6a``.. ``d6d``, every ARP one ``pr``."""
    fields: set[str] = set()
    body = node.kernel(family, fields)
    if body is False:
        return None, fields
    guard = GUARDS[family]
    return (guard if body is True else f"{guard} && {body}"), fields


def families(node: Node) -> list[int]:
    """The families ``node`` can match (each gets its probes)."""
    return [f for f in FAMILIES if kernel_filter(node, f)[0] is not None]
