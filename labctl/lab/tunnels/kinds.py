"""The tunnel kinds, in one table: a new kind is one module of this package and one line here."""

from __future__ import annotations

from labctl.lab.tunnels import geneve, gre, ipip, vxlan, wireguard
from labctl.lab.tunnels.model import Kind

__all__ = ["KINDS"]

KINDS: dict[str, Kind] = {k.name: k for k in (
    vxlan.KIND,
    geneve.KIND,
    gre.GRE,
    gre.GRETAP,
    ipip.IPIP,
    ipip.IP6TNL,
    wireguard.KIND,
)}
