"""A guest's interfaces and network settings as people are shown them (``status``, ``graph``, the
report, ``compare``, a handout): its NICs, VLANs, bonds and bridges (:mod:`.ifaces`), then its
tunnels and VRFs (:mod:`.tunnels.views`, loaded only for a guest that has some, so that ``status``
of a lab without tunnels does not load the tunnels' checkers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.lab.ifaces import IfaceView, NetSettings, net_settings_text, nic_interfaces
from labctl.lab.ifaces import net_settings as _settings_of


def _has_tunnels(guest: Mapping[str, Any]) -> bool:
    return bool(guest.get("tunnels") or guest.get("vrfs"))


def guest_interfaces(guest: Mapping[str, Any]) -> list[IfaceView]:
    """Every lab interface of a guest (``Guest.to_dict()``): each NIC followed by its VLANs, then
    each bond and each bridge followed by theirs, then its tunnels and VRFs."""
    out = nic_interfaces(guest)
    if _has_tunnels(guest):
        from labctl.lab.tunnels.views import views

        out += views(guest)
    return out


def settings_text(guest: Mapping[str, Any]) -> list[str]:
    """A guest's routes, sysctls, VRF routes and firewall as lines (:func:`.ifaces.net_settings_text`)."""
    more: list[str] = []
    if _has_tunnels(guest):
        from labctl.lab.tunnels.views import settings_lines

        more = settings_lines(guest)
    return net_settings_text(guest, more)


def net_settings(guest: Mapping[str, Any]) -> NetSettings:
    """What a guest's network settings are, for comparing two runs (:func:`.ifaces.net_settings` of
    every interface)."""
    return _settings_of(guest, guest_interfaces(guest))
