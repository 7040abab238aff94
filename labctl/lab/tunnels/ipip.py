"""IP in IP: IPv4 in IPv4 (``ipip``), or IPv6 or IPv4 in IPv6 (``ip6tnl``), to one remote.

::

    tun0: {type: ipip, remote: 10.2.0.2, ip: 192.168.8.1/30}
    tun6: {type: ip6tnl, remote: "fd00:2::2", mode: ip6ip6, ip: "fd00:99::1/64"}   # mode: ipip6, any
"""

from __future__ import annotations

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker, did_you_mean, join
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.tunnels.framing import Framing, Site
from labctl.lab.yamlpos import YamlMap

MODES = ("ip6ip6", "ipip6", "any")
# ipip: the inner IPv4 header right after the outer one (protocol 4; IPv4 only, no IPv6 inside); ip_tunnel_xmit (at the inner
# header; shared with GRE: its 4th argument is the outer protocol) pushes the outer header, ipip_rcv
# (ipip's: sit has one too; at the inner header) is handed the packet. ip6tnl: an outer IPv6
# header, not followed on the wire.
FRAMING = Framing("ipip", "IPIP", 4, 0, Site("ip_tunnel_xmit", "%di", 0, proto="%cx"), Site("ipip:ipip_rcv", "%di", 0))


class IpInIp(Kind):
    required = ("remote",)

    def __init__(self, name: str, version: int) -> None:
        self.name, self.version = name, version
        self.keys = ("remote", "local", "ttl", "dev") + (("mode",) if version == 6 else ())
        self.framings = (FRAMING,) if version == 4 else ()

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
