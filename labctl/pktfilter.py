"""The subset of pcap-filter syntax (``tcpdump``'s) that labctl follows packets by, for IPv4.

:func:`parse` turns a filter into a small tree; the tree is evaluated on a packet's header fields on
the host (:meth:`Node.match`) and translated into the kernel's own event filter (ftrace's filter
grammar) over the fields the follow probes fetch (:func:`kernel_filter`), so that only matching
packets are recorded in the guests. The caller checks the text with libpcap first (``tcpdump -d``);
this parser then says clearly which primitives it does not follow.

Supported::

    [src|dst|src or dst|src and dst] host ADDR
    [src|dst|...] net ADDR/LEN | net ADDR mask MASK | net 10.1      (a dotted prefix: 10.1 = /16)
    [tcp|udp] [src|dst|...] port N
    icmp | tcp | udp | ip | ip proto N|icmp|tcp|udp | proto N
    and, or, not (also &&, ||, !), parentheses; a bare value after and/or repeats the last
    primitive's qualifiers, as in pcap (``host 10.0.0.1 or 10.0.0.2``)

Byte order: the probes fetch header fields as the little-endian integers a guest's CPU reads from
network-order bytes, so an address 10.1.0.2 is ``0x0200010a`` and port 80 is ``0x5000`` there.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

PROTOS = {"icmp": 1, "tcp": 6, "udp": 17}
SUPPORTED = ("host, net, port (with src/dst, tcp/udp), icmp, tcp, udp, ip, ip proto, "
             "and/or/not with parentheses")
_UNSUPPORTED = ("ether", "arp", "rarp", "ip6", "vlan", "mpls", "portrange", "less", "greater", "len",
                "gateway", "broadcast", "multicast", "sctp", "icmp6", "igmp", "pim", "llc", "decnet", "atalk",
                "iso", "ppp", "wlan", "type", "subtype", "inbound", "outbound", "ifname", "on", "geneve", "pppoed",
                "pppoes", "link", "fddi", "tr", "ah", "esp", "vrrp", "carp", "aarp", "stp", "ipx", "netbeui",
                "lat", "sca", "moprc", "mopdl", "protochain", "ipv6", "ra", "ta", "addr1", "addr2", "addr3",
                "addr4", "dir")
_TOKEN = re.compile(r"\s*(&&|\|\||[()!]|[A-Za-z0-9_.:/\[\]+*-]+|\S)")
_DIRS = ("src", "dst")


class FilterError(ValueError):
    """A filter labctl cannot follow by (a syntax error, or a primitive outside its subset)."""


@dataclass(frozen=True)
class Packet:
    """The header fields a filter reads (addresses as integers in network order, i.e. 10.0.0.1 = 0x0a000001);
    ports are None for a packet without them (not TCP/UDP, or a later fragment)."""

    saddr: int
    daddr: int
    proto: int
    sport: int | None = None
    dport: int | None = None


class Node:
    def match(self, p: Packet) -> bool:
        raise NotImplementedError

    def kernel(self, fields: set[str]) -> str:
        """This node as an ftrace filter expression; the probe fields it reads are added to ``fields``."""
        raise NotImplementedError

    def uses_ports(self) -> bool:
        return False


@dataclass(frozen=True)
class And(Node):
    a: Node
    b: Node

    def match(self, p: Packet) -> bool:
        return self.a.match(p) and self.b.match(p)

    def kernel(self, fields: set[str]) -> str:
        return f"({self.a.kernel(fields)} && {self.b.kernel(fields)})"

    def uses_ports(self) -> bool:
        return self.a.uses_ports() or self.b.uses_ports()


@dataclass(frozen=True)
class Or(Node):
    a: Node
    b: Node

    def match(self, p: Packet) -> bool:
        return self.a.match(p) or self.b.match(p)

    def kernel(self, fields: set[str]) -> str:
        return f"({self.a.kernel(fields)} || {self.b.kernel(fields)})"

    def uses_ports(self) -> bool:
        return self.a.uses_ports() or self.b.uses_ports()


@dataclass(frozen=True)
class Not(Node):
    a: Node

    def match(self, p: Packet) -> bool:
        return not self.a.match(p)

    def kernel(self, fields: set[str]) -> str:
        return f"!({self.a.kernel(fields)})"

    def uses_ports(self) -> bool:
        return self.a.uses_ports()


@dataclass(frozen=True)
class Everything(Node):
    """The empty filter: every IPv4 packet."""

    def match(self, p: Packet) -> bool:
        return True

    def kernel(self, fields: set[str]) -> str:
        return "vi >= 69"


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


@dataclass(frozen=True)
class Host(Node):
    direction: str  # "src", "dst", "src or dst", "src and dst"
    addr: int

    def match(self, p: Packet) -> bool:
        hits = [p.saddr == self.addr if s == "s" else p.daddr == self.addr for s in _sides(self.direction)]
        return all(hits) if self.direction == "src and dst" else any(hits)

    def kernel(self, fields: set[str]) -> str:
        parts = [f"{s}addr == {_le32(self.addr):#x}" for s in _sides(self.direction)]
        return _join(parts, self.direction)


@dataclass(frozen=True)
class Net(Node):
    direction: str
    addr: int  # network order, host bits zero
    prefix: int

    @property
    def mask(self) -> int:
        return (0xFFFFFFFF << (32 - self.prefix)) & 0xFFFFFFFF if self.prefix else 0

    def match(self, p: Packet) -> bool:
        hits = [((p.saddr if s == "s" else p.daddr) & self.mask) == self.addr for s in _sides(self.direction)]
        return all(hits) if self.direction == "src and dst" else any(hits)

    def _side(self, side: str, fields: set[str]) -> str:
        """Byte by byte: whole bytes equal, the partial byte in its range (ftrace cannot mask a field)."""
        if self.prefix == 32:
            return f"{side}addr == {_le32(self.addr):#x}"
        if self.prefix == 0:
            return "vi >= 69"
        octets = self.addr.to_bytes(4, "big")
        parts = []
        for i in range(4):
            bits = min(8, max(0, self.prefix - 8 * i))
            if bits == 0:
                break
            name = f"{side}b{i}"
            fields.add(name)
            if bits == 8:
                parts.append(f"{name} == {octets[i]}")
            else:
                parts.append(f"{name} >= {octets[i]} && {name} <= {octets[i] + (1 << (8 - bits)) - 1}")
        return "(" + " && ".join(parts) + ")"

    def kernel(self, fields: set[str]) -> str:
        return _join([self._side(s, fields) for s in _sides(self.direction)], self.direction)


@dataclass(frozen=True)
class Port(Node):
    direction: str
    port: int
    proto: int | None = None  # tcp or udp only; None: either

    def match(self, p: Packet) -> bool:
        if p.proto not in ((self.proto,) if self.proto else (6, 17)):
            return False
        hits = [(p.sport if s == "s" else p.dport) == self.port for s in _sides(self.direction)]
        return all(hits) if self.direction == "src and dst" else any(hits)

    def kernel(self, fields: set[str]) -> str:
        fields.update({"sport", "dport", "fo"})
        proto = f"proto == {self.proto}" if self.proto else "(proto == 6 || proto == 17)"
        ports = _join([f"{s}port == {_le16(self.port):#x}" for s in _sides(self.direction)], self.direction)
        # the first fragment only (pcap's rule: a later fragment has no ports); ihl 5: ports where fetched
        return f"({proto} && vi == 69 && !(fo & 0xff1f) && {ports})"

    def uses_ports(self) -> bool:
        return True


@dataclass(frozen=True)
class Proto(Node):
    number: int

    def match(self, p: Packet) -> bool:
        return p.proto == self.number

    def kernel(self, fields: set[str]) -> str:
        return f"proto == {self.number}"


@dataclass
class _Parser:
    text: str
    tokens: list[str]
    pos: int = 0
    last: tuple[str, str, int | None] | None = None  # (kind, direction, proto) of the last primitive
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

    def primitive(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise FilterError(f"'{self.text}': the filter ends too early")
        low = tok.lower()
        if low in _UNSUPPORTED or "[" in tok:
            raise FilterError(f"'{self.text}': labctl follow does not follow by '{tok}' "
                              f"(it follows IPv4 packets by {SUPPORTED})")
        if low in PROTOS and self.peek(1) not in _DIRS + ("port",):
            self.take()
            return Proto(PROTOS[low])
        if low in ("tcp", "udp"):  # tcp [src|dst] port N
            self.take()
            node = self.qualified(PROTOS[low])
            if not isinstance(node, Port):
                raise FilterError(f"'{self.text}': '{tok}' must be followed by port")
            return node
        if low == "ip":
            self.take()
            if self.peek() == "proto":
                self.take()
                return Proto(self.protocol())
            if self.peek() in ("host", "net", "src", "dst"):
                return self.qualified(None)
            return Everything()
        if low == "proto":
            self.take()
            return Proto(self.protocol())
        if low in _DIRS + ("host", "net", "port"):
            return self.qualified(None)
        if self.last is not None and _is_value(tok):  # pcap: a bare value repeats the last qualifiers
            kind, direction, proto = self.last
            return self.value(kind, direction, proto)
        if _is_value(tok):
            return self.value("host", "src or dst", None)
        raise FilterError(f"'{self.text}': labctl follow does not follow by '{tok}' "
                          f"(it follows IPv4 packets by {SUPPORTED})")

    def protocol(self) -> int:
        tok = self.take()
        tok = tok.lstrip("\\")
        if tok in PROTOS:
            return PROTOS[tok]
        if tok.isdigit() and int(tok) < 256:
            return int(tok)
        raise FilterError(f"'{self.text}': unknown IP protocol '{tok}' (a number, icmp, tcp or udp)")

    def qualified(self, proto: int | None) -> Node:
        direction = self.direction()
        if proto is None and _is_value(self.peek() or ""):  # pcap: "dst 10.0.0.1" is a host
            return self.value("host", direction, None)
        kind = self.take()
        if kind not in ("host", "net", "port"):
            raise FilterError(f"'{self.text}': labctl follow does not follow by '{kind}' "
                              f"(it follows IPv4 packets by {SUPPORTED})")
        if kind != "port" and proto is not None:
            raise FilterError(f"'{self.text}': only ports may follow tcp or udp")
        return self.value(kind, direction, proto)

    def value(self, kind: str, direction: str, proto: int | None) -> Node:
        self.last = (kind, direction, proto)
        tok = self.take()
        if kind == "port":
            if not tok.isdigit() or not 0 <= int(tok) <= 65535:
                raise FilterError(f"'{self.text}': '{tok}' is not a port number (labctl follow takes numbers)")
            return Port(direction, int(tok), proto)
        if kind == "net":
            return self.net(tok, direction)
        try:
            return Host(direction, int(ipaddress.IPv4Address(tok)))
        except ValueError:
            raise FilterError(f"'{self.text}': '{tok}' is not an IPv4 address (labctl follow takes addresses, "
                              "not host names)") from None

    def net(self, tok: str, direction: str) -> Node:
        try:
            if "/" in tok:
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
            raise FilterError(f"'{self.text}': '{tok}' is not an IPv4 network") from None
        return Net(direction, int(n.network_address), n.prefixlen)


def _is_value(tok: str) -> bool:
    return bool(re.fullmatch(r"[0-9][0-9./]*", tok))


def parse(text: str) -> Node:
    """The filter ``text`` as a tree (the empty filter: every IPv4 packet).

    :raise FilterError: on a syntax error or a primitive labctl does not follow by.
    """
    tokens = [m.group(1) for m in _TOKEN.finditer(text)]
    if not tokens:
        return Everything()
    p = _Parser(text, tokens)
    node = p.expr()
    if p.peek() is not None:
        raise FilterError(f"'{text}': unexpected '{p.peek()}'")
    return node


def kernel_filter(node: Node) -> tuple[str, set[str]]:
    """The ftrace filter of ``node`` for a follow probe, and the extra fields it reads (``sb0``.. ``db3``
    for networks, ``sport``/``dport``/``fo`` for ports); every probe also has ``vi`` (IP version and
    header length), ``proto``, ``saddr`` and ``daddr``."""
    fields: set[str] = set()
    body = node.kernel(fields)
    return f"vi >= 69 && vi <= 79 && {body}", fields
