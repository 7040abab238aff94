"""GRE: IP over IP with a GRE header (``gre``), or Ethernet over it (``gretap``), to one remote.

::

    gre1: {type: gre, remote: 10.2.0.2, local: 10.1.0.2, ip: 192.168.9.1/30}   # key: 5, ttl: 64
    tap1: {type: gretap, remote: 10.2.0.2, key: 5, csum: true, seq: true}      # checksums, sequence numbers
"""

from __future__ import annotations

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.tunnels.framing import ETHERTYPES, LAYER2, LAYER3, Framing, Site
from labctl.lab.yamlpos import YamlMap

# the GRE header (RFC 2890): flags and version, the protocol (0x0800: IPv4, 0x86DD: IPv6, 0x6558:
# Ethernet, then the inner frame's EtherType says its family), then
# a word for each flag set, in this order: the checksum (C, ``csum``), the key (K, ``key``) and the
# sequence number (S, ``seq``); both ends of a lab's tunnel send and expect the same ones. Pushed
# before ip_tunnel_xmit (shared with ipip: its 4th argument is the outer protocol, 47), taken off
# after ip_gre's gre_rcv (at the GRE header; gre_demux has a gre_rcv too)
CSUM_FLAG, KEY_FLAG, SEQ_FLAG = 0x8000, 0x2000, 0x1000
ENCAP = Site("ip_tunnel_xmit", "%di", 0, proto="%cx")
DECAP = Site("ip_gre:gre_rcv", "%di", 0)
LAYOUTS = [(c, k, s) for c in (False, True) for k in (False, True) for s in (False, True)]
"""Every header a lab's GRE tunnel can send: (checksum, key, sequence number)."""


def _framing(tag: str, layer2: bool, csum: bool, key: bool, seq: bool) -> Framing:
    flags = (CSUM_FLAG if csum else 0) | (KEY_FLAG if key else 0) | (SEQ_FLAG if seq else 0)
    word = flags << 16 | (0x6558 if layer2 else ETHERTYPES[4])  # an inner IPv6 packet's: Framing.word_for
    header = 4 * (1 + csum + key + seq)
    return Framing(tag + "c" * csum + "k" * key + "s" * seq, "GRE", 47, header + (14 if layer2 else 0), ENCAP, DECAP,
                   word=word, ident="key" if key else "", ident_at=4 + 4 * csum, seq_at=header - 4 if seq else 0,
                   csum=csum, proto_at=header + 12 if layer2 else 2, families=LAYER2 if layer2 else LAYER3)


class Gre(Kind):
    keys = ("remote", "local", "key", "csum", "seq", "ttl", "dev")
    required = ("remote",)

    def __init__(self, name: str, layer2: bool) -> None:
        self.name, self.layer2 = name, layer2
        tag = "gtap" if layer2 else "gre"
        self.framings = tuple(_framing(tag, layer2, c, k, s) for c, k, s in LAYOUTS)

    def framing(self, t: Tunnel) -> Framing:
        """The layout of ``t``'s GRE header: with a checksum, its key, sequence numbers, or without."""
        layout = (t.opt("csum") == "yes", t.opt("key") is not None, t.opt("seq") == "yes")
        return self.framings[LAYOUTS.index(layout)]

    def options(self, check: Checker, m: YamlMap, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        o.put(out, "remote", o.address(check, m, "remote", path, 4))
        o.put(out, "local", o.address(check, m, "local", path, 4))
        o.put(out, "key", o.integer(check, m, "key", path, 0, 2**32 - 1))
        for flag in ("csum", "seq"):  # kept only when true: a tunnel without them is as before
            if check.boolean(m, flag, path):
                out[flag] = "yes"
        o.put(out, "ttl", o.integer(check, m, "ttl", path, 1, 255))
        o.put(out, "dev", o.interface(check, m, "dev", path))
        return out

    def link(self, t: Tunnel) -> list[str]:
        argv = ["ip", "link", "add", t.name, "type", self.name, "remote", str(t.opt("remote"))]
        for key in ("local", "key", "ttl", "dev"):
            if t.opt(key) is not None:
                argv += [key, str(t.opt(key))]
        return argv + [flag for flag in ("csum", "seq") if t.opt(flag) == "yes"]  # sent and required both ways

    def describe(self, t: Tunnel) -> str:
        return (f"{self.name} to {t.opt('remote')}" + (f" from {t.opt('local')}" if t.opt("local") else "")
                + (f" key {t.opt('key')}" if t.opt("key") else "")
                + "".join(f" {flag}" for flag in ("csum", "seq") if t.opt(flag) == "yes"))


GRE = Gre("gre", layer2=False)
GRETAP = Gre("gretap", layer2=True)
