"""Where each guest runs: the lab's hosts resolved against the backend's default URI.

A guest without ``host:`` runs on host ``local``: the lab's ``hosts.local``
if it defines one, else the backend's own libvirt URI. Two host names with
the same URI are the same machine (their guests can share unix sockets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from labctl.lab.model import DEFAULT_HOST, Lab
from labctl.lab.uri import SshHop, parse_uri, with_no_verify


class HostRecord(TypedDict):
    """:meth:`HostPlace.to_dict`: a guest's host as ``state.json`` (``hosts``) keeps it."""

    name: str
    uri: str
    address: str
    remote: bool


@dataclass(frozen=True)
class HostPlace:
    """One libvirt host as a guest plan needs it."""

    name: str
    uri: str
    address: str  # where UDP tunnels from other hosts reach it
    remote: bool  # qemu+ssh: images in a storage pool, console by stream, SSH through the host

    @property
    def ssh_hop(self) -> SshHop | None:
        """The SSH account of a remote host (None when local)."""
        return parse_uri(self.uri).ssh_hop()

    def to_dict(self) -> HostRecord:
        return {"name": self.name, "uri": self.uri, "address": self.address, "remote": self.remote}


def host_place(name: str, uri: str, address: str | None = None) -> HostPlace:
    """A host from its name, URI and optional tunnel address.

    :raise ValueError: for a URI labctl cannot use.
    """
    parsed = parse_uri(uri)
    return HostPlace(name, uri, address or parsed.default_address, parsed.remote)


def place_guests(lab: Lab, default_uri: str, no_verify: bool = False) -> dict[str, HostPlace]:
    """guest name -> the host it runs on.

    ``no_verify`` (``--no-verify-host-keys``) switches off host key checks for
    the lab's remote hosts; a lab file never can.

    :raise ValueError: when ``default_uri`` is needed and labctl cannot use it.
    """
    places = {name: host_place(name, with_no_verify(h.uri) if no_verify else h.uri, h.address)
              for name, h in lab.hosts.items()}
    if DEFAULT_HOST not in places and any(g.host == DEFAULT_HOST for g in lab.guests.values()):
        places[DEFAULT_HOST] = host_place(DEFAULT_HOST, default_uri)
    return {g.name: places[g.host] for g in lab.guests.values()}
