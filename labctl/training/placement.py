"""Where each student's instance runs when a class spreads over the lab's libvirt hosts.

A lab that defines ``hosts`` and leaves some guests without a ``host:`` of
their own lets ``class up`` choose: each student's instance goes whole to
one of the lab's hosts (its unplaced guests together; a guest that names its
host stays there, which is how a lab says an instance is split). The host
is the one with the most memory left once the instances placed before are
counted: what libvirt says the host has free (free, buffers and page cache,
the host's own ``MemAvailable`` as near as libvirt tells it) less what the
instances already placed on it will take. Ties go to the host defined
first. A remote host is no candidate for a lab whose unplaced guests share
a network of three or more (such a network must sit on labctl's machine).

Everything is decided before anything starts; an instance that fits on no
host is refused (exit 3) unless ``--overcommit``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from labctl.errors import HostError
from labctl.lab import DEFAULT_HOST, HostPlace, Lab, host_place, parse_uri, with_no_verify
from labctl.up import QEMU_OVERHEAD_MIB


@dataclass(frozen=True)
class Placement:
    """student -> host name, and what was counted to choose."""

    hosts: dict[str, str]
    free_mib: dict[str, int]  # host -> what it had before the class (MiB)
    need_mib: int  # one instance's unplaced guests, QEMU included

    def on(self, host: str) -> list[str]:
        return [s for s, h in self.hosts.items() if h == host]


def unplaced(lab: Lab) -> list[str]:
    """The lab's guests without a host of their own: the class places them."""
    return [g.name for g in lab.guests.values() if g.host == DEFAULT_HOST]


def candidates(lab: Lab) -> list[str]:
    """The lab's hosts an instance may go to (file order); empty when the class does not spread."""
    if not lab.hosts or not unplaced(lab):
        return []
    names = list(lab.hosts)
    if _needs_local(lab):
        names = [n for n in names if not parse_uri(lab.hosts[n].uri).remote]
    return names


def _needs_local(lab: Lab) -> bool:
    """True when the unplaced guests share a network of three or more guests."""
    members = Counter(nic.network for g in lab.guests.values() for nic in g.nics)
    return any(members[nic.network] >= 3 for g in unplaced(lab) for nic in lab.guests[g].nics)


def need_mib(lab: Lab) -> int:
    """What one instance's unplaced guests take on their host (each booting: its memory and QEMU's)."""
    return sum(lab.guests[g].memory + QEMU_OVERHEAD_MIB for g in unplaced(lab))


def place(lab: Lab, students: Sequence[str], free_mib: Callable[[HostPlace], int], overcommit: bool = False,
          no_verify: bool = False) -> Placement | None:
    """Each student's host (None when the lab does not spread: no hosts, every guest placed, or no
    host the unplaced guests may go to).

    ``free_mib(host)`` is what the host has left (:meth:`labctl.backends.Backend.free_mib`).

    :raise HostError: when an instance fits on no host (exit 3), unless ``overcommit``; or a host
        cannot be reached.
    """
    names = candidates(lab)
    if not names:  # the unplaced guests go where up puts them: the backend's own URI
        return None
    places = {n: host_place(n, with_no_verify(lab.hosts[n].uri) if no_verify else lab.hosts[n].uri,
                            lab.hosts[n].address) for n in names}
    free = {n: free_mib(places[n]) for n in names}
    need = need_mib(lab)
    taken = dict.fromkeys(names, 0)
    chosen: dict[str, str] = {}
    for student in students:
        host = max(names, key=lambda n: (free[n] - taken[n], -names.index(n)))
        if free[host] - taken[host] < need and not overcommit:
            left = ", ".join(f"{n} {max(0, free[n] - taken[n])} MiB" for n in names)
            raise HostError(f"class of lab {lab.name}: student '{student}' fits on none of the lab's hosts "
                            f"(an instance takes {need} MiB; left after the {len(chosen)} placed before: {left})",
                            hint="add a host to the lab, give its guests less memory, fewer students, "
                                 "or --overcommit")
        chosen[student] = host
        taken[host] += need
    return Placement(chosen, free, need)
