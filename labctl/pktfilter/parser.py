"""pcap-filter text into a :mod:`.tree` (:func:`parse`, :func:`tokenize`): the subset in the package's
docstring, a clear error for each primitive outside it."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from labctl.pktfilter.tree import (
    ARP,
    And,
    Everything,
    Family,
    FilterError,
    Host,
    Net,
    Node,
    Not,
    Or,
    Port,
    Proto,
    Vlan,
    families,
    refuse_options,
    vlan_of,
)

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

