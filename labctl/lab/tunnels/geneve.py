"""Geneve: Ethernet over UDP (RFC 8926), a 24-bit VNI, to one remote.

::

    gnv0: {type: geneve, vni: 7, remote: 10.2.0.2, ip: 192.168.7.1/24}   # dstport: 6081
"""

from __future__ import annotations

import dataclasses

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.tunnels.framing import LAYER2, Framing, Site
from labctl.lab.tunnels.vxlan import MAX_VNI, UDP, outer_family
from labctl.lab.yamlpos import YamlMap

DSTPORT = 6081
# the Geneve header (version and options length, flags, protocol 0x6558: Ethernet; the VNI's 24 bits,
# a reserved byte), 8 bytes with no options (Linux's geneve device sends none), after the UDP header,
# then the inner Ethernet one; udp_tunnel_xmit_skb pushes the UDP header, geneve_udp_encap_recv (at
# the UDP header) takes both off. A packet with options is not matched (its first word differs); the inner frame's
# EtherType says its packet's family.
FRAMING = Framing("gnv", "Geneve", 17, UDP + 8 + 14, Site("udp_tunnel_xmit_skb", "%dx", -UDP),
                  Site("geneve_udp_encap_recv", "%si", 0), word=0x00006558, word_at=UDP, ident="vni",
                  ident_at=UDP + 4, port_key="dstport", port=DSTPORT, proto_at=UDP + 8 + 12, families=LAYER2)
FRAMING6 = dataclasses.replace(FRAMING, tag="gnv6", encap=Site("udp_tunnel6_xmit_skb", "%dx", -UDP), outer=6)  # to an IPv6 remote


class Geneve(Kind):
    name = "geneve"
    keys = ("vni", "remote", "dstport", "ttl")
    required = ("vni", "remote")
    layer2 = True
    framings = (FRAMING, FRAMING6)

    def framing(self, t: Tunnel) -> Framing:
        return FRAMING6 if outer_family(t, "remote") == 6 else FRAMING

    def options(self, check: Checker, m: YamlMap, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        o.put(out, "vni", o.integer(check, m, "vni", path, 0, MAX_VNI))
        o.put(out, "remote", o.address(check, m, "remote", path))
        o.put(out, "dstport", o.port(check, m, "dstport", path) or DSTPORT)
        o.put(out, "ttl", o.integer(check, m, "ttl", path, 1, 255))
        return out

    def link(self, t: Tunnel) -> list[str]:
        argv = ["ip", "link", "add", t.name, "type", "geneve", "id", str(t.opt("vni")),
                "remote", str(t.opt("remote")), "dstport", str(t.opt("dstport") or DSTPORT)]
        return argv + (["ttl", str(t.opt("ttl"))] if t.opt("ttl") else [])

    def describe(self, t: Tunnel) -> str:
        return f"geneve {t.opt('vni')} to {t.opt('remote')}:{t.opt('dstport') or DSTPORT}"


KIND = Geneve()
