"""A guest's ``nics`` in the lab file, checked with their lines, and resolved into the model with the
guest's other network settings (:mod:`.netconf`, :mod:`.addresses`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from labctl.lab.addresses import parse_addresses
from labctl.lab.checker import Checker, describe, did_you_mean
from labctl.lab.ifaces import Bond, Bridge, Route, Sysctl, Vlan
from labctl.lab.model import Nic
from labctl.lab.netconf import iface_name, parse_vlans
from labctl.lab.netopts import nic_impairment
from labctl.lab.nics import NIC_MODELS, canonical_nic_model, suggest_nic_model
from labctl.lab.specs import GuestSpec, MasterSpec, NetSpec, NicSpec, VlanSpec
from labctl.lab.xdp import parse_tc, parse_xdp
from labctl.lab.yamlpos import YamlMap, YamlSeq

if TYPE_CHECKING:
    from labctl.lab.firewall import Firewall
    from labctl.lab.tunnels.devices import Tunnel, Vrf

MAX_NICS = 16  # lab NICs per guest: PCI slots, and what a lab can use
NIC_KEYS = ("name", "model", "network", "ip", "mac", "queues", "mtu", "impair", "vlans", "xdp", "tc")
_NIC_REQUIRED = ("name", "model", "network")
_MAC = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}")


def parse_nics(
    check: Checker, body: YamlMap, path: str, guest: str, networks: dict[str, NetSpec],
    trusted: tuple[Path, ...] = (),
) -> list[NicSpec]:
    """Check a guest's ``nics`` list, including duplicate NIC names."""
    items = check.sequence(body, "nics", path)
    if len(items) > MAX_NICS:
        check.add(body.value_line("nics"), f"{path}.nics",
                  f"{len(items)} NICs: a guest has at most {MAX_NICS} lab NICs")
        return []
    first_line: dict[str, int] = {}
    result: list[NicSpec] = []
    for index in range(len(items)):
        nic = _parse_nic(check, items, index, f"{path}.nics[{index}]", guest, networks, trusted)
        if nic is None:
            continue
        if nic.name is not None and nic.name in first_line:
            message = f"duplicate NIC name '{nic.name}' (first at line {first_line[nic.name]})"
            check.add(nic.name_line, f"{nic.path}.name", message)
        elif nic.name is not None:
            first_line[nic.name] = nic.name_line
        result.append(nic)
    return result


def _parse_nic(
    check: Checker, items: YamlSeq, index: int, path: str, guest: str,
    networks: dict[str, NetSpec], trusted: tuple[Path, ...] = (),
) -> NicSpec | None:
    """Check one NIC mapping; None if it is not a mapping."""
    line = items.item_line(index)
    m = check.mapping(items[index], line, path, allow_null=False)
    if m is None:
        return None
    check.keys(m, path, NIC_KEYS, _NIC_REQUIRED, line)
    name = _nic_name(check, m, path)
    model = _nic_model(check, m, path)
    return NicSpec(
        guest=guest, index=index, path=path, line=line,
        name=name, name_line=m.value_line("name"), model=model,
        network=_nic_network(check, m, path, networks),
        addresses=parse_addresses(check, m, path), ip_line=m.value_line("ip"),
        mac=_nic_mac(check, m, path), mac_line=m.value_line("mac"),
        queues=_nic_queues(check, m, path, model),
        mtu=check.integer(m, "mtu", path, (68, 65535)),
        impair=nic_impairment(check, m, path),
        vlans=parse_vlans(check, m, path, name),
        xdp=parse_xdp(check, m, path, model, trusted),
        tc=parse_tc(check, m, path, trusted),
    )


def _nic_queues(check: Checker, m: YamlMap, path: str, model: str | None) -> int:
    """The NIC's queue count (default 1); more than 1 needs a multiqueue model."""
    queues = check.integer(m, "queues", path, (1, 8))
    if queues is None:
        return 1
    if queues > 1 and model is not None and not NIC_MODELS[model].multiqueue:
        message = f"queues needs a multiqueue model such as virtio-net-pci ({model} is single-queue)"
        check.add(m.value_line("queues"), f"{path}.queues", message)
    return queues


def _nic_name(check: Checker, m: YamlMap, path: str) -> str | None:
    """The NIC's interface name, if valid (Linux ifname rules, not lo/mgmt0)."""
    name = check.string(m, "name", path, required=True)
    if name is None:
        return None
    return iface_name(check, name, m.value_line("name"), f"{path}.name")


def _nic_model(check: Checker, m: YamlMap, path: str) -> str | None:
    """The canonical NIC model name, if known (aliases resolved)."""
    model = check.string(m, "model", path, required=True)
    if model is None:
        return None
    canonical = canonical_nic_model(model)
    if canonical is None:
        suggestion = suggest_nic_model(model)
        hint = f" (did you mean '{suggestion}'?)" if suggestion else f" (known: {', '.join(NIC_MODELS)})"
        check.add(m.value_line("model"), f"{path}.model", f"unknown NIC model '{model}'{hint}")
    return canonical


def _nic_network(check: Checker, m: YamlMap, path: str, networks: dict[str, NetSpec]) -> str | None:
    """The NIC's network name, if it is defined under ``networks``."""
    network = check.string(m, "network", path, required=True)
    if network is None or network in networks:
        return network
    if networks:
        hint = did_you_mean(network, tuple(networks), "defined")
    else:
        hint = " (the lab defines no networks)"
    check.add(m.value_line("network"), f"{path}.network", f"unknown network '{network}'{hint}")
    return None


def _nic_mac(check: Checker, m: YamlMap, path: str) -> str | None:
    """The NIC's explicit MAC (lower case), if given and a valid unicast address.

    Uses the source text, so an unquoted MAC that YAML 1.1 read as a
    base-60 integer still works.
    """
    if m.get("mac") is None:
        return None
    line, where = m.value_line("mac"), f"{path}.mac"
    text = m.raw.get("mac")
    if text is None:
        check.add(line, where, f"expected a string, got {describe(m['mac'])}")
        return None
    if not _MAC.fullmatch(text):
        check.add(line, where, f"invalid MAC address '{text}' (expected xx:xx:xx:xx:xx:xx)")
        return None
    mac = text.lower()
    if int(mac[:2], 16) & 1:
        check.add(line, where, f"{mac} is a multicast address (the first byte must be even)")
    elif mac == "00:00:00:00:00:00":
        check.add(line, where, f"{mac} is not a usable address")
    else:
        return mac
    return None


def _vlan(v: VlanSpec) -> Vlan:
    assert v.name is not None
    return Vlan(v.id, v.name, tuple(a.address for a in v.addresses), v.line)


def resolve_nic(nic: NicSpec, network_mtu: int | None) -> Nic:
    """Final Nic object from a NIC that passed validation (its MTU, else its network's)."""
    assert nic.name is not None and nic.model is not None and nic.network is not None and nic.mac is not None
    return Nic(
        name=nic.name, model=nic.model, network=nic.network, addresses=tuple(a.address for a in nic.addresses),
        mac=nic.mac, queues=nic.queues, mtu=nic.mtu if nic.mtu is not None else network_mtu, index=nic.index,
        line=nic.line, impair=nic.impair, vlans=tuple(_vlan(v) for v in nic.vlans), ip_line=nic.ip_line,
        xdp=nic.xdp, tc=nic.tc,
    )


def _master(m: MasterSpec) -> Bond | Bridge:
    assert m.name is not None
    addresses, vlans = tuple(a.address for a in m.addresses), tuple(_vlan(v) for v in m.vlans)
    if m.kind == "bond":
        return Bond(m.name, m.mode, m.members, addresses, vlans, m.miimon, m.primary, m.line)
    return Bridge(m.name, m.members, addresses, vlans, m.line)


class GuestSettings(TypedDict):
    """:func:`resolve_settings`: a guest's network settings, the :class:`~labctl.lab.model.Guest` keywords."""

    bonds: tuple[Bond, ...]
    bridges: tuple[Bridge, ...]
    routes: tuple[Route, ...]
    sysctls: tuple[Sysctl, ...]
    firewall: Firewall | None
    tunnels: tuple[Tunnel, ...]
    vrfs: tuple[Vrf, ...]


def resolve_settings(g: GuestSpec) -> GuestSettings:
    """The guest's bonds, bridges, routes and sysctls as the model's keyword arguments."""
    masters = [_master(m) for m in g.masters]
    return {"bonds": tuple(m for m in masters if isinstance(m, Bond)),
            "bridges": tuple(m for m in masters if isinstance(m, Bridge)),
            "routes": tuple(r.route for r in g.routes), "sysctls": tuple(s for s, _ in g.sysctls),
            "firewall": g.firewall, "tunnels": g.tunnels, "vrfs": g.vrfs}
