"""The topology model: guests, NIC rows and networks from a resolved lab and runtime facts.

Pure: nothing is read, run or printed (see :mod:`labctl.net.graph` for the runtime facts' shape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NotRequired, TypedDict

from labctl.lab import DEFAULT_HOST, firewall_lines, nic_addresses, tunnel_lines
from labctl.net.plan import ALONE, DIRECT, SWITCH, UDP
from labctl.textsafe import safe_line

if TYPE_CHECKING:
    from labctl.lab import HostRecord, Lab
    from labctl.net.plan import SegmentRecord

MECHANISM_TEXT = {
    DIRECT: "direct link (unix-dgram)",
    SWITCH: "labctl L2 switch",
    UDP: "UDP tunnel",
    ALONE: "alone (no peer)",
}
# impairments in this order first, any others after them by name
IMPAIRMENT_ORDER = ("delay", "jitter", "loss", "duplicate", "corrupt", "reorder", "rate", "limit")


# -- the runtime facts (see labctl.net.graph): every key optional; read tolerantly all the same ------

class NicFacts(TypedDict, total=False):
    """What runtime knows of one NIC."""

    driver: str
    link: str | bool  # "up" | "down" (also True/False)
    impairments: Mapping[str, str | int | bool | None] | str  # Impairment.to_dict() values, or one string
    capture: bool
    captured: bool  # capture's older spelling
    vlan_offloads: Mapping[str, str]


class GuestFacts(TypedDict):
    """What runtime knows of one guest: its state, host and NICs."""

    nics: dict[str, NicFacts]
    state: NotRequired[str]
    host: NotRequired[str]


class NetworkFacts(TypedDict, total=False):
    """What runtime knows of one network."""

    mechanism: str
    capture: bool
    captured: bool


class Runtime(TypedDict, total=False):
    """The runtime facts :func:`topology` draws (:func:`runtime_from_state` builds them)."""

    guests: dict[str, GuestFacts]
    networks: dict[str, NetworkFacts]


@dataclass(frozen=True)
class VlanRow:
    """An 802.1Q sub-interface of a NIC, bond or bridge: its id, interface name and addresses."""

    id: int
    name: str
    addresses: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """``vlan 10 eth1.10: 10.10.0.1/24, fd00:10::1/64``."""
        return f"vlan {self.id} {self.name}" + (f": {', '.join(self.addresses)}" if self.addresses else "")


@dataclass(frozen=True)
class MasterRow:
    """A bond or bridge of a guest's lab NICs."""

    name: str
    kind: str  # "bond" or "bridge"
    members: tuple[str, ...]
    mode: str = ""
    addresses: tuple[str, ...] = ()
    vlans: tuple[VlanRow, ...] = ()

    @property
    def title(self) -> str:
        """``bond0 active-backup: eth2, eth3`` / ``br0 bridge: eth5, eth6``."""
        return f"{self.name} {self.mode or self.kind}: {', '.join(self.members)}"

    @property
    def address_text(self) -> str:
        return ", ".join(self.addresses) or "no address"


@dataclass(frozen=True)
class NicRow:
    """One lab NIC as drawn: the lab's facts plus what runtime knows of it.

    ``link`` is ``"up"``, ``"down"`` or None (unknown); ``impairments`` are
    ``(name, value)`` pairs in display order (value ``""`` for a bare flag).
    """

    name: str
    model: str
    network: str
    ip: str | None = None
    mac: str | None = None
    mtu: int | None = None
    queues: int = 1
    driver: str | None = None
    link: str | None = None
    impairments: tuple[tuple[str, str], ...] = ()
    captured: bool = False
    addresses: tuple[str, ...] = ()  # all of them (``ip`` is the first)
    vlans: tuple[VlanRow, ...] = ()
    master: str | None = None  # the bond or bridge it is a member of
    offloads: tuple[tuple[str, str], ...] = ()  # its VLAN offloads, as its guest said them
    xdp: str | None = None  # its XDP program's summary (labctl.lab.xdp.Xdp.summary)
    tc: str | None = None  # its tc program's (labctl.lab.xdp.Tc.summary)

    @property
    def down(self) -> bool:
        """True when the link is known to be down."""
        return self.link == "down"

    @property
    def impairment_text(self) -> str:
        """The impairments in force as short text, e.g. ``delay 20ms · loss 1%`` ('' when none)."""
        return " · ".join(f"{k} {v}" if v else k for k, v in self.impairments)

    @property
    def address_text(self) -> str:
        """Addresses (or the bond or bridge it is in), MTU and queue count as one short line."""
        parts = [f"in {self.master}" if self.master else ", ".join(self.addresses or ([self.ip] if self.ip else []))
                 or "no address"]
        if self.mtu is not None:
            parts.append(f"mtu {self.mtu}")
        if self.queues > 1:
            parts.append(f"{self.queues} queues")
        if self.xdp:
            parts.append(self.xdp)
        if self.tc:
            parts.append(self.tc)
        return " · ".join(parts)


@dataclass(frozen=True)
class GuestNode:
    """One guest: resources, host, runtime state and its NIC rows in lab order."""

    name: str
    nics: tuple[NicRow, ...]
    memory: int | None = None
    cpus: int | None = None
    host: str | None = None
    state: str | None = None
    shares: tuple[str, ...] = ()  # "MOUNT (ro)" / "MOUNT (rw)"
    masters: tuple[MasterRow, ...] = ()  # bonds, then bridges
    firewall: tuple[str, ...] = ()  # its firewall's summary lines (labctl.lab.ifaces.firewall_lines)
    tunnels: tuple[str, ...] = ()  # its tunnels and VRFs, a line each (labctl.lab.tunnels.views)

    @property
    def firewall_mark(self) -> str:
        """``firewall masquerade, dnat, input`` (what its firewall has, in short), or ''."""
        if not self.firewall:
            return ""
        kinds: list[str] = []
        for line in self.firewall:
            if line.startswith("nat: "):
                kinds += [r.split()[0] for r in line[5:].split("; ")]
            elif line.startswith("filter "):
                kinds.append(line.split()[1])
            elif line.startswith("nft file "):
                kinds.append(line.split()[2])
        return "firewall " + ", ".join(dict.fromkeys(kinds))

    @property
    def crashed(self) -> bool:
        """True when runtime says the guest crashed."""
        return self.state == "crashed"

    @property
    def info_text(self) -> str:
        """Host and resources as one short line."""
        parts = [f"host {self.host}"] if self.host else []
        if self.memory is not None:
            parts.append(f"{self.memory} MiB")
        if self.cpus is not None:
            parts.append(f"{self.cpus} CPU" + ("s" if self.cpus != 1 else ""))
        if self.shares:
            parts.append("shares " + ", ".join(self.shares))
        if self.firewall:
            parts.append(self.firewall_mark)
        parts += list(self.tunnels)
        return " · ".join(parts)


@dataclass(frozen=True)
class NetworkNode:
    """One lab network and the ``(guest, nic)`` members attached to it."""

    name: str
    members: tuple[tuple[str, str], ...]
    mtu: int | None = None
    description: str = ""
    mechanism: str | None = None
    captured: bool = False
    tags: tuple[int, ...] = ()  # the VLAN ids its members' NICs carry

    @property
    def mechanism_text(self) -> str:
        """The mechanism in words ('' when unknown)."""
        if not self.mechanism:
            return ""
        return MECHANISM_TEXT.get(self.mechanism, self.mechanism)

    @property
    def detail_lines(self) -> list[str]:
        """The lines under the network's name: mechanism, MTU and description (those known)."""
        lines = [t for t in (self.mechanism_text, f"mtu {self.mtu}" if self.mtu is not None else "",
                             "vlans " + ", ".join(str(t) for t in self.tags) if self.tags else "") if t]
        return lines + ([self.description] if self.description else [])


@dataclass(frozen=True)
class Topology:
    """A lab's guests and networks, in lab order."""

    name: str
    guests: tuple[GuestNode, ...]
    networks: tuple[NetworkNode, ...]
    description: str = ""

    def guest(self, name: str) -> GuestNode:
        """The guest called ``name``; raises KeyError if there is none."""
        for g in self.guests:
            if g.name == name:
                return g
        raise KeyError(name)

    def network(self, name: str) -> NetworkNode:
        """The network called ``name``; raises KeyError if there is none."""
        for n in self.networks:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def has_marks(self) -> bool:
        """True when any runtime mark (capture, impairment, link down, crash) is drawn."""
        nics = [n for g in self.guests for n in g.nics]
        return (any(g.crashed for g in self.guests) or any(n.captured for n in self.networks)
                or any(n.captured or n.impairments or n.down for n in nics))


# The lab side is ``Lab.to_dict()`` as any labctl wrote it (a state file, a bundle's manifest): read as
# plain JSON, every value checked before it is used.

def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: object) -> Sequence[object]:
    return value if isinstance(value, Sequence) and not isinstance(value, str) else ()


def _str(value: object) -> str | None:
    return str(value) if isinstance(value, str | int | float) and not isinstance(value, bool) and str(value) else None


def _guest_str(value: object) -> str | None:
    """A string the guest wrote (a READY line's driver): control characters shown escaped."""
    text = _str(value)
    return safe_line(text) if text is not None else None


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _flag(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("1", "yes", "true", "on"))


def _link(value: object) -> str | None:
    if isinstance(value, bool):
        return "up" if value else "down"
    if isinstance(value, str) and value.lower() in ("up", "down"):
        return value.lower()
    return None


def _impairments(value: object) -> tuple[tuple[str, str], ...]:
    """Impairments as ordered ``(name, value)`` pairs; a string is kept as one entry."""
    if isinstance(value, str):
        return ((value, ""),) if value.strip() else ()
    pairs = []
    for key, val in _map(value).items():
        if val is None or val is False or val == "":
            continue
        pairs.append((str(key), "" if val is True else str(val)))

    def rank(pair: tuple[str, str]) -> tuple[int, str]:
        name = pair[0]
        return (IMPAIRMENT_ORDER.index(name), "") if name in IMPAIRMENT_ORDER else (len(IMPAIRMENT_ORDER), name)

    return tuple(sorted(pairs, key=rank))


def _vlan_rows(value: object) -> tuple[VlanRow, ...]:
    out = []
    for item in _seq(value):
        v = _map(item)
        vid = _int(v.get("id"))
        if vid is not None:
            out.append(VlanRow(vid, _str(v.get("name")) or "?", tuple(nic_addresses(v))))
    return tuple(out)


def _master_rows(guest: Mapping[str, object]) -> tuple[MasterRow, ...]:
    out = []
    for kind in ("bonds", "bridges"):
        for item in _seq(guest.get(kind)):
            m = _map(item)
            names = tuple(str(x) for x in _seq(m.get("members")))
            out.append(MasterRow(_str(m.get("name")) or "?", "bond" if kind == "bonds" else "bridge", names,
                                 _str(m.get("mode")) or "", tuple(nic_addresses(m)), _vlan_rows(m.get("vlans"))))
    return tuple(out)


def _offloads(value: object) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), _guest_str(v) or "") for k, v in _map(value).items())


def _nic_row(nic: Mapping[str, object], facts: NicFacts, lab_captured: bool = False,
             master: str | None = None) -> NicRow:
    """A NIC row: runtime facts first, else what the lab file says (its ``impair``, its network's ``capture``)."""
    xdp, tc = nic.get("xdp"), nic.get("tc")
    return NicRow(
        name=_str(nic.get("name")) or "?",
        model=_str(nic.get("model")) or "?",
        network=_str(nic.get("network")) or "?",
        ip=_str(nic.get("ip")),
        mac=_str(nic.get("mac")),
        mtu=_int(nic.get("mtu")),
        queues=_int(nic.get("queues")) or 1,
        driver=_guest_str(facts.get("driver")),
        link=_link(facts.get("link")),
        impairments=_impairments(facts["impairments"] if "impairments" in facts else nic.get("impair")),
        captured=_flag(facts.get("capture", facts.get("captured"))) or lab_captured,
        addresses=tuple(nic_addresses(nic)),
        vlans=_vlan_rows(nic.get("vlans")),
        master=master,
        offloads=_offloads(facts.get("vlan_offloads")),
        xdp=safe_line(str(xdp.get("summary") or "XDP")) if isinstance(xdp, Mapping) else None,
        tc=safe_line(str(tc.get("summary") or "tc")) if isinstance(tc, Mapping) else None,
    )


def _nic_facts(facts: GuestFacts, nic: str) -> NicFacts:
    """Runtime's facts of a guest's NIC, when they are a mapping at all."""
    nics = facts.get("nics")
    found = nics.get(nic) if isinstance(nics, dict) else None
    return found if isinstance(found, dict) else NicFacts()


def _guest_node(name: str, guest: Mapping[str, object], facts: GuestFacts, show_host: bool,
                captured: frozenset[tuple[str, str]] = frozenset()) -> GuestNode:
    """A guest; its lab host is shown only when the lab places guests on hosts (runtime's always)."""
    nics = [n for n in _seq(guest.get("nics")) if isinstance(n, Mapping)]
    masters = _master_rows(guest)
    master_of = {member: m.name for m in masters for member in m.members}
    rows = tuple(_nic_row(n, _nic_facts(facts, str(n.get("name"))), (name, str(n.get("name"))) in captured,
                          master_of.get(str(n.get("name"))))
                 for n in nics)
    return GuestNode(name=name, nics=rows, masters=masters, memory=_int(guest.get("memory")), cpus=_int(guest.get("cpus")),
                     host=_str(facts.get("host")) or (_str(guest.get("host")) if show_host else None),
                     state=_str(facts.get("state")),
                     shares=tuple(f"{sh.get('mount')} ({'rw' if sh.get('writable') is True else 'ro'})"
                                  for sh in _seq(guest.get("shares")) if isinstance(sh, Mapping)),
                     firewall=tuple(safe_line(x) for x in firewall_lines(guest)),
                     tunnels=tuple(safe_line(x) for x in tunnel_lines(guest)))


def _host_is_remote(uri: object) -> bool:
    from labctl.lab import parse_uri

    try:
        return isinstance(uri, str) and parse_uri(uri).remote
    except ValueError:
        return False


def planned_mechanism(members: Sequence[tuple[str, str]], guest_hosts: Mapping[str, str | None],
                      host_uris: Mapping[str, str]) -> str | None:
    """The mechanism labctl plans for a network with ``members`` (None: labctl would refuse it).

    ``guest_hosts`` maps guests to their lab host names (None: the default
    host); ``host_uris`` are the lab's hosts. A host the lab does not define
    is taken to be this machine.
    """
    if len(members) < 2:
        return ALONE
    uris = {host_uris.get(h or "", f"local:{h}") for h in (guest_hosts.get(g) for g, _ in members)}
    if len(uris) > 1 or any(_host_is_remote(u) for u in uris):
        return UDP if len(members) == 2 else None
    return DIRECT if len(members) == 2 else SWITCH


def _members(name: str, net: Mapping[str, object], guests: Sequence[GuestNode]) -> tuple[tuple[str, str], ...]:
    listed = net.get("members")
    if isinstance(listed, Sequence) and not isinstance(listed, str):
        pairs = [tuple(m) for m in listed if isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 2]
        return tuple((str(g), str(n)) for g, n in pairs)
    return tuple((g.name, nic.name) for g in guests for nic in g.nics if nic.network == name)


def topology(lab: Mapping[str, object] | Lab, runtime: Runtime | None = None) -> Topology:
    """The topology of ``lab`` (``Lab.to_dict()``, or a Lab), with ``runtime`` facts if given.

    Guests show their host only when the lab uses hosts (or runtime names
    one). Tolerates missing keys in both. A network a NIC names but the lab does
    not define is added after the lab's networks.
    """
    data: Mapping[str, object] = _map(lab) if isinstance(lab, Mapping) or not hasattr(lab, "to_dict") else lab.to_dict()
    rt: Runtime = runtime if isinstance(runtime, dict) else {}
    lab_guests = _map(data.get("guests"))
    lab_hosts = {str(k): _str(_map(v).get("host")) for k, v in lab_guests.items()}
    host_uris = {str(k): str(_map(v).get("uri", "")) for k, v in _map(data.get("hosts")).items()}
    shown = bool(host_uris) or any(h not in (None, DEFAULT_HOST) for h in lab_hosts.values())
    nets = {str(k): _map(v) for k, v in _map(data.get("networks")).items()}
    captured = frozenset(_lab_captured(nets))
    guests = tuple(_guest_node(str(name), _map(g), _guest_facts(rt, str(name)), shown, captured)
                   for name, g in lab_guests.items())
    for g in guests:
        for nic in g.nics:
            nets.setdefault(nic.network, {})
    networks = []
    for name, net in nets.items():
        members = _members(name, net, guests)
        facts = _network_facts(rt, name)
        mechanism = _str(facts.get("mechanism")) or planned_mechanism(members, lab_hosts, host_uris)
        whole = bool(members) and all(m in captured for m in members)
        tags = sorted({v.id for g in guests for n in g.nics if n.network == name
                       for v in (*n.vlans, *(v for m in g.masters if n.name in m.members for v in m.vlans))})
        networks.append(NetworkNode(name=name, members=members, mtu=_int(net.get("mtu")),
                                    description=_str(net.get("description")) or "", mechanism=mechanism,
                                    captured=_flag(facts.get("capture", facts.get("captured"))) or whole,
                                    tags=tuple(tags)))
    return Topology(name=_str(data.get("name")) or "lab", guests=guests, networks=tuple(networks),
                    description=_str(data.get("description")) or "")


def _guest_facts(rt: Runtime, guest: str) -> GuestFacts:
    """Runtime's facts of a guest, when they are a mapping at all."""
    guests = rt.get("guests")
    found = guests.get(guest) if isinstance(guests, dict) else None
    return found if isinstance(found, dict) else {"nics": {}}


def _network_facts(rt: Runtime, network: str) -> NetworkFacts:
    """Runtime's facts of a network, when they are a mapping at all."""
    networks = rt.get("networks")
    found = networks.get(network) if isinstance(networks, dict) else None
    return found if isinstance(found, dict) else NetworkFacts()


def _lab_captured(nets: Mapping[str, Mapping[str, object]]) -> list[tuple[str, str]]:
    """The (guest, nic) members the lab's networks capture (``Network.to_dict()['capture']``)."""
    out = []
    for net in nets.values():
        for m in _seq(net.get("capture")):
            if isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 2:
                out.append((str(m[0]), str(m[1])))
    return out


def runtime_from_state(drivers: Mapping[str, Mapping[str, str]] | None = None,
                       networks: Mapping[str, SegmentRecord] | None = None,
                       hosts: Mapping[str, HostRecord] | None = None,
                       states: Mapping[str, str] | None = None,
                       impair: Mapping[str, Mapping[str, str | int]] | None = None,
                       links: Mapping[str, str] | None = None,
                       captures: Sequence[str] = (),
                       offloads: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None) -> Runtime:
    """The runtime dict from what ``labctl up`` records.

    :param drivers: ``LabState.drivers`` (guest -> NIC -> driver; '' = unknown).
    :param networks: ``LabState.networks`` (network -> ``Segment.to_dict()``; its ``mechanism``).
    :param hosts: ``LabState.hosts`` (guest -> host dict with a ``name``).
    :param states: guest -> state (e.g. from ``GuestStatus.state``).
    :param impair: ``network.json``'s impairments in force (``guest.nic`` -> values); with it,
        NICs it does not name show none.
    :param links: ``network.json``'s links (``guest.nic`` -> ``down``).
    :param captures: ``guest.nic`` of every capture running.
    :param offloads: ``LabState.offloads`` (guest -> NIC -> its VLAN offloads).
    """
    guests: dict[str, GuestFacts] = {}
    for guest, nics in _map(drivers).items():
        entry = guests.setdefault(str(guest), {"nics": {}})
        for nic, driver in _map(nics).items():
            if driver:
                entry["nics"][str(nic)] = {"driver": str(driver)}
    for guest, nics in _map(offloads).items():
        entry = guests.setdefault(str(guest), {"nics": {}})
        for nic, features in _map(nics).items():
            entry["nics"].setdefault(str(nic), {})["vlan_offloads"] = dict(features) if isinstance(features, Mapping) else {}
    for guest, host in _map(hosts).items():
        if _str(_map(host).get("name")):
            guests.setdefault(str(guest), {"nics": {}})["host"] = str(_map(host)["name"])
    for guest, state in _map(states).items():
        if state:
            guests.setdefault(str(guest), {"nics": {}})["state"] = str(state)
    nets: dict[str, NetworkFacts] = {str(n): {"mechanism": str(_map(seg)["mechanism"])}
                                     for n, seg in _map(networks).items() if _str(_map(seg).get("mechanism"))}
    known = {f"{g}.{n}" for g, e in guests.items() for n in e["nics"]}
    named = set(_map(impair)) | set(_map(links)) | set(captures) | known
    for key in named:
        guest, _, nic = key.partition(".")
        facts = guests.setdefault(guest, {"nics": {}})["nics"].setdefault(nic, {})
        if impair is not None:
            values = _map(impair).get(key)
            facts["impairments"] = dict(values) if isinstance(values, Mapping) else {}
        if key in _map(links):
            facts["link"] = str(_map(links)[key])
        if key in captures:
            facts["capture"] = True
    return {"guests": guests, "networks": nets}
