"""Tunnels and VRFs of a guest: the model (:mod:`.devices`), one module per tunnel kind (:mod:`.vxlan`,
:mod:`.geneve`, :mod:`.gre`, :mod:`.ipip`, :mod:`.wireguard`) listed in one table (:mod:`.known`),
their options' shared checks (:mod:`.fields`), how each kind's packets are carried, for following
them on the wire (:mod:`.framing`), the lab file's sections (:mod:`.parse`, imported by
the validator itself) and how people are shown them (:mod:`.views`, added to the interfaces'
views by :mod:`labctl.lab`'s face).

Imports never: labctl.up, labctl.follow, labctl.trace, labctl.cli
"""

from __future__ import annotations

from labctl.lab.tunnels.devices import COMMON_KEYS, Kind, Tunnel, Vrf
from labctl.lab.tunnels.framing import ETHERTYPES, Framing, Site
from labctl.lab.tunnels.known import KINDS

__all__ = ["COMMON_KEYS", "ETHERTYPES", "KINDS", "Framing", "Kind", "Site", "Tunnel", "Vrf"]
