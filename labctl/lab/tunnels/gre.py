"""GRE: IP over IP with a GRE header (``gre``), or Ethernet over it (``gretap``), to one remote.

::

    gre1: {type: gre, remote: 10.2.0.2, local: 10.1.0.2, ip: 192.168.9.1/30}   # key: 5, ttl: 64
"""

from __future__ import annotations

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.yamlpos import YamlMap


class Gre(Kind):
    keys = ("remote", "local", "key", "ttl", "dev")
    required = ("remote",)

    def __init__(self, name: str, layer2: bool) -> None:
        self.name, self.layer2 = name, layer2

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
