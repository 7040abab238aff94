"""The tunnel kinds, in one table: a new kind is one module of this package and one line here."""

from __future__ import annotations

import labctl.lab.tunnels.geneve as geneve  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.lab.tunnels.gre as gre  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.lab.tunnels.ipip as ipip  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.lab.tunnels.vxlan as vxlan  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.lab.tunnels.wireguard as wireguard  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.lab.tunnels.devices import Kind

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
