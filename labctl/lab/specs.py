"""The lab file's guests, NICs and networks as read, before they are resolved into the model.

Fields are None where the file's value was invalid (a problem was reported).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labctl.lab.firewall import Firewall
from labctl.lab.ifaces import Address, Route, Sysctl
from labctl.lab.impair import Impairment
from labctl.lab.kernels import KernelSpec
from labctl.lab.model import DEFAULT_HOST
from labctl.lab.shares import Share
from labctl.lab.tunnels.devices import Tunnel, Vrf
from labctl.lab.xdp import Tc, Xdp


@dataclass(frozen=True)
class AddrSpec:
    """One address as read, with where it is written (``path``: ``guests.a.nics[0].ip[1]``)."""

    address: Address
    line: int
    path: str


@dataclass
class VlanSpec:
    """An 802.1Q sub-interface as read (of a NIC, bond or bridge called ``parent``)."""

    id: int
    name: str | None  # None: the name was invalid (reported)
    parent: str
    addresses: list[AddrSpec]
    line: int
    path: str
    name_line: int = 0


@dataclass
class MasterSpec:
    """A bond or bridge as read; ``members`` are names of the guest's lab NICs (checked later)."""

    kind: str  # "bond" or "bridge"
    name: str | None  # None: the name was invalid (reported)
    members: tuple[str, ...]
    members_line: int
    addresses: list[AddrSpec]
    vlans: list[VlanSpec]
    line: int
    path: str
    mode: str = ""
    miimon: int = 0
    primary: str | None = None
    primary_line: int = 0


@dataclass(frozen=True)
class RouteSpec:
    """A route as read: its path and the lines of its keys (``to``, ``via``, ``dev``)."""

    route: Route
    path: str
    lines: dict[str, int]


@dataclass
class NicSpec:
    """A NIC as read from the file; fields are None where invalid."""

    guest: str
    index: int
    path: str
    line: int
    name: str | None
    name_line: int
    model: str | None
    network: str | None
    addresses: list[AddrSpec]
    ip_line: int
    mac: str | None
    mac_line: int
    queues: int
    mtu: int | None
    impair: Impairment | None = None
    vlans: list[VlanSpec] = field(default_factory=list)
    xdp: Xdp | None = None
    tc: Tc | None = None

    @property
    def label(self) -> str:
        """``guest.nic`` for messages (``guest.nics[i]`` if the name is bad)."""
        return f"{self.guest}.{self.name or f'nics[{self.index}]'}"


@dataclass
class GuestSpec:
    """A guest as read from the file."""

    name: str
    memory: int
    cpus: int
    kernel_args: tuple[str, ...]
    nics: list[NicSpec]
    line: int
    host: str = DEFAULT_HOST
    host_line: int = 0
    kernel: KernelSpec | None = None
    setup: tuple[str, ...] = ()
    shares: tuple[Share, ...] = ()
    masters: list[MasterSpec] = field(default_factory=list)  # bonds, then bridges
    routes: list[RouteSpec] = field(default_factory=list)
    sysctls: list[tuple[Sysctl, str]] = field(default_factory=list)  # with each one's path
    firewall: Firewall | None = None
    tunnels: tuple[Tunnel, ...] = ()  # labctl.lab.tunnels
    vrfs: tuple[Vrf, ...] = ()
    record: bool = False


@dataclass
class NetSpec:
    """A network as read from the file."""

    name: str
    mtu: int | None
    description: str
    line: int
    capture_all: bool = False  # capture: true
    capture: tuple[str, ...] = ()  # capture: [GUEST.NIC, ...]
    capture_line: int = 0


