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
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from dataclasses import dataclass, field

ARP = 0x806
FAMILIES = (4, 6, ARP)
PROTOS = {"icmp": (1, (4,)), "icmp6": (58, (6,)), "tcp": (6, (4, 6)), "udp": (17, (4, 6))}
SUPPORTED = ("host, net, port (with src/dst, tcp/udp), icmp, icmp6, tcp, udp, ip, ip6, arp, ip/ip6 proto, "
             "and/or/not with parentheses, vlan [ID] and the rest")
MAX_VLAN = 4095
_UNSUPPORTED = ("ether", "rarp", "mpls", "portrange", "less", "greater", "len",
                "gateway", "broadcast", "multicast", "sctp", "igmp", "pim", "llc", "decnet", "atalk",
                "iso", "ppp", "wlan", "type", "subtype", "inbound", "outbound", "ifname", "on", "geneve", "pppoed",
                "pppoes", "link", "fddi", "tr", "ah", "esp", "vrrp", "carp", "aarp", "stp", "ipx", "netbeui",
                "lat", "sca", "moprc", "mopdl", "protochain", "ipv6", "ra", "ta", "addr1", "addr2", "addr3",
                "addr4", "dir")
_TOKEN = re.compile(r"\s*(&&|\|\||[()!]|[A-Za-z0-9_.:/\[\]+*-]+|\S)")
_DIRS = ("src", "dst")
_FAMILY_WORDS = {"ip": (4,), "ip6": (6,), "arp": (ARP,)}
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


Qual = tuple[str, str, "int | None", "tuple[int, ...] | None"]  # kind, direction, proto, families


@dataclass
class _Parser:
    text: str
    tokens: list[str]
    pos: int = 0
    last: Qual | None = None  # the last primitive's qualifiers
    seen: list[str] = field(default_factory=list)

    def peek(self, k: int = 0) -> str | None:
        i = self.pos + k
        return self.tokens[i] if i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise FilterError(f"'{self.text}': the filter ends too early")
        self.pos += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.take()
        if got != tok:
            raise FilterError(f"'{self.text}': expected '{tok}', got '{got}'")

    def expr(self) -> Node:
        node = self.term()
        while self.peek() in ("or", "||"):
            self.take()
            node = Or(node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.peek() in ("and", "&&"):
            self.take()
            node = And(node, self.factor())
        return node

    def factor(self) -> Node:
        tok = self.peek()
        if tok in ("not", "!"):
            self.take()
            return Not(self.factor())
        if tok == "(":
            self.take()
            node = self.expr()
            self.expect(")")
            return node
        return self.primitive()

    def direction(self) -> str:
        if self.peek() not in _DIRS:
            return "src or dst"
        first = self.take()
        if self.peek() in ("or", "and") and self.peek(1) in _DIRS and self.peek(1) != first:
            op = self.take()
            self.take()
            return f"src {op} dst"
        return first

    def refuse(self, tok: str) -> FilterError:
        return FilterError(f"'{self.text}': labctl follow does not follow by '{tok}' "
                           f"(it follows IPv4, IPv6 and ARP packets by {SUPPORTED})")

    def primitive(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise FilterError(f"'{self.text}': the filter ends too early")
        low = tok.lower()
        if low in _UNSUPPORTED or "[" in tok:
            raise self.refuse(tok)
        if low == "vlan":
            return self.vlan()
        if low in PROTOS and self.peek(1) not in _DIRS + ("port",):
            self.take()
            return Proto(*PROTOS[low])
        if low in ("tcp", "udp"):  # tcp [src|dst] port N
            self.take()
            node = self.qualified(PROTOS[low][0], None)
            if not isinstance(node, Port):
                raise FilterError(f"'{self.text}': '{tok}' must be followed by port")
            return node
        if low in _FAMILY_WORDS:
            self.take()
            fams = _FAMILY_WORDS[low]
            if self.peek() == "proto" and low != "arp":
                self.take()
                return Proto(self.protocol(), fams)
            if self.peek() in ("host", "net", "src", "dst"):
                return self.qualified(None, fams)
            return Family(fams[0])
        if low == "proto":
            self.take()
            return Proto(self.protocol(), (4, 6))
        if low in _DIRS + ("host", "net", "port"):
            return self.qualified(None, None)
        if self.last is not None and _is_value(tok):  # pcap: a bare value repeats the last qualifiers
            return self.value(*self.last)
        if _is_value(tok):
            return self.value("host", "src or dst", None, None)
        raise self.refuse(tok)

    def vlan(self) -> Vlan:
        self.take()
        tok = self.peek()
        if tok is None or not tok.isdigit():
            return Vlan()
        self.take()
        if int(tok) > MAX_VLAN:
            raise FilterError(f"'{self.text}': VLAN ID {tok} is more than {MAX_VLAN}")
        return Vlan(int(tok))

    def protocol(self) -> int:
        tok = self.take()
        tok = tok.lstrip("\\")
        if tok in PROTOS:
            return PROTOS[tok][0]
        if tok.isdigit() and int(tok) < 256:
            return int(tok)
        raise FilterError(f"'{self.text}': unknown IP protocol '{tok}' (a number, icmp, icmp6, tcp or udp)")

    def qualified(self, proto: int | None, fams: tuple[int, ...] | None) -> Node:
        direction = self.direction()
        if proto is None and _is_value(self.peek() or ""):  # pcap: "dst 10.0.0.1" is a host
            return self.value("host", direction, None, fams)
        kind = self.take()
        if kind not in ("host", "net", "port"):
            raise self.refuse(kind)
        if kind != "port" and proto is not None:
            raise FilterError(f"'{self.text}': only ports may follow tcp or udp")
        if kind == "port" and fams is not None:
            raise FilterError(f"'{self.text}': labctl follow takes 'port' without ip, ip6 or arp before it")
        return self.value(kind, direction, proto, fams)

    def value(self, kind: str, direction: str, proto: int | None, fams: tuple[int, ...] | None) -> Node:
        self.last = (kind, direction, proto, fams)
        tok = self.take()
        if kind == "port":
            if not tok.isdigit() or not 0 <= int(tok) <= 65535:
                raise FilterError(f"'{self.text}': '{tok}' is not a port number (labctl follow takes numbers)")
            return Port(direction, int(tok), proto)
        if kind == "net":
            return self.net(tok, direction, fams)
        try:
            addr = ipaddress.ip_address(tok)
        except ValueError:
            raise FilterError(f"'{self.text}': '{tok}' is not an IPv4 or IPv6 address (labctl follow takes "
                              "addresses, not host names)") from None
        return Host(direction, int(addr), self.families(addr.version, fams, tok))

    def families(self, version: int, fams: tuple[int, ...] | None, tok: str) -> tuple[int, ...]:
        """The families an address of IP ``version`` stands for, under the qualifier ``fams``."""
        own = (6,) if version == 6 else (4, ARP)
        if fams is None:
            return own
        if not set(fams) <= set(own):
            raise FilterError(f"'{self.text}': '{tok}' is an IPv{version} address, not one of "
                              f"{'ip6' if fams == (6,) else 'ip or arp'}")
        return fams

    def net(self, tok: str, direction: str, fams: tuple[int, ...] | None) -> Node:
        n: ipaddress.IPv4Network | ipaddress.IPv6Network
        try:
            if ":" in tok:
                n = ipaddress.IPv6Network(tok if "/" in tok else f"{tok}/128", strict=False)
            elif "/" in tok:
                n = ipaddress.IPv4Network(tok, strict=False)
            elif self.peek() == "mask":
                self.take()
                n = ipaddress.IPv4Network(f"{tok}/{self.take()}", strict=False)
            else:
                octets = tok.split(".")
                if not 1 <= len(octets) <= 4:
                    raise ValueError(tok)
                n = ipaddress.IPv4Network(".".join(octets + ["0"] * (4 - len(octets))) + f"/{8 * len(octets)}")
        except ValueError:
            raise FilterError(f"'{self.text}': '{tok}' is not an IPv4 or IPv6 network") from None
        return Net(direction, int(n.network_address), n.prefixlen, self.families(n.version, fams, tok))


def _is_value(tok: str) -> bool:
    return bool(re.fullmatch(r"[0-9][0-9./]*", tok)) or (
        ":" in tok and bool(re.fullmatch(r"[0-9A-Fa-f:.]+(/[0-9]+)?", tok)))


def parse(text: str) -> Node:
    """The filter ``text`` as a tree (the empty filter: every IPv4, IPv6 and ARP packet).

    :raise FilterError: on a syntax error, a primitive labctl does not follow by, or a filter that
        starts with ``-`` (:func:`refuse_options`), and on one no packet can match (``icmp and ip6``).
    """
    refuse_options(text)
    tokens = tokenize(text)
    if not tokens:
        return Everything()
    p = _Parser(text, tokens)
    node = p.expr()
    if p.peek() is not None:
        raise FilterError(f"'{text}': unexpected '{p.peek()}'")
    vlan_of(node, text)
    if not families(node):
        raise FilterError(f"'{text}': matches no IPv4, IPv6 or ARP packet")
    return node


def tokenize(text: str) -> list[str]:
    """The filter's words and operators (``&&``, ``(``, ``host``, ``10.0.0.1``...)."""
    return [m.group(1) for m in _TOKEN.finditer(text)]


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
