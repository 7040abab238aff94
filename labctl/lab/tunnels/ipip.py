"""IP in IP: IPv4 in IPv4 (``ipip``), or IPv6 or IPv4 in IPv6 (``ip6tnl``), to one remote.

::

    tun0: {type: ipip, remote: 10.2.0.2, ip: 192.168.8.1/30}
    tun6: {type: ip6tnl, remote: "fd00:2::2", mode: ip6ip6, ip: "fd00:99::1/64"}   # mode: ipip6, any
"""

from __future__ import annotations

import dataclasses

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker, did_you_mean, join
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.tunnels.framing import Framing, Site
from labctl.lab.yamlpos import YamlMap

MODES = ("ip6ip6", "ipip6", "any")
# ipip: the inner IPv4 header right after the outer one (protocol 4; IPv4 only, no IPv6 inside); ip_tunnel_xmit (at the inner
# header; shared with GRE: its 4th argument is the outer protocol) pushes the outer header, ipip_rcv
# (ipip's: sit has one too; at the inner header) is handed the packet.
FRAMING = Framing("ipip", "IPIP", 4, 0, Site("ip_tunnel_xmit", "%di", 0, proto="%cx"), Site("ipip:ipip_rcv", "%di", 0))
# ip6tnl: an outer IPv6 header, then the tunnel encapsulation limit the kernel puts in by default
# (RFC 2473's, encaplimit 4: a destination options header of 8 bytes, next header 60), then the inner
# IPv4 or IPv6 header. The options header's first 32 bits are the inner protocol (4 or 41), its length
# (0), the option's type (4) and length (1): each layout's guard. ip6_tnl_xmit pushes the headers and
# hands the packet to ip6_local_out (the outer header at skb->data there, the encapsulation's site:
# ip6tunnel_xmit between them is inline); ip4ip6_rcv and ip6ip6_rcv (at the inner header) are handed it.
# A tunnel with encaplimit none (its outer next header the inner protocol) is not matched.
DEST_OPTS = 60
FRAMING_4IN6 = Framing("ip4in6", "IPIP6", DEST_OPTS, 8, Site("ip6_local_out", "%dx", 40),
                       Site("ip6_tunnel:ip4ip6_rcv", "%di", -8), word=4 << 24 | 0x0401, outer=6)
FRAMING_6IN6 = dataclasses.replace(FRAMING_4IN6, tag="ip6in6", title="IP6IP6", word=41 << 24 | 0x0401,
                                   decap=Site("ip6_tunnel:ip6ip6_rcv", "%di", -8), families=(6,))
BY_MODE = {"ipip6": (FRAMING_4IN6,), "ip6ip6": (FRAMING_6IN6,), "any": (FRAMING_4IN6, FRAMING_6IN6)}


class IpInIp(Kind):
    def __init__(self, name: str, version: int) -> None:
        self.name, self.version = name, version
        self.keys = ("remote", "local", "ttl", "dev") + (("mode",) if version == 6 else ())
        # ip6tnl's local too: without a local address the kernel's has no transmit capability (ip6_tnl_get_cap)
        self.required = ("remote", "local") if version == 6 else ("remote",)
        self.framings = (FRAMING,) if version == 4 else (FRAMING_4IN6, FRAMING_6IN6)

    def options(self, check: Checker, m: YamlMap, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        o.put(out, "remote", o.address(check, m, "remote", path, self.version))
        o.put(out, "local", o.address(check, m, "local", path, self.version))
        o.put(out, "ttl", o.integer(check, m, "ttl", path, 1, 255))
        o.put(out, "dev", o.interface(check, m, "dev", path))
        mode = check.string(m, "mode", path) if self.version == 6 else None
        if mode is not None and mode not in MODES:
            check.add(m.value_line("mode"), join(path, "mode"),
                      f"unknown ip6tnl mode '{mode}'{did_you_mean(mode, MODES, 'modes')}")
            mode = None
        o.put(out, "mode", mode)
        return out

    def framing(self, t: Tunnel) -> Framing | None:
        return self.framings_of(t)[0]

    def framings_of(self, t: Tunnel) -> tuple[Framing, ...]:
        """ip6tnl's mode says what it carries: IPv4 (``ipip6``), IPv6 (``ip6ip6``), both (``any``, the kernel's default)."""
        return (FRAMING,) if self.version == 4 else BY_MODE[str(t.opt("mode") or "any")]

    def link(self, t: Tunnel) -> list[str]:
        argv = ["ip", "link", "add", t.name, "type", self.name]
        for key in ("mode", "remote", "local", "ttl", "dev"):
            if t.opt(key) is not None:
                argv += [key, str(t.opt(key))]
        return argv

    def describe(self, t: Tunnel) -> str:
        mode = f" ({t.opt('mode')})" if t.opt("mode") else ""
        return f"{self.name}{mode} to {t.opt('remote')}" + (f" from {t.opt('local')}" if t.opt("local") else "")


IPIP = IpInIp("ipip", 4)
IP6TNL = IpInIp("ip6tnl", 6)
