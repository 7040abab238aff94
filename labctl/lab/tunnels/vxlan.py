"""VXLAN: Ethernet over UDP (RFC 7348), a 24-bit VNI, to one remote or a multicast group.

::

    vx0: {type: vxlan, vni: 42, remote: 10.2.0.2, dev: eth1, ip: 192.168.42.1/24}   # dstport: 4789, local
"""

from __future__ import annotations

import dataclasses

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.tunnels.framing import LAYER2, Framing, Site
from labctl.lab.yamlpos import YamlMap

MAX_VNI = 2**24 - 1
DSTPORT = 4789  # IANA's; the kernel's default is 8472 (Linux's before IANA's)
UDP = 8
# the 8-byte VXLAN header (flags 0x08: a VNI; the VNI's 24 bits, a reserved byte) after the UDP one,
# then the inner Ethernet header; pushed before udp_tunnel_xmit_skb pushes the UDP header (the skb its
# 3rd argument), taken off by vxlan_rcv (at the UDP header); the inner frame's EtherType says its packet's family
FRAMING = Framing("vx", "VXLAN", 17, UDP + 8 + 14, Site("udp_tunnel_xmit_skb", "%dx", -UDP), Site("vxlan_rcv", "%si", 0),
                  word=0x08000000, word_at=UDP, ident="vni", ident_at=UDP + 4, port_key="dstport", port=DSTPORT,
                  proto_at=UDP + 8 + 12, families=LAYER2)
# over IPv6 (a remote or group of IPv6): the same headers after an outer IPv6 one, pushed by udp_tunnel6_xmit_skb
FRAMING6 = dataclasses.replace(FRAMING, tag="vx6", encap=Site("udp_tunnel6_xmit_skb", "%dx", -UDP), outer=6)


def outer_family(t: Tunnel, *keys: str) -> int:
    """6 when the first of ``t``'s options ``keys`` that it has is an IPv6 address, else 4."""
    addr = next((str(t.opt(k)) for k in keys if t.opt(k) is not None), "")
    return 6 if ":" in addr else 4


class Vxlan(Kind):
    name = "vxlan"
    keys = ("vni", "remote", "group", "local", "dstport", "dev", "ttl", "learning")
    required = ("vni",)
    layer2 = True
    framings = (FRAMING, FRAMING6)

    def framing(self, t: Tunnel) -> Framing:
        return FRAMING6 if outer_family(t, "remote", "group", "local") == 6 else FRAMING

    def options(self, check: Checker, m: YamlMap, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        o.put(out, "vni", o.integer(check, m, "vni", path, 0, MAX_VNI))
        if ("remote" in m) == ("group" in m):
            check.add(m.line, path, "a vxlan tunnel needs a remote or a group (one of them)")
        o.put(out, "remote", o.address(check, m, "remote", path))
        o.put(out, "group", o.address(check, m, "group", path, multicast=True))
        o.put(out, "local", o.address(check, m, "local", path))
        o.put(out, "dstport", o.port(check, m, "dstport", path) or DSTPORT)
        o.put(out, "dev", o.interface(check, m, "dev", path))
        o.put(out, "ttl", o.integer(check, m, "ttl", path, 1, 255))
        if check.boolean(m, "learning", path) is False:  # the kernel's default is to learn
            out["learning"] = "off"
        if "group" in m and "dev" not in m:
            check.add(m.line, path, "a vxlan tunnel to a multicast group needs the device it is on (dev)")
        return out

    def link(self, t: Tunnel) -> list[str]:
        argv = ["ip", "link", "add", t.name, "type", "vxlan", "id", str(t.opt("vni")),
                "dstport", str(t.opt("dstport") or DSTPORT)]
        for key in ("remote", "group", "local", "dev", "ttl"):
            if t.opt(key) is not None:
                argv += [key, str(t.opt(key))]
        if t.opt("learning") == "off":  # the remote stays the only end: a NAT between the ends cannot move it
            argv.append("nolearning")
        return argv

    def describe(self, t: Tunnel) -> str:
        to = f"to {t.opt('remote')}" if t.opt("remote") else f"group {t.opt('group')}"
        return (f"vxlan {t.opt('vni')} {to}:{t.opt('dstport') or DSTPORT}"
                + (f" via {t.opt('dev')}" if t.opt("dev") else "") + (", no learning" if t.opt("learning") else ""))


KIND = Vxlan()
