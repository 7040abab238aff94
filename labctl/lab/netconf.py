"""A guest's network settings in the lab file, checked with their lines: VLANs, bonds, bridges,
routes and sysctls (addresses are :mod:`.addresses`').

::

    guests:
      r:
        nics:
          - {name: eth1, model: e1000, network: left, ip: [10.1.0.1/24, "fd00:1::1/64"]}
          - name: eth2
            model: virtio
            network: trunk
            vlans: [{id: 10, ip: 10.10.0.1/24}, {id: 20, name: voice, ip: "fd00:20::1/64"}]
          - {name: eth3, model: e1000, network: pair}
          - {name: eth4, model: virtio, network: pair}
        bonds:
          bond0: {mode: active-backup, members: [eth3, eth4], ip: 10.3.0.1/24, primary: eth3}  # miimon: 100
        bridges:
          br0: {members: [eth5, eth6], ip: 10.4.0.1/24}
        routes:
          - {to: default, via: 10.1.0.254}
          - {to: "fd00:9::/48", via: "fd00:1::2"}
          - {to: 10.8.0.0/24, dev: eth2, metric: 10}
        sysctls:
          net.ipv4.ip_forward: 1
          net.ipv4.conf.eth2/10.rp_filter: 2     # sysctl(8)'s form: a dot inside an interface name is /

Members of a bond or bridge are lab NICs of the guest, in no other bond or bridge, without
addresses or VLANs of their own. A route's gateway lies on a subnet of one of the guest's
interfaces (of ``dev`` when given; a link-local one needs ``dev``). A sysctl's name must be
well formed, start at a part of ``/proc/sys`` and, for per-interface settings
(``net.ipv4.conf.IFACE.*`` and the like), name an interface of the guest; whether the guest's
kernel has it is known only there: the guest's init says so at boot, and ``up`` fails naming
its line (:mod:`labctl.up`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

from labctl.lab.addresses import parse_addresses
from labctl.lab.checker import Checker, close_match, describe, did_you_mean, host_address, join
from labctl.lab.firewall import check_interfaces
from labctl.lab.ifaces import BOND_MODES, DEFAULT_MIIMON, PRIMARY_MODES, Address, Route, Sysctl
from labctl.lab.model import MGMT_NIC, MGMT_SUBNET
from labctl.lab.specs import GuestSpec, MasterSpec, NicSpec, RouteSpec, VlanSpec
from labctl.lab.yamlpos import YamlMap, YamlSeq

IFNAME = re.compile(r"[a-zA-Z][a-zA-Z0-9_.-]{0,14}")
IFNAME_RULE = "use 1-15 of letters, digits, '_', '.', '-', starting with a letter"
_VLAN_KEYS = ("id", "name", "ip")
_BOND_KEYS = ("mode", "members", "ip", "vlans", "miimon", "primary")
_BRIDGE_KEYS = ("members", "ip", "vlans")
_ROUTE_KEYS = ("to", "via", "dev", "metric")
_SYSCTL = re.compile(r"[a-z0-9_]+(?:\.[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*)+")
_SYSCTL_ROOTS = ("abi", "crypto", "debug", "dev", "fs", "kernel", "net", "sunrpc", "user", "vm")
_PER_IFACE = re.compile(r"net\.ipv[46]\.(?:conf|neigh)\.")
_MAX_SYSCTL_VALUE = 1024
_DEFAULT_METRIC = {4: 0, 6: 1024}  # what the kernel gives a route without one


def iface_name(check: Checker, name: str, line: int, path: str) -> str | None:
    """``name`` if it can be a lab interface's name (not lo or mgmt0), else None (reported)."""
    if name == "lo":
        check.add(line, path, "'lo' is reserved for the loopback interface")
    elif name == MGMT_NIC:
        check.add(line, path, f"'{MGMT_NIC}' is reserved for labctl's management NIC")
    elif not IFNAME.fullmatch(name):
        check.add(line, path, f"invalid interface name '{name}' ({IFNAME_RULE})")
    else:
        return name
    return None


# --------------------------------------------------------------------------- VLANs, bonds, bridges


def parse_vlans(check: Checker, m: YamlMap, path: str, parent: str | None) -> list[VlanSpec]:
    """``m``'s ``vlans``: 802.1Q sub-interfaces of ``parent`` (None: its name was invalid), ids unique."""
    items = check.sequence(m, "vlans", path)
    seen: dict[int, int] = {}
    out: list[VlanSpec] = []
    for v, vpath, line in check.mappings(items, f"{path}.vlans"):
        check.keys(v, vpath, _VLAN_KEYS, ("id",), line)
        vid = check.integer(v, "id", vpath, (1, 4094))
        if vid is None:
            continue
        if vid in seen:
            check.add(v.value_line("id"), f"{vpath}.id",
                      f"duplicate VLAN id {vid} on {parent or 'this interface'} (first at line {seen[vid]})")
            continue
        seen[vid] = v.value_line("id")
        name = check.string(v, "name", vpath)
        if name is not None:
            name = iface_name(check, name, v.value_line("name"), f"{vpath}.name")
        elif parent is not None:
            name = f"{parent}.{vid}"
            if not IFNAME.fullmatch(name):
                check.add(v.value_line("id"), f"{vpath}.id",
                          f"the VLAN's interface would be '{name}', longer than 15 characters: give it a name")
                name = None
        out.append(VlanSpec(vid, name, parent or "", parse_addresses(check, v, vpath), line, vpath,
                            v.value_line("name")))
    return out


def named_interfaces(check: Checker, body: YamlMap, path: str,
                     key: str) -> Iterator[tuple[str, str | None, YamlMap, str, int]]:
    """Each entry of a guest's mapping ``key`` (``bonds``, ``bridges``, ``vrfs``: an interface's name
    -> its mapping): the key, the key as an interface name (None when it is not one, reported), the
    entry's mapping, path and line. An entry that is not a mapping is reported and left out."""
    for raw, value, ipath, line, vline in check.entries(body, key, path):
        name = iface_name(check, raw, line, ipath)
        m = check.mapping(value, vline, ipath, allow_null=False)
        if m is not None:
            yield raw, name, m, ipath, line


def parse_masters(check: Checker, body: YamlMap, path: str, kind: str) -> list[MasterSpec]:
    """A guest's ``bonds`` or ``bridges`` (``kind``): name -> members, addresses, VLANs (and a bond's
    mode, miimon and primary). Members are checked against the guest's NICs by :func:`check_guest`."""
    out = []
    for _, name, m, mpath, line in named_interfaces(check, body, path, kind):
        bond = kind == "bonds"
        check.keys(m, mpath, _BOND_KEYS if bond else _BRIDGE_KEYS, ("mode", "members") if bond else ("members",), line)
        members = _members(check, m, mpath)
        spec = MasterSpec("bond" if bond else "bridge", name, members, m.value_line("members"),
                          parse_addresses(check, m, mpath), parse_vlans(check, m, mpath, name), line, mpath)
        if bond:
            _bond_options(check, m, mpath, spec)
        out.append(spec)
    return out


def _members(check: Checker, m: YamlMap, path: str) -> tuple[str, ...]:
    value, line, where = m.get("members"), m.value_line("members"), join(path, "members")
    if value is None:
        return ()
    if not isinstance(value, YamlSeq) or not value or not all(isinstance(v, str) for v in value):
        got = "an empty list" if isinstance(value, YamlSeq) and not value else describe(value)
        check.add(line, where, f"expected a list of the guest's NIC names, got {got}")
        return ()
    for i, v in enumerate(value):
        if v in value[:i]:
            check.add(value.item_line(i), f"{where}[{i}]", f"'{v}' is listed twice")
    return tuple(dict.fromkeys(value))


def _bond_options(check: Checker, m: YamlMap, path: str, spec: MasterSpec) -> None:
    """A bond's mode, miimon and primary, into ``spec``."""
    mode = check.string(m, "mode", path, required=True)
    if mode is not None and mode not in BOND_MODES:
        check.add(m.value_line("mode"), join(path, "mode"),
                  f"unknown bond mode '{mode}'{did_you_mean(mode, BOND_MODES, 'modes')}")
        mode = None
    spec.mode = mode or ""
    miimon = check.integer(m, "miimon", path, (0, 60000), " ms")
    spec.miimon = DEFAULT_MIIMON if miimon is None else miimon
    primary = check.string(m, "primary", path)
    spec.primary_line = m.value_line("primary")
    if primary is None:
        return
    if mode is not None and mode not in PRIMARY_MODES:
        check.add(spec.primary_line, join(path, "primary"),
                  f"a primary member means something only in modes {', '.join(PRIMARY_MODES)} (this bond: {mode})")
    elif spec.members and primary not in spec.members:
        check.add(spec.primary_line, join(path, "primary"),
                  f"'{primary}' is not a member of this bond (its members: {', '.join(spec.members)})")
    else:
        spec.primary = primary


# --------------------------------------------------------------------------- routes and sysctls


def parse_routes(check: Checker, body: YamlMap, path: str) -> list[RouteSpec]:
    """A guest's ``routes``: each ``to`` (a prefix, a host or ``default``) via a gateway, out of a
    device, or both; no two to one destination with one metric."""
    items = check.sequence(body, "routes", path)
    seen: dict[tuple[str, int], int] = {}
    out = []
    for r, rpath, line in check.mappings(items, f"{path}.routes"):
        check.keys(r, rpath, _ROUTE_KEYS, ("to",), line)
        route = _route(check, r, rpath, line)
        if route is None:
            continue
        key = (str(route.to), _DEFAULT_METRIC[route.version] if route.metric is None else route.metric)
        if key in seen:
            check.add(line, rpath, f"a route to {route.destination} with metric {key[1]} is already given at "
                                   f"line {seen[key]} (give this one another metric)")
            continue
        seen[key] = line
        out.append(RouteSpec(route, rpath, {k: r.value_line(k) for k in _ROUTE_KEYS}))
    return out


def _route(check: Checker, r: YamlMap, path: str, line: int) -> Route | None:
    to_text = check.string(r, "to", path, required=True)
    via_text = check.string(r, "via", path)
    dev = check.string(r, "dev", path)
    metric = check.integer(r, "metric", path, (0, 2**32 - 1))
    if dev is not None:
        dev = iface_name(check, dev, r.value_line("dev"), join(path, "dev"))
    if via_text is None and "dev" not in r:
        check.add(line, path, "a route needs a gateway (via), a device (dev) or both")
        return None
    via = _gateway(check, r, path, via_text)
    if to_text is None or (via_text is not None and via is None) or ("dev" in r and dev is None):
        return None
    to = _destination(check, r, path, to_text, via)
    if to is None:
        return None
    if via is not None and via.version != to.version:
        check.add(r.value_line("via"), join(path, "via"),
                  f"{via} is an IPv{via.version} gateway for an IPv{to.version} destination")
        return None
    return Route(to, via, dev, metric, line)


def _gateway(check: Checker, r: YamlMap, path: str,
             text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if text is None:
        return None
    line, where = r.value_line("via"), join(path, "via")
    return host_address(check, text, line, where,
                        f"invalid gateway address '{text}' (an IPv4 or IPv6 address, no prefix length)", "a gateway")


def _destination(check: Checker, r: YamlMap, path: str, text: str,
                 via: ipaddress.IPv4Address | ipaddress.IPv6Address | None
                 ) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    line, where = r.value_line("to"), join(path, "to")
    if text == "default":
        if via is None:
            check.add(line, where, "a default route without a gateway: write 0.0.0.0/0 or ::/0 for its family")
            return None
        return ipaddress.ip_network("0.0.0.0/0" if via.version == 4 else "::/0")
    try:
        given = ipaddress.ip_interface(text)
    except ValueError:
        check.add(line, where, f"invalid destination '{text}' (a prefix such as 10.2.0.0/24 or fd00:2::/64, "
                               "an address, or default)")
        return None
    to = given.network
    if given.ip != to.network_address:
        check.add(line, where, f"{text} has host bits set (did you mean {to}?)")
        return None
    if isinstance(to, ipaddress.IPv4Network) and to.prefixlen > 0 and to.subnet_of(MGMT_SUBNET):
        check.add(line, where, f"{to} is inside {MGMT_SUBNET}, reserved for labctl's management network")
        return None
    return to


def parse_sysctls(check: Checker, body: YamlMap, path: str) -> list[tuple[Sysctl, str]]:
    """A guest's ``sysctls``: name -> value, each name well formed and starting at a part of
    ``/proc/sys``; values are numbers or one line of text."""
    out = []
    for name, value, spath, line, vline in check.entries(body, "sysctls", path):
        if not _SYSCTL.fullmatch(name) or len(name) > 255:
            check.add(line, spath, f"invalid sysctl name '{name}' (parts separated by dots, as sysctl(8) writes "
                                   "them; a dot inside an interface name is written /)")
            continue
        root = name.split(".", 1)[0]
        if root not in _SYSCTL_ROOTS:
            check.add(line, spath, f"'{name}' is not a sysctl: /proc/sys has no '{root}'"
                                   + did_you_mean(root, _SYSCTL_ROOTS, "its parts"))
            continue
        text = _sysctl_value(check, value, vline, spath)
        if text is not None:
            out.append((Sysctl(name, text, line), spath))
    return out


def _sysctl_value(check: Checker, value: object, line: int, path: str) -> str | None:
    if isinstance(value, bool) or value is None or not isinstance(value, int | float | str):
        check.add(line, path, f"expected a number or a string, got {describe(value)}"
                              + (" (write 1 or 0)" if isinstance(value, bool) else ""))
        return None
    text = str(value).strip()
    if not text or len(text) > _MAX_SYSCTL_VALUE or any(c in text for c in "\n\r"):
        check.add(line, path, f"a sysctl's value is one line of 1 to {_MAX_SYSCTL_VALUE} characters")
        return None
    return text


# --------------------------------------------------------------------------- one guest as a whole


def check_guest(check: Checker, g: GuestSpec, network_mtu: dict[str, int | None]) -> None:
    """What spans a guest's sections: interface names unique, bond and bridge members its own
    free NICs, routes through its interfaces and subnets, per-interface sysctls and NAT rules on
    its interfaces.
    ``network_mtu``: each network's MTU (a NIC without its own has its network's)."""
    names = _interface_names(check, g)
    enslaved = _check_members(check, g, network_mtu)
    _check_routes(check, g, enslaved)
    _check_sysctls(check, g, set(names))
    check_interfaces(check, g.firewall, g.name, set(names), MGMT_NIC, MGMT_SUBNET)


def _interface_names(check: Checker, g: GuestSpec) -> dict[str, int]:
    """Every interface name of the guest (NICs, VLANs, bonds, bridges) with its line; a VLAN, bond
    or bridge reusing a name is reported (NICs reusing one are reported with the NICs)."""
    names: dict[str, int] = {n.name: n.name_line for n in g.nics if n.name}
    later = [(v.name, v.name_line or v.line, v.path) for n in g.nics for v in n.vlans]
    for m in g.masters:
        later.append((m.name, m.line, m.path))
        later += [(v.name, v.name_line or v.line, v.path) for v in m.vlans]
    later += [(t.name, t.line, t.path) for t in g.tunnels] + [(v.name, v.line, v.path) for v in g.vrfs]  # labctl.lab.tunnels
    for name, line, path in later:
        if name is None:
            continue
        if name in names:
            check.add(line, path, f"interface name '{name}' is already used in guest {g.name} (line {names[name]})")
        else:
            names[name] = line
    return names


def _check_members(check: Checker, g: GuestSpec, network_mtu: dict[str, int | None]) -> dict[str, str]:
    """Bond and bridge members: NICs of the guest, in one master each, with no addresses or VLANs
    (and, in a bond, one MTU); NIC -> its master. A master whose name is invalid is left out."""
    nics = {n.name: n for n in g.nics if n.name}
    owner: dict[str, str] = {}
    for m in g.masters:
        if m.name is None:
            continue
        for member in m.members:
            nic = nics.get(member)
            if nic is None:
                hint = close_match(member, nics) or f" (its NICs: {', '.join(nics) or 'none'})"
                check.add(m.members_line, f"{m.path}.members", f"'{member}' is not a lab NIC of guest {g.name}{hint}")
            elif member in owner:
                check.add(m.members_line, f"{m.path}.members", f"{member} is already a member of {owner[member]}")
            else:
                owner[member] = m.name
                _free_member(check, m, nic)
        mtus = {nics[x].mtu or network_mtu.get(nics[x].network or "") for x in m.members if x in nics}
        if m.kind == "bond" and len(mtus) > 1:
            listed = ", ".join(str(x or "default") for x in sorted(mtus, key=lambda v: v or 0))
            check.add(m.members_line, f"{m.path}.members", f"the members of bond {m.name} have different MTUs ({listed})")
    return owner


def _free_member(check: Checker, m: MasterSpec, nic: NicSpec) -> None:
    """A member NIC has no addresses or VLANs of its own (its master has them)."""
    if nic.addresses:
        check.add(nic.ip_line, f"{nic.path}.ip", f"{nic.name} is a member of {m.kind} {m.name}: "
                                                  f"give its addresses to {m.name}")
    elif nic.vlans:
        check.add(nic.vlans[0].line, f"{nic.path}.vlans", f"{nic.name} is a member of {m.kind} {m.name}: "
                                                            f"give its VLANs to {m.name}")


def connected(g: GuestSpec, enslaved: dict[str, str]) -> dict[str, list[Address]]:
    """Each interface that may carry routes (not a bond's or bridge's member) -> its addresses."""
    out: dict[str, list[Address]] = {}
    holders: list[NicSpec | MasterSpec] = [*g.nics, *g.masters]
    for holder in holders:
        if holder.name is None or holder.name in enslaved:
            continue
        out[holder.name] = [a.address for a in holder.addresses]
        out.update({v.name: [a.address for a in v.addresses] for v in holder.vlans if v.name})
    return {t.name: list(t.addresses) for t in g.tunnels} | out


def _check_routes(check: Checker, g: GuestSpec, enslaved: dict[str, str]) -> None:
    ifaces = connected(g, enslaved)
    every = [a for addrs in ifaces.values() for a in addrs]
    for spec in g.routes:
        r, lines = spec.route, spec.lines
        if r.dev is not None and r.dev not in ifaces:
            why = (f"{r.dev} is a member of {enslaved[r.dev]}: route through {enslaved[r.dev]}" if r.dev in enslaved
                   else f"guest {g.name} has no interface '{r.dev}'"
                   + (close_match(r.dev, ifaces) or f" (its interfaces: {', '.join(ifaces) or 'none'})"))
            check.add(lines["dev"], f"{spec.path}.dev", why)
            continue
        if r.via is not None:
            _check_gateway(check, g, spec, ifaces, every)
        if r.version == 4 and not r.metric and r.to.prefixlen:
            own = next((name for name, addrs in ifaces.items() if any(a.network == r.to for a in addrs)), None)
            if own is not None:
                check.add(lines["to"], f"{spec.path}.to", f"{r.to} is {own}'s own subnet: the kernel routes it "
                          "already (give this route a metric to add another)")


def _check_gateway(check: Checker, g: GuestSpec, spec: RouteSpec, ifaces: dict[str, list[Address]],
                   every: list[Address]) -> None:
    r = spec.route
    assert r.via is not None
    line, path = spec.lines["via"], f"{spec.path}.via"
    if any(a.ip == r.via for a in every):
        check.add(line, path, f"{r.via} is an address of guest {g.name} itself")
        return
    if r.via.is_link_local:
        if r.dev is None:
            check.add(line, path, f"{r.via} is link-local: say which interface it is on (dev)")
        return
    candidates = ifaces[r.dev] if r.dev is not None else every
    if any(r.via in a.network for a in candidates if a.version == r.via.version):
        return
    subnets = sorted({str(a.network) for a in candidates if a.version == r.via.version})
    where = f"{r.dev}'s subnets" if r.dev is not None else f"guest {g.name}'s connected subnets"
    known = ", ".join(subnets) or f"it has no IPv{r.via.version} address"
    check.add(line, path, f"{r.via} is on none of {where} ({known})")


def _check_sysctls(check: Checker, g: GuestSpec, names: set[str]) -> None:
    """Per-interface sysctls (``net.ipv4.conf.IFACE.*``, ``net.ipv6.neigh.IFACE.*``...) name one of
    the guest's interfaces, ``all``, ``default`` or ``lo``; never the management NIC."""
    for s, path in g.sysctls:
        if not _PER_IFACE.match(s.name):
            continue
        parts = s.name.split(".")
        iface = parts[3].replace("/", ".")
        dotted = ".".join(parts[3:5]) if len(parts) > 5 else ""
        if iface == MGMT_NIC:
            check.add(s.line, path, f"{MGMT_NIC} is labctl's management NIC: its settings are labctl's")
        elif dotted in names:
            fixed = ".".join([*parts[:3], dotted.replace(".", "/"), *parts[5:]])
            check.add(s.line, path, f"write {fixed}: sysctl(8) writes a dot inside an interface name as /")
        elif iface not in names and iface not in ("all", "default", "lo"):
            hint = close_match(iface, names) or f" (its interfaces: {', '.join(sorted(names)) or 'none'})"
            check.add(s.line, path, f"guest {g.name} has no interface '{iface}'{hint}")
        elif len(parts) != 5:
            check.add(s.line, path, f"expected {'.'.join(parts[:3])}.INTERFACE.SETTING, got '{s.name}'")
