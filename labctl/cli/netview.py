"""A guest's interfaces, routes and sysctls as ``labctl status`` shows them (rows of its table, lines
under it), from the guest's live status (:func:`labctl.up.guest_statuses`) and its resolved lab."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.lab import guest_interfaces, settings_text

_SHORT = {"rx-vlan-offload": "rx", "tx-vlan-offload": "tx", "rx-vlan-filter": "filter"}


def offload_text(features: Mapping[str, Any]) -> str:
    """``vlan offload rx on, tx on (fixed), filter on (fixed)`` ('' when unknown)."""
    parts = [f"{_SHORT.get(k, k)} {str(v).replace(' [fixed]', ' (fixed)')}" for k, v in features.items()]
    return "vlan offload " + ", ".join(parts) if parts else ""


def iface_rows(guest: Mapping[str, Any], nics: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str, str]]:
    """(interface, model or what it is, driver, addresses, network, NIC name for its marks) for every
    lab interface of a guest: each NIC (its driver and VLAN offloads from ``nics``, the live
    status's), its VLANs, then its bonds and bridges with theirs."""
    live = {str(n.get("name")): n for n in nics}
    rows = []
    for v in guest_interfaces({**guest, "nics": nics or guest.get("nics") or []}):
        if v.kind == "nic":
            n = live.get(v.name, {})
            driver = " · ".join(t for t in (str(n.get("driver") or ""), offload_text(n.get("vlan_offloads") or {})) if t)
            rows.append((v.name, v.detail, driver, v.address_text, v.network, v.name))
        else:
            driver = {"vlan": "8021q", "bond": "bonding", "bridge": "bridge"}[v.kind]
            rows.append((v.name, v.detail, driver, v.address_text, v.network, ""))
    return rows


def settings_lines(guest: str, resolved: Mapping[str, Any]) -> list[str]:
    """``r routes: default via 10.1.0.254; ...`` and ``r sysctls: net.ipv4.ip_forward=1, ...``."""
    return [f"{guest} {line}" for line in settings_text(resolved)]
