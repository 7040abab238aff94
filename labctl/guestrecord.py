"""Records shared by the backends and the lab's state without either importing the other's
package: a started guest as the state remembers it (:class:`GuestRecord`). A leaf: it imports
nothing of labctl's, so that ``labctl status`` and ``exec`` read a lab's state without loading
the backends.

Imports never: anything of labctl's
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GuestRecord:
    """A started guest as the lab's state remembers it."""

    name: str
    backend: str
    pid: int
    dir: str
    console: str
    qmp: str
    ssh_port: int
    accel: str
    argv: list[str] = field(default_factory=list)
    gdb: str | None = None  # the gdbstub's unix socket, on the machine that runs the guest
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GuestRecord:
        return cls(**d)
