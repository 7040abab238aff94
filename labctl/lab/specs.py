"""The lab file's guests, NICs and networks as read, before they are resolved into the model.

Fields are None where the file's value was invalid (a problem was reported).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from labctl.lab.impair import Impairment
from labctl.lab.kernels import KernelSpec
from labctl.lab.model import DEFAULT_HOST
from labctl.lab.shares import Share


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
    ip: ipaddress.IPv4Interface | None
    ip_line: int
    mac: str | None
    mac_line: int
    queues: int
    mtu: int | None
    impair: Impairment | None = None

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


