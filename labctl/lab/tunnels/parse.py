"""A guest's ``tunnels`` and ``vrfs`` in the lab file, checked with their lines.

::

    guests:
      a:
        tunnels:
          vx0: {type: vxlan, vni: 42, remote: 10.2.0.2, dev: eth1, ip: 192.168.42.1/24}
          wg0: {type: wireguard, peer: b.wg0, remote: 10.2.0.2, ip: 10.99.0.1/24}
        vrfs:
          blue: {table: 10, members: [eth2], routes: [{to: default, via: 10.3.0.1}]}

A tunnel's name is an interface name of the guest (unique among its NICs, VLANs, bonds, bridges,
tunnels and VRFs); ``type`` is a kind of :data:`~labctl.lab.tunnels.known.KINDS`; its ``remote`` is
an address of another guest of the lab, its ``local`` one of this guest's, its ``dev`` an interface
of this guest. A VRF's ``table`` is its own (not another VRF's of the guest, nor the kernel's
``local``, ``main`` or ``default``), its members interfaces of the guest in no other VRF (nor a
bond's or bridge's members), and its routes go through its members.
"""

from __future__ import annotations

import ipaddress

from labctl.lab.addresses import parse_addresses
from labctl.lab.checker import Checker, close_match, describe, did_you_mean, join
from labctl.lab.ifaces import Address
from labctl.lab.netconf import connected, iface_name, named_interfaces, parse_routes
from labctl.lab.specs import GuestSpec
from labctl.lab.tunnels.devices import COMMON_KEYS, Tunnel, Vrf
from labctl.lab.tunnels.known import KINDS
from labctl.lab.yamlpos import YamlMap, YamlSeq

__all__ = ["RESERVED_TABLES", "VRF_KEYS", "check_guest", "check_lab", "parse_tunnels", "parse_vrfs"]

VRF_KEYS = ("table", "members", "routes")
RESERVED_TABLES = {253: "default", 254: "main", 255: "local"}
MAX_TUNNELS = 16


def parse_tunnels(check: Checker, body: YamlMap, path: str) -> tuple[Tunnel, ...]:
    """A guest's ``tunnels``: name -> a tunnel of one kind (see the module's docstring)."""
    items = check.section(body, "tunnels", path)
    if items is None:
        return ()
    where = join(path, "tunnels")
    if len(items) > MAX_TUNNELS:
        check.add(body.value_line("tunnels"), where, f"{len(items)} tunnels: a guest has at most {MAX_TUNNELS}")
        return ()
    out = []
    for raw, value in items.items():
        tpath, line = f"{where}.{raw}", items.key_line(raw)
        name = iface_name(check, raw, line, tpath)
        t = _tunnel(check, value, items.value_line(raw), tpath, name or raw, line)
        if t is not None and name is not None:
            out.append(t)
    return tuple(out)


def _tunnel(check: Checker, value: object, vline: int, path: str, name: str, line: int) -> Tunnel | None:
    m = check.mapping(value, vline, path, allow_null=False)
    if m is None:
        return None
    before = len(check.problems)
    kind_name = check.string(m, "type", path, required=True)
    if "type" not in m:
        check.add(line, path, f"missing required key 'type' (one of {', '.join(KINDS)})")
        return None
    if kind_name is None:
        return None
    kind = KINDS.get(kind_name)
    if kind is None:
        check.add(m.value_line("type"), join(path, "type"),
                  f"unknown tunnel type '{kind_name}'{did_you_mean(kind_name, KINDS, 'tunnel types')}")
        return None
    check.keys(m, path, COMMON_KEYS + kind.keys, kind.required, line)
    options = kind.options(check, m, path)
    addresses = tuple(a.address for a in parse_addresses(check, m, path))
    mtu = check.integer(m, "mtu", path, (68, 65535))
    if len(check.problems) > before:
        return None
    return Tunnel(name, kind.name, addresses, tuple(options.items()), mtu, line, path)


def parse_vrfs(check: Checker, body: YamlMap, path: str) -> tuple[Vrf, ...]:
    """A guest's ``vrfs``: name -> its table, members and routes; tables unique and not the kernel's."""
    out: list[Vrf] = []
    tables: dict[int, tuple[str, int]] = {}
    for raw, name, m, vpath, line in named_interfaces(check, body, path, "vrfs"):
        before = len(check.problems)
        check.keys(m, vpath, VRF_KEYS, ("table",), line)
        table = check.integer(m, "table", vpath, (1, 2**32 - 1))
        if table is not None and table in RESERVED_TABLES:
            check.add(m.value_line("table"), join(vpath, "table"),
                      f"table {table} is the kernel's {RESERVED_TABLES[table]} table: give VRF {raw} a table of its own")
        elif table is not None and table in tables:
            other, at = tables[table]
            check.add(m.value_line("table"), join(vpath, "table"),
                      f"table {table} is VRF {other}'s too (line {at}): each VRF has a table of its own")
        elif table is not None:
            tables[table] = (raw, m.value_line("table"))
        members = _members(check, m, vpath)
        routes = tuple(r.route for r in parse_routes(check, m, vpath))
        if len(check.problems) == before and name is not None and table is not None:
            out.append(Vrf(name, table, members, routes, line, vpath))
    return tuple(out)


def _members(check: Checker, m: YamlMap, path: str) -> tuple[str, ...]:
    value, where = m.get("members"), join(path, "members")
    if value is None:
        return ()
    if not isinstance(value, YamlSeq) or not all(isinstance(v, str) for v in value):
        check.add(m.value_line("members"), where, f"expected a list of the guest's interface names, got {describe(value)}")
        return ()
    for i, v in enumerate(value):
        if v in value[:i]:
            check.add(value.item_line(i), f"{where}[{i}]", f"'{v}' is listed twice")
    return tuple(dict.fromkeys(value))


# --------------------------------------------------------------------------- one guest


def check_guest(check: Checker, g: GuestSpec) -> None:
    """What a guest's tunnels and VRFs say of its other interfaces (their names are checked with the
    others', :func:`labctl.lab.netconf.check_guest`): a tunnel's ``dev`` and ``local`` are the
    guest's, a VRF's members are its interfaces (not a bond's or bridge's members), its routes and
    the guest's own go where they can."""
    enslaved = {x: m.name for m in g.masters if m.name for x in m.members}
    ifaces = connected(g, enslaved)
    names: dict[str, int] = {}
    for name, line in [(n.name, n.name_line) for n in g.nics if n.name] + [
            (v.name, v.line) for n in g.nics for v in n.vlans if v.name] + [
            (m.name, m.line) for m in g.masters if m.name] + [
            (v.name, v.line) for m in g.masters for v in m.vlans if v.name] + [
            (t.name, t.line) for t in g.tunnels] + [(v.name, v.line) for v in g.vrfs]:
        names.setdefault(name, line)
    own = {a.ip for addrs in ifaces.values() for a in addrs}
    for t in g.tunnels:
        dev = t.opt("dev")
        if dev is not None and (dev not in names or dev == t.name or dev in {v.name for v in g.vrfs}):
            check.add(t.line, f"{t.path}.dev", f"guest {g.name} has no interface '{dev}' to carry {t.name}"
                      + (close_match(dev, names) or f" (its interfaces: {', '.join(names) or 'none'})"))
        local = t.opt("local")
        if local is not None and ipaddress.ip_address(local) not in own:
            check.add(t.line, f"{t.path}.local", f"{local} is not an address of guest {g.name}")
    _check_vrfs(check, g, names, enslaved, ifaces)


def _check_vrfs(check: Checker, g: GuestSpec, names: dict[str, int], enslaved: dict[str, str],
                ifaces: dict[str, list[Address]]) -> None:
    owner: dict[str, str] = {}
    vrf_names = {v.name for v in g.vrfs}
    for v in g.vrfs:
        for member in v.members:
            where = f"{v.path}.members"
            if member in vrf_names or member not in names:
                check.add(v.line, where, f"'{member}' is not an interface of guest {g.name}"
                          + (close_match(member, set(names) - vrf_names) or ""))
            elif member in enslaved:
                check.add(v.line, where, f"{member} is a member of {enslaved[member]}: enslave {enslaved[member]} instead")
            elif member in owner:
                check.add(v.line, where, f"{member} is already in VRF {owner[member]}")
            else:
                owner[member] = v.name
        subnets = [a for x in v.members for a in ifaces.get(x, [])]
        for k, r in enumerate(v.routes):
            rpath = f"{v.path}.routes[{k}]"
            if r.dev is not None and r.dev not in v.members:
                check.add(r.line, f"{rpath}.dev", f"{r.dev} is not a member of VRF {v.name} "
                          f"(its members: {', '.join(v.members) or 'none'})")
            elif r.via is not None and not r.via.is_link_local and not any(
                    r.via in a.network for a in subnets if a.version == r.via.version):
                check.add(r.line, f"{rpath}.via", f"{r.via} is on none of VRF {v.name}'s subnets "
                          f"({', '.join(sorted({str(a.network) for a in subnets})) or 'its members have no address'})")
    for spec in g.routes:
        r = spec.route
        vrf = owner.get(r.dev or "") or next((owner[x] for x, addrs in ifaces.items() if x in owner and r.via is not None
                                              and any(r.via in a.network for a in addrs)), None)
        if vrf is not None:
            check.add(spec.lines.get("to", r.line), spec.path,
                      f"this route goes through VRF {vrf}'s interfaces: write it in vrfs.{vrf}.routes")


# --------------------------------------------------------------------------- across the lab


def _addresses(g: GuestSpec) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    out = {a.address.ip for n in g.nics for a in n.addresses}
    out |= {a.address.ip for n in g.nics for v in n.vlans for a in v.addresses}
    out |= {a.address.ip for m in g.masters for a in m.addresses}
    out |= {a.address.ip for m in g.masters for v in m.vlans for a in v.addresses}
    return out | {a.ip for t in g.tunnels for a in t.addresses}


def check_lab(check: Checker, guests: dict[str, GuestSpec]) -> None:
    """Across guests: a tunnel's remote is an address of another guest of the lab, a wireguard
    tunnel's peer is a wireguard tunnel whose peer it is, and a guest's VXLAN ids are its own."""
    addresses = {name: _addresses(g) for name, g in guests.items()}
    for g in guests.values():
        vnis: dict[tuple[str, str], str] = {}
        for t in g.tunnels:
            for key in KINDS[t.kind].remote_keys:
                _check_remote(check, t, key, g.name, addresses)
            if t.kind == "wireguard":
                _check_peer(check, t, g.name, guests)
            if t.kind == "vxlan":
                vni = (str(t.opt("vni")), str(t.opt("dstport")))
                if vni in vnis:
                    check.add(t.line, f"{t.path}.vni", f"VNI {vni[0]} on port {vni[1]} is {vnis[vni]}'s too: "
                              "a guest has one VXLAN device per VNI and port")
                vnis[vni] = t.name


def _check_remote(check: Checker, t: Tunnel, key: str, guest: str,
                  addresses: dict[str, set[ipaddress.IPv4Address | ipaddress.IPv6Address]]) -> None:
    text = t.opt(key)
    if text is None:
        return
    ip = ipaddress.ip_address(text)
    if ip in addresses.get(guest, set()):
        check.add(t.line, f"{t.path}.{key}", f"{ip} is an address of guest {guest} itself: a tunnel's {key} is "
                  "the other end's")
    elif not any(ip in addrs for addrs in addresses.values()):
        check.add(t.line, f"{t.path}.{key}", f"{ip} is not an address of the lab (a tunnel's {key} is an "
                  "address of another guest)")


def _check_peer(check: Checker, t: Tunnel, guest: str, guests: dict[str, GuestSpec]) -> None:
    peer = str(t.opt("peer"))
    name, _, tunnel = peer.partition(".")
    where = f"{t.path}.peer"
    other = guests.get(name)
    found = next((x for x in other.tunnels if x.name == tunnel), None) if other else None
    if other is None:
        check.add(t.line, where, f"the lab has no guest '{name}'{close_match(name, guests)}")
    elif name == guest:
        check.add(t.line, where, "a wireguard tunnel's peer is a tunnel of another guest")
    elif found is None or found.kind != "wireguard":
        check.add(t.line, where, f"guest {name} has no wireguard tunnel '{tunnel}'"
                  + close_match(tunnel, [x.name for x in other.tunnels if x.kind == "wireguard"]))
    elif found.opt("peer") != f"{guest}.{t.name}":
        check.add(t.line, where, f"{peer}'s peer is {found.opt('peer')}, not {guest}.{t.name}: the two ends name each other")
