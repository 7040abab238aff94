"""GRE: IP over IP with a GRE header (``gre``), or Ethernet over it (``gretap``), to one remote.

::

    gre1: {type: gre, remote: 10.2.0.2, local: 10.1.0.2, ip: 192.168.9.1/30}   # key: 5, ttl: 64
"""

from __future__ import annotations

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.tunnels.framing import Framing, Site
from labctl.lab.yamlpos import YamlMap

# the GRE header (RFC 2890): flags and version, the protocol (0x0800: IPv4, 0x6558: Ethernet), then
# the key when the K flag says so (a lab's tunnel has one when it gives ``key``; a checksum or sequence
# numbers, which a lab file cannot ask for, would come before and after it); pushed before
# ip_tunnel_xmit (shared with ipip: its 4th argument is the outer protocol, 47), taken off after
# ip_gre's gre_rcv (at the GRE header; gre_demux has a gre_rcv too)
KEY_FLAG = 0x2000
ENCAP = Site("ip_tunnel_xmit", "%di", 0, proto="%cx")
DECAP = Site("ip_gre:gre_rcv", "%di", 0)


def _framing(tag: str, layer2: bool, key: bool) -> Framing:
    word = (KEY_FLAG if key else 0) << 16 | (0x6558 if layer2 else 0x0800)
    return Framing(tag + ("k" if key else ""), "GRE", 47, (8 if key else 4) + (14 if layer2 else 0), ENCAP, DECAP,
                   word=word, ident="key" if key else "", ident_at=4)


class Gre(Kind):
    keys = ("remote", "local", "key", "ttl", "dev")
    required = ("remote",)

    def __init__(self, name: str, layer2: bool) -> None:
        self.name, self.layer2 = name, layer2
        tag = "gtap" if layer2 else "gre"
        self.framings = (_framing(tag, layer2, key=False), _framing(tag, layer2, key=True))

    def framing(self, t: Tunnel) -> Framing:
        """The layout of ``t``'s GRE header: with its key, or without."""
        return self.framings[t.opt("key") is not None]

    def options(self, check: Checker, m: YamlMap, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        o.put(out, "remote", o.address(check, m, "remote", path, 4))
        o.put(out, "local", o.address(check, m, "local", path, 4))
        o.put(out, "key", o.integer(check, m, "key", path, 0, 2**32 - 1))
        o.put(out, "ttl", o.integer(check, m, "ttl", path, 1, 255))
        o.put(out, "dev", o.interface(check, m, "dev", path))
        return out

    def link(self, t: Tunnel) -> list[str]:
        argv = ["ip", "link", "add", t.name, "type", self.name, "remote", str(t.opt("remote"))]
        for key in ("local", "key", "ttl", "dev"):
            if t.opt(key) is not None:
                argv += [key, str(t.opt(key))]
        return argv

    def describe(self, t: Tunnel) -> str:
        return (f"{self.name} to {t.opt('remote')}" + (f" from {t.opt('local')}" if t.opt("local") else "")
                + (f" key {t.opt('key')}" if t.opt("key") else ""))


GRE = Gre("gre", layer2=False)
GRETAP = Gre("gretap", layer2=True)
