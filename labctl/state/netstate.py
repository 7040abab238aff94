"""What is in force on a lab's links right now, beside its state: impairments, links taken down, captures.

::

    <run dir>/network.json       {"impair": {"a.eth1": {"delay": "20ms"}}, "links": {"a.eth1": "down"}}
    <run dir>/captures/<id>.json  one live capture: its QEMU filter, file, owner pid (:class:`Capture`;
                                  labctl.live.capture starts and stops them, status lists them: :func:`active`)

``network.json`` is changed by ``up`` (the lab file's impairments), by
``labctl impair`` and ``labctl link``, and by a step for its duration, from
any of those processes: each change is read, modified and written back
under a lock of its own (``.network.lock``), atomically. ``state.json`` is
``up``'s alone. Both go with the run directory at ``down``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from labctl.paths import atomic_write, exclusive

if TYPE_CHECKING:
    from labctl.lab import Impairment
    from labctl.state.runstate import LabState

NETWORK = "network.json"
LOCK = ".network.lock"
CAPTURES = "captures"


def nic_key(guest: str, nic: str) -> str:
    """``guest.nic``: how the records name a NIC."""
    return f"{guest}.{nic}"


class NetworkFile(TypedDict):
    """``network.json``."""

    impair: dict[str, dict[str, str | int]]  # guest.nic -> Impairment.to_dict()
    links: dict[str, str]  # guest.nic -> "down"


@dataclass
class NetRuntime:
    """Impairments in force (``guest.nic`` -> values) and links that are down (``guest.nic`` -> ``down``)."""

    impair: dict[str, dict[str, str | int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)

    def impairment(self, guest: str, nic: str) -> Impairment | None:
        """The impairment in force on a NIC (None: none)."""
        from labctl.lab import Impairment

        values = self.impair.get(nic_key(guest, nic))
        try:
            return Impairment.from_dict(values) if values else None
        except ValueError:
            return None

    def set_impairment(self, guest: str, nic: str, imp: Impairment | None) -> None:
        if imp is None or imp.empty:
            self.impair.pop(nic_key(guest, nic), None)
        else:
            self.impair[nic_key(guest, nic)] = imp.to_dict()

    def link_up(self, guest: str, nic: str) -> bool:
        return self.links.get(nic_key(guest, nic)) != "down"

    def set_link(self, guest: str, nic: str, up: bool) -> None:
        if up:
            self.links.pop(nic_key(guest, nic), None)
        else:
            self.links[nic_key(guest, nic)] = "down"

    def to_dict(self) -> NetworkFile:
        return {"impair": self.impair, "links": self.links}


def load(run_dir: Path) -> NetRuntime:
    """The lab's network record (empty when there is none or it cannot be read)."""
    try:
        data = json.loads((run_dir / NETWORK).read_text())
    except (OSError, ValueError):
        return NetRuntime()
    if not isinstance(data, dict):
        return NetRuntime()
    impair = data.get("impair")
    links = data.get("links")
    impair = impair if isinstance(impair, dict) else {}
    links = links if isinstance(links, dict) else {}
    return NetRuntime({str(k): v for k, v in impair.items() if isinstance(v, dict)},
                      {str(k): str(v) for k, v in links.items()})


@contextlib.contextmanager
def update(run_dir: Path) -> Iterator[NetRuntime]:
    """The lab's network record, written back when the block ends without an error (under the lock).

    :raise OSError: when the run directory is gone or cannot be written.
    """
    with exclusive(run_dir / LOCK):
        record = load(run_dir)
        yield record
        atomic_write(run_dir / NETWORK, json.dumps(record.to_dict(), indent=2) + "\n", 0o600)


@dataclass
class Capture:
    """One capture's record (``captures/<id>.json``)."""

    id: str
    guest: str
    nic: str
    netdev: str
    file: str
    owner: int
    purpose: str
    started: float = 0.0  # wall time once the filter is in place
    second: int = 0  # the wall-clock second QEMU took as the filter's start
    shift_us: int | None = None  # QEMU's timestamp minus the real time (None: not known)
    log: str | None = None  # QEMU's log, and its size when the capture started
    log_offset: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.guest}.{self.nic}"

    @property
    def path(self) -> Path:
        return Path(self.file)


def active(state: LabState) -> list[Capture]:
    """The captures recorded for a lab (live ones, and dead ones not reaped yet)."""
    out = []
    d = state.path / CAPTURES
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append(Capture(**json.loads(p.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out
