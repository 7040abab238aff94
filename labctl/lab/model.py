"""The resolved lab model: what the rest of labctl consumes.

Instances are produced by :func:`labctl.lab.load.load_lab` after validation,
so every value here is checked and every default filled in.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from labctl.lab.ifaces import (
    Address,
    Bond,
    BondRecord,
    Bridge,
    BridgeRecord,
    GuestSysctlRecord,
    Route,
    RouteRecord,
    Sysctl,
    Vlan,
    VlanRecord,
    address_keys,
    first_ip,
)
from labctl.lab.impair import Impairment
from labctl.lab.kernels import KernelSpec
from labctl.lab.nics import NIC_MODELS, NicModel
from labctl.lab.shares import Share, ShareRecord
from labctl.names import LAB_NAME, LAB_NAME_RULE  # a leaf (the state reads it)

if TYPE_CHECKING:
    from labctl.lab.firewall import Firewall, FirewallRecord
    from labctl.lab.tunnels.devices import Tunnel, TunnelRecord, Vrf, VrfRecord
    from labctl.lab.xdp import Tc, TcRecord, Xdp, XdpRecord

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_IMAGE",
    "MGMT_NIC",
    "MGMT_SUBNET",
    "Check",
    "CheckRecord",
    "Guest",
    "GuestRecord",
    "Host",
    "HostRecord",
    "Lab",
    "LabNetworkRecord",
    "LabRecord",
    "Network",
    "Nic",
    "NicRecord",
]

DEFAULT_IMAGE = "debian-12"
"""The image a lab runs on when it names none (``images/debian-12/recipe.toml``)."""

DEFAULT_HOST = "local"
"""Host of guests that name none: the backend's own libvirt URI unless ``hosts`` defines it."""

MGMT_NIC = "mgmt0"
"""Interface name of labctl's own management NIC in every guest (reserved)."""

MGMT_SUBNET = ipaddress.IPv4Network("10.0.2.0/24")
"""Subnet of labctl's management network (lab NICs may not use it)."""


class NicRecord(TypedDict):
    """:meth:`Nic.to_dict`: a NIC in a lab's recorded state (an older labctl's has no ``addresses``,
    ``vlans``, ``xdp`` or ``tc``: :mod:`labctl.lab.ifaces`' views tolerate it)."""

    name: str
    model: str
    network: str
    ip: str | None
    addresses: list[str]
    vlans: list[VlanRecord]
    mac: str
    queues: int
    mtu: int | None
    index: int
    impair: dict[str, str | int] | None
    xdp: NotRequired[XdpRecord]
    tc: NotRequired[TcRecord]


class LabNetworkRecord(TypedDict):
    """:meth:`Network.to_dict`: ``members`` and ``capture`` as ``[guest, nic]`` pairs."""

    name: str
    mtu: int | None
    description: str
    members: list[list[str]]
    capture: list[list[str]]


class GuestRecord(TypedDict):
    """:meth:`Guest.to_dict`: a guest in a lab's recorded state (``Lab.to_dict()['guests']``)."""

    name: str
    memory: int
    cpus: int
    kernel_args: list[str]
    host: str
    kernel: dict[str, str] | None
    setup: list[str]
    shares: list[ShareRecord]
    nics: list[NicRecord]
    bonds: list[BondRecord]
    bridges: list[BridgeRecord]
    routes: list[RouteRecord]
    sysctls: list[GuestSysctlRecord]
    firewall: FirewallRecord | None
    tunnels: NotRequired[list[TunnelRecord]]
    vrfs: NotRequired[list[VrfRecord]]


class HostRecord(TypedDict):
    """:meth:`Host.to_dict`."""

    name: str
    uri: str
    address: str | None


class CheckRecord(TypedDict):
    """:meth:`Check.to_dict` (``kind`` only when not ``shell``)."""

    name: str
    guest: str
    command: str
    hint: str
    timeout: float
    kind: NotRequired[str]


class LabRecord(TypedDict):
    """:meth:`Lab.to_dict`: the resolved lab as a lab's state and a bundle's manifest record it."""

    name: str
    source: str
    sha256: str
    image: str
    kernel: dict[str, str] | None
    backend: str
    description: str
    networks: dict[str, LabNetworkRecord]
    hosts: dict[str, HostRecord]
    guests: dict[str, GuestRecord]
    steps: list[dict[str, object]]  # dataclasses.asdict of each labctl.lab.stepspec.Step, recorded as it is
    checks: list[CheckRecord]
    instance: str | None
    drops: bool


@dataclass(frozen=True)
class Nic:
    """One lab NIC of a guest.

    ``model`` is the canonical NIC model name; ``addresses`` its IPv4 and IPv6
    addresses in file order; ``vlans`` its 802.1Q sub-interfaces; ``mac`` is lower-case
    ``xx:xx:xx:xx:xx:xx``; ``mtu`` is the NIC's own MTU or else its
    network's (None: leave the default); ``index`` is the 0-based position
    in the guest's ``nics`` list; ``line`` is where the NIC starts in the file (``ip_line``: its
    ``ip``); ``impair`` is what netem does to its egress from ``up`` to ``down`` (None: nothing).
    """

    name: str
    model: str
    network: str
    addresses: tuple[Address, ...]
    mac: str
    queues: int
    mtu: int | None
    index: int
    line: int = 0
    impair: Impairment | None = None
    vlans: tuple[Vlan, ...] = ()
    ip_line: int = 0
    xdp: Xdp | None = None  # an XDP program attached once the guest is up (labctl.lab.xdp)
    tc: Tc | None = None  # a tc BPF program (clsact) attached once the guest is up

    @property
    def ip(self) -> Address | None:
        """The NIC's first IPv4 address, else its first address (None: it has none)."""
        return first_ip(self.addresses)

    @property
    def nic_model(self) -> NicModel:
        """The registry entry for this NIC's model."""
        return NIC_MODELS[self.model]

    def to_dict(self) -> NicRecord:
        """JSON-serialisable view (``ip``: :attr:`ip` as ``"a.b.c.d/len"`` or None; ``addresses``: all)."""
        out: NicRecord = {
            "name": self.name,
            "model": self.model,
            "network": self.network,
            "ip": str(self.ip) if self.ip is not None else None,
            "addresses": [str(a) for a in self.addresses],
            "vlans": [v.to_dict() for v in self.vlans],
            "mac": self.mac,
            "queues": self.queues,
            "mtu": self.mtu,
            "index": self.index,
            "impair": self.impair.to_dict() if self.impair else None,
        }
        if self.xdp:
            out["xdp"] = self.xdp.to_dict()
        if self.tc:
            out["tc"] = self.tc.to_dict()
        return out


@dataclass(frozen=True)
class Network:
    """One lab network (an isolated L2 segment).

    ``members`` are the ``(guest, nic)`` names attached to it, in lab order;
    ``capture`` the members whose traffic every step captures.
    """

    name: str
    mtu: int | None
    members: tuple[tuple[str, str], ...]
    description: str = ""
    line: int = 0
    capture: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> LabNetworkRecord:
        """JSON-serialisable view."""
        return {
            "name": self.name,
            "mtu": self.mtu,
            "description": self.description,
            "members": [list(member) for member in self.members],
            "capture": [list(member) for member in self.capture],
        }


@dataclass(frozen=True)
class Guest:
    """One guest VM: resources, lab NICs (in file order) and extra kernel args."""

    name: str
    memory: int
    cpus: int
    nics: tuple[Nic, ...]
    kernel_args: tuple[str, ...]
    line: int
    host: str = DEFAULT_HOST
    kernel: KernelSpec | None = None  # the guest's own kernel (else the lab's, else the image's)
    setup: tuple[str, ...] = ()  # shell commands run once it is up, before its post-boot snapshot
    shares: tuple[Share, ...] = ()  # host directories it sees (virtio-9p), mounted once it is up
    bonds: tuple[Bond, ...] = ()  # bonds of its lab NICs
    bridges: tuple[Bridge, ...] = ()  # bridges of its lab NICs
    routes: tuple[Route, ...] = ()  # static routes, in file order
    sysctls: tuple[Sysctl, ...] = ()  # set in file order before up returns
    firewall: Firewall | None = None  # nftables rules loaded (checked by nft -c first) before up returns
    tunnels: tuple[Tunnel, ...] = ()  # tunnel devices made once it answers SSH (labctl.up.tunnels)
    vrfs: tuple[Vrf, ...] = ()  # VRF devices, their members and routes, made with the tunnels
    record: bool = False  # runs under QEMU's record/replay (labctl.replay): labctl run --record, or record: true

    @property
    def networked(self) -> bool:
        """Whether it has network settings beyond its NICs' links and addresses (VLANs, bonds,
        bridges, routes, sysctls, a firewall)."""
        return bool(self.bonds or self.bridges or self.routes or self.sysctls or self.firewall or self.tunnels or self.vrfs
                    or any(n.vlans for n in self.nics))

    def tagged_nics(self) -> list[str]:
        """Its NICs whose frames carry VLAN tags: those with VLANs, and members of a bond or bridge
        with VLANs, in NIC order."""
        masters: list[Bond | Bridge] = [*self.bonds, *self.bridges]
        members = {m for master in masters if master.vlans for m in master.members}
        return [n.name for n in self.nics if n.vlans or n.name in members]

    def interfaces(self) -> list[tuple[str, tuple[Address, ...]]]:
        """Every lab interface (NICs, VLANs, bonds, bridges) with its addresses, NICs first."""
        out: list[tuple[str, tuple[Address, ...]]] = []
        holders: list[Nic | Bond | Bridge] = [*self.nics, *self.bonds, *self.bridges]
        for holder in holders:
            out.append((holder.name, holder.addresses))
            out += [(v.name, v.addresses) for v in holder.vlans]
        return out + [(t.name, t.addresses) for t in self.tunnels]

    def address_keys(self) -> dict[str, str]:
        """``{{GUEST.IFACE.ip}}``, ``.ip4`` and ``.ip6`` of its interfaces (:func:`~labctl.lab.ifaces.address_keys`)."""
        return address_keys(self.name, self.interfaces())

    def nic(self, name: str) -> Nic:
        """The NIC called ``name``; raises KeyError if there is none."""
        for nic in self.nics:
            if nic.name == name:
                return nic
        raise KeyError(name)

    def to_dict(self) -> GuestRecord:
        """JSON-serialisable view."""
        out: GuestRecord = {
            "name": self.name,
            "memory": self.memory,
            "cpus": self.cpus,
            "kernel_args": list(self.kernel_args),
            "host": self.host,
            "kernel": self.kernel.to_dict() if self.kernel else None,
            "setup": list(self.setup),
            "shares": [sh.to_dict() for sh in self.shares],
            "nics": [nic.to_dict() for nic in self.nics],
            "bonds": [b.to_dict() for b in self.bonds],
            "bridges": [b.to_dict() for b in self.bridges],
            "routes": [r.to_dict() for r in self.routes],
            "sysctls": [{"name": s.name, "value": s.value} for s in self.sysctls],
            "firewall": self.firewall.to_dict() if self.firewall else None,
        }
        if self.tunnels:
            out["tunnels"] = [t.to_dict() for t in self.tunnels]
        if self.vrfs:
            out["vrfs"] = [v.to_dict() for v in self.vrfs]
        return out


@dataclass(frozen=True)
class Host:
    """A libvirt host guests can be placed on.

    ``uri`` is a checked libvirt URI; ``address`` is where UDP tunnels from
    other hosts reach it (None: the URI's host name, 127.0.0.1 when local).
    """

    name: str
    uri: str
    address: str | None = None
    line: int = 0

    def to_dict(self) -> HostRecord:
        """JSON-serialisable view."""
        return {"name": self.name, "uri": self.uri, "address": self.address}


@dataclass(frozen=True)
class Check:
    """A graded check: ``command`` on ``guest`` exits 0 when the exercise is done; for a check of
    kind ``drgn``, ``command`` is an expression on the guest's kernel that is true then
    (:mod:`labctl.lab.drgnexpr`)."""

    name: str
    guest: str
    command: str
    hint: str = ""
    timeout: float = 30.0
    line: int = 0
    kind: str = "shell"  # shell, drgn

    def to_dict(self) -> CheckRecord:
        out: CheckRecord = {"name": self.name, "guest": self.guest, "command": self.command, "hint": self.hint,
                            "timeout": self.timeout}
        if self.kind != "shell":
            out["kind"] = self.kind
        return out


@dataclass(frozen=True)
class Lab:
    """A validated, fully resolved lab.

    ``source`` is the file path as given; ``sha256`` the hex digest of the
    file's bytes; ``text`` its decoded content; ``networks`` and ``guests``
    keep file order.
    """

    name: str
    source: str
    sha256: str
    image: str
    backend: str
    description: str
    networks: dict[str, Network]
    guests: dict[str, Guest]
    text: str = field(repr=False)
    steps: tuple[Any, ...] = ()  # tuple[labctl.lab.stepspec.Step, ...]
    hosts: dict[str, Host] = field(default_factory=dict)
    kernel: KernelSpec | None = None  # every guest's kernel, unless a guest names its own (None: the image's)
    checks: tuple[Check, ...] = ()
    instance: str | None = None  # one of several copies of the lab on this host (``up --instance``)
    drops: bool = True  # every step records the skbs each guest's kernel dropped (``drops: false``: not)

    @property
    def ident(self) -> str:
        """What names this copy of the lab while it is up: ``NAME`` or ``NAME@INSTANCE``."""
        return f"{self.name}@{self.instance}" if self.instance else self.name

    def with_instance(self, instance: str | None) -> Lab:
        """This lab as instance ``instance`` (None: the lab itself).

        :raise ValueError: when ``instance`` breaks the lab-name rule.
        """
        if instance is not None and not LAB_NAME.fullmatch(instance):
            raise ValueError(f"invalid instance name {instance!r} ({LAB_NAME_RULE})")
        return dataclasses.replace(self, instance=instance)

    def placed_on(self, host: str) -> Lab:
        """This lab with its guests that name no host on ``host`` (``class up`` spreading instances).

        :raise ValueError: for a host the lab does not define.
        """
        if host not in self.hosts:
            raise ValueError(f"the lab defines no host '{host}' (its hosts: {', '.join(self.hosts)})")
        guests = {n: dataclasses.replace(g, host=host) if g.host == DEFAULT_HOST else g
                  for n, g in self.guests.items()}
        return dataclasses.replace(self, guests=guests)

    def kernel_of(self, guest: str) -> KernelSpec | None:
        """The kernel ``guest`` boots: its own, else the lab's; None for the image's default kernel."""
        return self.guests[guest].kernel or self.kernel

    def with_kernel(self, spec: KernelSpec) -> Lab:
        """This lab with every guest on ``spec`` (``--kernel``)."""
        guests = {n: dataclasses.replace(g, kernel=None) for n, g in self.guests.items()}
        return dataclasses.replace(self, kernel=spec, guests=guests)

    def with_share(self, guest: str, share: Share) -> Lab:
        """This lab with ``share`` added to ``guest`` (``--share``).

        :raise ValueError: for a guest the lab lacks, or a mount point the guest already shares.
        """
        if guest not in self.guests:
            raise ValueError(f"the lab has no guest '{guest}' (its guests: {', '.join(self.guests)})")
        g = self.guests[guest]
        if any(s.mount == share.mount for s in g.shares):
            raise ValueError(f"guest {guest} already shares {share.mount}")
        guests = dict(self.guests)
        guests[guest] = dataclasses.replace(g, shares=(*g.shares, share))
        return dataclasses.replace(self, guests=guests)

    @property
    def uses_hosts(self) -> bool:
        """True when the lab places guests on named libvirt hosts."""
        return bool(self.hosts) or any(g.host != DEFAULT_HOST for g in self.guests.values())

    def to_dict(self) -> LabRecord:
        """JSON-serialisable resolved view (no raw text; ips as strings)."""
        return {
            "name": self.name,
            "source": self.source,
            "sha256": self.sha256,
            "image": self.image,
            "kernel": self.kernel.to_dict() if self.kernel else None,
            "backend": self.backend,
            "description": self.description,
            "networks": {name: net.to_dict() for name, net in self.networks.items()},
            "hosts": {name: host.to_dict() for name, host in self.hosts.items()},
            "guests": {name: guest.to_dict() for name, guest in self.guests.items()},
            "steps": [dataclasses.asdict(s) for s in self.steps],
            "checks": [c.to_dict() for c in self.checks],
            "instance": self.instance,
            "drops": self.drops,
        }
