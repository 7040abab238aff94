"""Validation of parsed lab data (schema version 1) into a resolved Lab.

:func:`build_lab` takes the position-aware data from
:func:`labctl.lab.yamlpos.parse_yaml`, checks every rule of the lab file
schema, fills in defaults and returns either a :class:`~labctl.lab.model.Lab`
or the full list of problems found (never just the first one).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from labctl.errors import Problem
from labctl.lab.addresses import assign_macs, check_ips, default_mac, parse_ip
from labctl.lab.checker import Checker, describe, did_you_mean, join
from labctl.lab.checks import parse_checks, parse_setup
from labctl.lab.firewall import parse_firewall
from labctl.lab.kernels import FILE_KEYS, FILES, TREE, KernelSpec, debian
from labctl.lab.model import (
    DEFAULT_HOST,
    DEFAULT_IMAGE,
    Guest,
    Host,
    Lab,
    Network,
)
from labctl.lab.netconf import check_guest, parse_masters, parse_routes, parse_sysctls
from labctl.lab.netopts import check_captures, network_capture
from labctl.lab.nicparse import parse_nics, resolve_nic, resolve_settings
from labctl.lab.shares import parse_shares
from labctl.lab.specs import GuestSpec, NetSpec, NicSpec
from labctl.lab.stepspec import StepParser
from labctl.lab.trust import TRUST_ENV, named_path_reason
from labctl.lab.tunnels.parse import check_guest as check_guest_tunnels
from labctl.lab.tunnels.parse import check_lab as check_tunnels
from labctl.lab.tunnels.parse import parse_tunnels, parse_vrfs
from labctl.lab.uri import parse_uri, valid_address
from labctl.lab.yamlpos import YamlMap, YamlSeq
from labctl.names import LAB_NAME, LAB_NAME_RULE

__all__ = [
    "BACKENDS",
    "DEFAULT_IMAGE",
    "SCHEMA_VERSION",
    "build_lab",
    "default_mac",
    "parse_ip",
]

SCHEMA_VERSION = 1
BACKENDS = ("qemu", "libvirt")
DEFAULT_MEMORY = 512
DEFAULT_CPUS = 1
MAX_GUESTS = 64
MAX_NETWORKS = 64

_TOP_KEYS = ("version", "name", "description", "image", "kernel", "backend", "hosts", "networks", "guests", "steps",
             "checks", "drops")
_TOP_REQUIRED = ("name", "networks", "guests")
_NETWORK_KEYS = ("mtu", "description", "capture")
_GUEST_KEYS = ("memory", "cpus", "kernel", "kernel_args", "host", "nics", "setup", "shares", "bonds", "bridges",
               "routes", "sysctls", "firewall", "tunnels", "vrfs", "record")
_HOST_KEYS = ("uri", "address")
_HOST_REQUIRED = ("uri",)
_HOSTS_BACKEND = "libvirt"

_LAB_NAME = LAB_NAME
_LAB_NAME_RULE = LAB_NAME_RULE
_IMAGE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_IMAGE_RULE = "use a-z, 0-9, '.', '_', '-', starting with a letter or digit"
_GUEST_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
_GUEST_NAME_RULE = "use 1-31 of a-z, 0-9, '-', starting with a letter"


def build_lab(data: Any, *, source: str, text: str, sha256: str,
              trusted: tuple[Path, ...] = (), owner: int | None = None, remote: str | None = None,
              remote_root: Path | None = None) -> tuple[Lab | None, list[Problem]]:
    """Validate parsed lab data and resolve it.

    ``trusted``: directories the user trusts (``--trust-dir``) although another
    user could change them (see :mod:`labctl.lab.trust`). ``owner``: the uid
    that owns the lab file, ``remote`` where it came from when not from this host
    (a URL, a git repository, a pack) and ``remote_root`` its git checkout: the one
    rule on the host paths it names (:func:`labctl.lab.trust.named_path_reason`).

    Returns ``(lab, [])`` when the data is valid, else ``(None, problems)``
    with every problem found, in the order they were found.  Never raises
    for bad data.
    """
    check = Checker(source, owner=owner, remote=remote, remote_root=remote_root)
    if not isinstance(data, YamlMap):
        _report_not_a_map(check, data)
        return None, check.problems
    check.keys(data, "", _TOP_KEYS, _TOP_REQUIRED)
    header = _parse_header(check, data)
    kernel = parse_kernel(check, data, "", Path(source).parent, trusted)
    hosts = _parse_hosts(check, data)
    networks = _parse_networks(check, data)
    guests = _parse_guests(check, data, networks, trusted)
    _check_placement(check, data, header, hosts, guests)
    check_captures(check, networks, guests)
    nics = [nic for guest in guests.values() for nic in guest.nics]
    _check_spans(check, hosts, guests, networks, nics)
    for guest in guests.values():
        check_guest(check, guest, {name: net.mtu for name, net in networks.items()})
        check_guest_tunnels(check, guest)
    check_ips(check, list(guests.values()), list(networks))
    check_tunnels(check, guests)
    assign_macs(check, header["name"], nics)
    steps = StepParser(check, guests, trusted).parse(data)
    checks = parse_checks(check, data, set(guests))
    drops = data.get("drops", True)
    if not isinstance(drops, bool):
        check.add(data.value_line("drops"), "drops", "expected true or false")
    if check.problems:
        return None, check.problems
    lab = Lab(
        name=header["name"], source=source, sha256=sha256, image=header["image"],
        backend=header["backend"], description=header["description"],
        networks=_resolve_networks(networks, guests), guests=_resolve_guests(guests, networks),
        text=text, steps=steps, hosts=hosts, kernel=kernel, checks=checks,
        drops=drops is not False,
    )
    return lab, []


def _report_not_a_map(check: Checker, data: Any) -> None:
    """Report a document that is empty or not a mapping."""
    if data is None:
        check.add(1, "", "the lab file is empty")
    else:
        line = data.line if isinstance(data, YamlSeq) else 1
        check.add(line, "", f"expected a mapping at the top level, got {describe(data)}")


def _parse_header(check: Checker, data: YamlMap) -> dict[str, str]:
    """Check version, name, description, image and backend; defaults filled in."""
    if "version" in data:
        version = data["version"]
        if isinstance(version, bool) or not isinstance(version, int):
            check.add(data.value_line("version"), "version", f"expected an integer, got {describe(version)}")
        elif version != SCHEMA_VERSION:
            message = f"unsupported version {version} (only version {SCHEMA_VERSION} is supported)"
            check.add(data.value_line("version"), "version", message)
    backend = check.string(data, "backend", "") or (_HOSTS_BACKEND if _mentions_hosts(data) else BACKENDS[0])
    if backend not in BACKENDS:
        hint = did_you_mean(backend, BACKENDS, "expected one of")
        check.add(data.value_line("backend"), "backend", f"unknown backend '{backend}'{hint}")
    return {
        "name": check.matching(data, "name", "", _LAB_NAME, "lab name", _LAB_NAME_RULE, True) or "",
        "description": check.string(data, "description", "") or "",
        "image": check.matching(data, "image", "", _IMAGE, "image name", _IMAGE_RULE) or DEFAULT_IMAGE,
        "backend": backend,
    }


def _mentions_hosts(data: YamlMap) -> bool:
    """True when the file has ``hosts`` or a guest with ``host`` (they imply the libvirt backend)."""
    guests = data.get("guests")
    placed = isinstance(guests, YamlMap) and any(isinstance(g, YamlMap) and "host" in g for g in guests.values())
    return "hosts" in data or placed


def _top(check: Checker, data: YamlMap, key: str) -> YamlMap | None:
    """The lab file's top-level mapping ``key`` (null: an empty one); None when it is left out or is
    not a mapping (reported)."""
    if key not in data:
        return None
    return check.mapping(data[key], data.value_line(key), key)


def _parse_hosts(check: Checker, data: YamlMap) -> dict[str, Host]:
    """Check the ``hosts`` mapping: name -> {uri, address}."""
    hosts = _top(check, data, "hosts")
    if hosts is None:
        return {}
    result: dict[str, Host] = {}
    for name, value in hosts.items():
        path, line = f"hosts.{name}", hosts.key_line(name)
        if not _GUEST_NAME.fullmatch(name):
            check.add(line, path, f"invalid host name '{name}' ({_GUEST_NAME_RULE})")
        body = check.mapping(value, hosts.value_line(name), path, allow_null=False)
        if body is None:
            continue
        check.keys(body, path, _HOST_KEYS, _HOST_REQUIRED, line)
        uri = _host_uri(check, body, path)
        address = check.string(body, "address", path)
        if address is not None and not valid_address(address):
            check.add(body.value_line("address"), f"{path}.address",
                      f"invalid address '{address}' (a unicast IPv4 address or a host name, never a wildcard)")
            address = None
        if uri is not None:
            result[name] = Host(name, uri, address, line)
    return result


def _host_uri(check: Checker, body: YamlMap, path: str) -> str | None:
    """The host's libvirt URI, if labctl can use it."""
    uri = check.string(body, "uri", path, required=True)
    if uri is None:
        return None
    try:
        parse_uri(uri, lab=True)  # libvirt's own reading of it: keyfile is the only parameter
    except ValueError as exc:
        check.add(body.value_line("uri"), f"{path}.uri", str(exc))
        return None
    return uri


def _check_placement(check: Checker, data: YamlMap, header: dict[str, str], hosts: dict[str, Host],
                     guests: dict[str, GuestSpec]) -> None:
    """Every guest's ``host`` is defined, and hosts are only used with the libvirt backend."""
    for guest in guests.values():
        if guest.host == DEFAULT_HOST or guest.host in hosts:
            continue
        where = f"guests.{guest.name}.host"
        if hosts:
            hint = did_you_mean(guest.host, (*hosts, DEFAULT_HOST), "defined")
        else:
            hint = " (the lab defines no hosts; add them under 'hosts')"
        check.add(guest.host_line, where, f"unknown host '{guest.host}'{hint}")
    if header["backend"] != _HOSTS_BACKEND and _mentions_hosts(data):
        line = data.key_line("hosts") if "hosts" in data else data.value_line("backend")
        check.add(line, "hosts" if "hosts" in data else "backend",
                  f"placing guests on hosts needs the libvirt backend (backend: {header['backend']}; "
                  f"use backend: {_HOSTS_BACKEND})")


def _check_spans(check: Checker, hosts: dict[str, Host], guests: dict[str, GuestSpec],
                 networks: dict[str, NetSpec], nics: list[NicSpec]) -> None:
    """A network of three or more guests must sit on labctl's own machine:
    across hosts (or on a remote one) guests are linked only in pairs.

    Only what the file decides is checked here: a guest on the default host
    runs where ``$LABCTL_LIBVIRT_URI`` says, which ``up`` checks again.
    """
    by_network: dict[str | None, list[NicSpec]] = {}
    for nic in nics:
        by_network.setdefault(nic.network, []).append(nic)
    for net in networks.values():
        members = by_network.get(net.name, [])
        if len(members) < 3:
            continue
        uris = {hosts[guests[n.guest].host].uri for n in members if guests[n.guest].host in hosts}
        on = sorted({guests[n.guest].host for n in members})
        if len(uris) > 1 or any(parse_uri(u).remote for u in uris):
            where = f"spans hosts {', '.join(on)}" if len(on) > 1 else f"is on remote host {on[0]}"
            check.add(net.line, f"networks.{net.name}",
                      f"network {net.name} has {len(members)} guests and {where}: labctl links guests on "
                      "remote hosts or across hosts only in pairs (UDP tunnels); split it into two-guest "
                      "links, or place its guests on this machine")


def _parse_networks(check: Checker, data: YamlMap) -> dict[str, NetSpec]:
    """Check the ``networks`` mapping; every network is kept, even a badly named one."""
    nets = _top(check, data, "networks")
    if nets is None:
        return {}
    result: dict[str, NetSpec] = {}
    if len(nets) > MAX_NETWORKS:
        check.add(data.value_line("networks"), "networks", f"{len(nets)} networks: a lab has at most {MAX_NETWORKS}")
        return result
    for name, value in nets.items():
        path, line = f"networks.{name}", nets.key_line(name)
        if not _LAB_NAME.fullmatch(name):
            check.add(line, path, f"invalid network name '{name}' ({_LAB_NAME_RULE})")
        body = check.mapping(value, nets.value_line(name), path) or YamlMap(line)
        check.keys(body, path, _NETWORK_KEYS)
        mtu = check.integer(body, "mtu", path, (68, 65535))
        description = check.string(body, "description", path) or ""
        capture_all, capture = network_capture(check, body, path)
        result[name] = NetSpec(name, mtu, description, line, capture_all, capture, body.value_line("capture"))
    return result


def _parse_guests(check: Checker, data: YamlMap, networks: dict[str, NetSpec],
                  trusted: tuple[Path, ...] = ()) -> dict[str, GuestSpec]:
    """Check the ``guests`` mapping (at least one guest) and each guest in it."""
    guests = _top(check, data, "guests")
    if guests is None:
        return {}
    if not guests:
        check.add(data.value_line("guests"), "guests", "at least one guest is required")
    if len(guests) > MAX_GUESTS:
        check.add(data.value_line("guests"), "guests", f"{len(guests)} guests: a lab has at most {MAX_GUESTS}")
        return {}
    result: dict[str, GuestSpec] = {}
    for name in guests:
        spec = _parse_guest(check, guests, name, networks, trusted)
        if spec is not None:
            result[name] = spec
    return result


def _parse_guest(
    check: Checker, guests: YamlMap, name: str, networks: dict[str, NetSpec], trusted: tuple[Path, ...] = (),
) -> GuestSpec | None:
    """Check one guest; None if its value is not a mapping."""
    path, line = f"guests.{name}", guests.key_line(name)
    if not _GUEST_NAME.fullmatch(name):
        check.add(line, path, f"invalid guest name '{name}' ({_GUEST_NAME_RULE})")
    body = check.mapping(guests[name], guests.value_line(name), path)
    if body is None:
        return None
    check.keys(body, path, _GUEST_KEYS, line=line)
    memory = check.integer(body, "memory", path, (128, 16384), " MiB")
    cpus = check.integer(body, "cpus", path, (1, 8))
    host = check.string(body, "host", path) or DEFAULT_HOST
    record = body.get("record", False)
    if not isinstance(record, bool):
        check.add(body.value_line("record"), f"{path}.record", "expected true or false")
    return GuestSpec(
        host=host, host_line=body.value_line("host"),
        kernel=parse_kernel(check, body, path, check_dir(check), trusted),
        name=name,
        memory=DEFAULT_MEMORY if memory is None else memory,
        cpus=DEFAULT_CPUS if cpus is None else cpus,
        kernel_args=_parse_kernel_args(check, body, path),
        nics=parse_nics(check, body, path, name, networks, trusted),
        line=line,
        setup=parse_setup(check, body, path),
        shares=parse_shares(check, body, path, check_dir(check), trusted),
        masters=parse_masters(check, body, path, "bonds") + parse_masters(check, body, path, "bridges"),
        routes=parse_routes(check, body, path),
        sysctls=parse_sysctls(check, body, path),
        firewall=parse_firewall(check, body, path, check_dir(check), trusted),
        tunnels=parse_tunnels(check, body, path), vrfs=parse_vrfs(check, body, path),
        record=record is True,
    )


def check_dir(check: Checker) -> Path:
    """The lab file's directory: relative kernel paths start there."""
    return Path(check.file).parent


def parse_kernel(check: Checker, body: YamlMap, path: str, base: Path,
                 trusted: tuple[Path, ...] = ()) -> KernelSpec | None:
    """``kernel`` of the lab (``path`` '') or of a guest: its form (see :mod:`labctl.lab.kernels`), and
    whether the paths it names may be used (:mod:`labctl.lab.trust`; ``trusted``: ``--trust-dir``)."""
    if body.get("kernel") is None:
        return None
    value, line, where = body["kernel"], body.value_line("kernel"), join(path, "kernel")
    if isinstance(value, str):
        try:
            return debian(value, line, where)
        except ValueError as exc:
            check.add(line, where, str(exc))
            return None
    m = check.mapping(value, line, where, allow_null=False)
    if m is None:
        return None
    if "tree" in m:
        check.keys(m, where, ("tree",))
        tree = check.string(m, "tree", where, required=True)
        if not tree:
            return None
        spec = KernelSpec(TREE, tree=(base / tree).resolve(), line=line, path=where)
        return spec if _trusted_paths(check, m, where, {"tree": spec.tree}, trusted) else None
    check.keys(m, where, FILE_KEYS, ("image",))
    files = {k: check.string(m, k, where, required=(k == "image")) for k in FILE_KEYS}
    if not files["image"]:
        return None
    paths = {k: (base / v).resolve() if v else None for k, v in files.items()}
    if not _trusted_paths(check, m, where, paths, trusted):
        return None
    return KernelSpec(FILES, image=paths["image"], modules=paths["modules"], debug=paths["debug"],
                      config=paths["config"], line=line, path=where)


_KERNEL_PATH_USE = {
    "tree": ("kernel tree", "preparing it runs make there as you"),
    "image": ("kernel image", "labctl reads it as you and the guests boot it"),
    "modules": ("kernel modules directory", "labctl copies its files onto the guests' disk as you"),
    "debug": ("kernel debug file", "labctl and gdb read it as you"),
    "config": ("kernel config file", "labctl reads it as you"),
}


def _trusted_paths(check: Checker, m: YamlMap, where: str, paths: dict[str, Path | None],
                   trusted: tuple[Path, ...]) -> bool:
    """Report every path of a ``kernel:`` mapping another user could change (at its key's line); True if none."""
    ok = True
    for key, target in paths.items():
        if target is None:
            continue
        why = named_path_reason(target, trusted, check.owner)  # a pack's kernels are its own (remote: see check_foreign)
        if why is None:
            continue
        what, use = _KERNEL_PATH_USE[key]
        check.add(m.value_line(key), join(where, key),
                  f"{what} {target} is not trusted ({use}): {why}; "
                  f"pass --trust-dir {shlex.quote(str(target))} (or {TRUST_ENV}) if you trust it")
        ok = False
    return ok


def _parse_kernel_args(check: Checker, body: YamlMap, path: str) -> tuple[str, ...]:
    """``kernel_args`` as a tuple: a string is split on whitespace, a list kept."""
    value, where = body.get("kernel_args"), join(path, "kernel_args")
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(value.split())
    if not isinstance(value, YamlSeq):
        message = f"expected a string or a list of strings, got {describe(value)}"
        check.add(body.value_line("kernel_args"), where, message)
        return ()
    for index, item in enumerate(value):
        if not isinstance(item, str):
            message = f"expected a string, got {describe(item)}"
            check.add(value.item_line(index), f"{where}[{index}]", message)
        elif not item.strip():
            check.add(value.item_line(index), f"{where}[{index}]", "empty kernel argument")
    return tuple(item for item in value if isinstance(item, str) and item.strip())


def _resolve_networks(networks: dict[str, NetSpec], guests: dict[str, GuestSpec]) -> dict[str, Network]:
    """Final Network objects, with their (guest, nic) members in lab order."""
    members: dict[str, list[tuple[str, str]]] = {name: [] for name in networks}
    for guest in guests.values():
        for nic in guest.nics:
            members[_req(nic.network)].append((guest.name, _req(nic.name)))
    return {
        name: Network(name, spec.mtu, tuple(members[name]), spec.description, spec.line,
                      tuple(m for m in members[name] if spec.capture_all or f"{m[0]}.{m[1]}" in spec.capture))
        for name, spec in networks.items()
    }


def _resolve_guests(guests: dict[str, GuestSpec], networks: dict[str, NetSpec]) -> dict[str, Guest]:
    """Final Guest objects; a NIC without its own MTU takes its network's."""
    return {
        name: Guest(
            name=name, memory=spec.memory, cpus=spec.cpus,
            nics=tuple(resolve_nic(nic, networks[_req(nic.network)].mtu) for nic in spec.nics),
            kernel_args=spec.kernel_args, line=spec.line, host=spec.host, kernel=spec.kernel, setup=spec.setup,
            shares=spec.shares, record=spec.record, **resolve_settings(spec),
        )
        for name, spec in guests.items()
    }


def _req(value: str | None) -> str:
    """A value validation guarantees is set (only called when there were no problems)."""
    assert value is not None
    return value


