"""A guest's tunnels and VRFs as people are shown them (``status``, ``graph``, the report, ``compare``),
from ``Guest.to_dict()``'s form (a lab's state, a bundle's manifest; none in an older one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.lab.ifaces import IfaceView, Route
from labctl.lab.tunnels.devices import Tunnel, TunnelRecord, Vrf, VrfRecord
from labctl.lab.tunnels.known import KINDS

__all__ = ["settings_lines", "summary_lines", "views"]


def _tunnels(guest: Mapping[str, Any]) -> list[Tunnel]:
    recorded: list[TunnelRecord] = guest.get("tunnels") or []
    return [Tunnel.from_dict(t) for t in recorded if isinstance(t, Mapping) and t.get("type") in KINDS]


def _vrfs(guest: Mapping[str, Any]) -> list[Vrf]:
    recorded: list[VrfRecord] = guest.get("vrfs") or []
    return [Vrf.from_dict(v) for v in recorded if isinstance(v, Mapping)]


def views(guest: Mapping[str, Any]) -> list[IfaceView]:
    """Each tunnel (kind ``tunnel``, what it is as detail, ``network``: the device under it) and each
    VRF (kind ``vrf``) of the guest."""
    out = [IfaceView(t.name, "tunnel", KINDS[t.kind].describe(t), tuple(str(a) for a in t.addresses),
                     f"over {t.opt('dev')}" if t.opt("dev") else "") for t in _tunnels(guest)]
    return out + [IfaceView(v.name, "vrf", f"vrf {v.text()}", ()) for v in _vrfs(guest)]


def summary_lines(guest: Mapping[str, Any]) -> list[str]:
    """``tunnel vx0: vxlan 42 to 10.2.0.2:4789 via eth1``, ``vrf blue: table 10 of eth2; 1 route``."""
    return ([f"tunnel {t.name}: {KINDS[t.kind].describe(t)}" for t in _tunnels(guest)]
            + [f"vrf {v.name}: {v.text()}" for v in _vrfs(guest)])


def _route(r: Route) -> str:
    return r.text()


def settings_lines(guest: Mapping[str, Any]) -> list[str]:
    """``vrf blue routes: 10.7.0.0/24 via 10.3.0.1`` for each VRF with routes."""
    return [f"vrf {v.name} routes: " + "; ".join(_route(r) for r in v.routes) for v in _vrfs(guest) if v.routes]
