"""A guest's interfaces, routes and sysctls as ``labctl status`` shows them (rows of its table, lines
under it), from the guest's live status (:func:`labctl.up.guest_statuses`) and its resolved lab."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.lab import guest_interfaces, settings_text


def offload_lines(guest: str, nics: list[dict[str, Any]]) -> list[str]:
    """``r eth1 VLAN offloads: rx-vlan-offload off [fixed], ...`` for each NIC whose guest said them."""
    return [f"{guest} {n.get('name')} VLAN offloads: " + ", ".join(f"{k} {v}" for k, v in n["vlan_offloads"].items())
            for n in nics if isinstance(n.get("vlan_offloads"), Mapping) and n["vlan_offloads"]]


def iface_rows(guest: Mapping[str, Any], nics: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str, str]]:
    """(interface, model or what it is, driver, addresses one a line, network, NIC name for its marks)
    for every lab interface of a guest: each NIC (its driver from ``nics``, the live status's), its
    VLANs, then its bonds and bridges with theirs."""
    live = {str(n.get("name")): n for n in nics}
    rows = []
    for v in guest_interfaces({**guest, "nics": nics or guest.get("nics") or []}):
        if v.kind == "nic":
            driver = str(live.get(v.name, {}).get("driver") or "")
            rows.append((v.name, v.detail, driver, v.address_text.replace(", ", "\n"), v.network, v.name))
        else:
            driver = {"vlan": "8021q", "bond": "bonding", "bridge": "bridge", "vrf": "vrf"}.get(v.kind) or v.detail.split()[0]
            rows.append((v.name, v.detail, driver, v.address_text.replace(", ", "\n"), v.network, ""))
    return rows


def settings_lines(guest: str, resolved: Mapping[str, Any]) -> list[str]:
    """``r routes: default via 10.1.0.254; ...`` and ``r sysctls: net.ipv4.ip_forward=1, ...``."""
    return [f"{guest} {line}" for line in settings_text(resolved)]
