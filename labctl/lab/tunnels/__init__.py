"""Tunnels and VRFs of a guest: the model (:mod:`.model`), one module per tunnel kind (:mod:`.vxlan`,
:mod:`.geneve`, :mod:`.gre`, :mod:`.ipip`, :mod:`.wireguard`) listed in one table (:mod:`.kinds`),
their options' shared checks (:mod:`.options`) and the lab file's sections (:mod:`.parse`, imported
by the validator itself: it needs :mod:`labctl.lab.netconf`, which needs this face).

Imports never: labctl.up, labctl.follow, labctl.trace, labctl.cli
"""

from __future__ import annotations

from labctl.lab.tunnels.kinds import KINDS
from labctl.lab.tunnels.model import COMMON_KEYS, Kind, Tunnel, Vrf

__all__ = ["COMMON_KEYS", "KINDS", "Kind", "Tunnel", "Vrf"]
