"""One run of one matrix row of a step (a *variant*), and the kinds a step is made of.

A step is made of kinds (:mod:`.kinds` lists them, in order): its commands, its selftests, its
network changes, its tracers and statistics, its gdb session. Each kind is an object that owns
its part of the run and its record in the step's result; the runner never asks which kinds a step
has. A variant runs in phases, each kind doing what it must in each (nothing by default):

1. ``prepare``: on the host, before any guest is touched (the selftests are built);
2. ``begin``: impairments and captures in force, statistics taken, tracers recording, gdb attached;
3. the step's *window* opens (:mod:`.hostwatch`), ``run``: the workloads (commands, selftests),
   the window closes;
4. ``settle``: what ran alongside the workloads ends (gdb joined, background commands stopped);
5. ``end`` (in reverse order): tracers stopped and post-processed, statistics taken again,
   the network put back as it was;
6. the guests' files are copied into the bundle, then ``collected``: results read from them.
"""

from __future__ import annotations

import datetime
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import labctl.steps.copyback as copyback  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.bundle import CommandRecord
from labctl.errors import GuestError, LabctlError
from labctl.lab import Lab, Step
from labctl.state import LabState
from labctl.steps.result import StepEvents, StepResult
from labctl.steps.sessions import Sessions

if TYPE_CHECKING:
    from labctl.backends import Backend

GUEST_ROOT = "/tmp/labctl"
COPY_TIMEOUT = 600.0  # copying one guest's step directory back (perf.data can be large)
NO_VARIANT = "_"
K = TypeVar("K", bound="StepKind")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class StepKind:
    """One kind of a step, for one variant (see the module docstring). ``name`` goes into the
    step's result (``kinds``), which the report reads to show the kind's section."""

    name = ""

    def guests(self) -> list[str]:
        """The guests this kind involves (each gets the step's directory and its files copied back)."""
        return []

    def prepare(self, v: Variant) -> None:
        """On the host, before any guest is touched."""

    def begin(self, v: Variant) -> None:
        """Before the window opens."""

    def run(self, v: Variant) -> None:
        """In the window: the step's workload."""

    def settle(self, v: Variant) -> None:
        """Right after the window: what ran alongside the workload ends."""

    def end(self, v: Variant) -> None:
        """After every kind settled (in reverse order): put things back, take the last figures."""

    def collected(self, v: Variant) -> None:
        """The guests' files are in the bundle."""


@dataclass(kw_only=True)
class Variant:
    """What every kind of one variant reads and writes: the step (its trace filled in for the row),
    the row, where its files go in the guests (``workdir``) and in the bundle (``rel``), the result.
    Made by keyword only: fifteen fields of which several share a type are not to be told by position."""

    lab: Lab
    state: LabState
    backend: Backend
    bundle: Path
    sessions: Sessions
    events: StepEvents
    commands: list[CommandRecord]  # every command of the run, for the manifest
    addresses: dict[str, str]  # {{GUEST.NIC.ip}} -> address
    step: Step
    row: dict[str, str]
    res: StepResult
    rel: Path
    workdir: str
    kinds: list[StepKind] = field(default_factory=list)
    involved: list[str] = field(default_factory=list)  # every kind's guests, in order, once

    def kind(self, cls: type[K]) -> K | None:
        """This variant's kind of class ``cls``, if the step has it."""
        return next((k for k in self.kinds if isinstance(k, cls)), None)

    def sh(self, guest: str, command: str, timeout: float = 120) -> int:
        return self.sessions.sh(guest, command, timeout)

    def kernel_release(self, guest: str) -> str:
        """The release of the kernel ``guest`` runs, "" when the lab has no record of it."""
        try:
            return self.state.kernel(guest).release
        except LabctlError:
            return ""

    def explain(self, exc: LabctlError) -> str:
        """Why the variant failed: a guest that died or crashed says more than the error it caused."""
        return self.sessions.dead_guests() or exc.message

    def record(self, entry: CommandRecord) -> None:
        self.commands.append(entry)

    def collect(self) -> None:
        """Copy the step's guest directory of every reachable guest into the bundle.

        The guest sends a tar stream; :mod:`labctl.steps.copyback` keeps every file
        inside the bundle (no links followed, no names outside, a byte budget and a cap on entries).
        """
        res = self.res
        for g in self.involved:
            dest = self.bundle / self.rel / g
            dest.mkdir(parents=True, exist_ok=True)
            if not self.sessions.alive(g):
                continue
            try:
                with self.sessions.ssh(g).stream(f"cd {shlex.quote(self.workdir)} && tar -cf - .",
                                                 timeout=COPY_TIMEOUT) as f:
                    got = copyback.extract(f, dest, max_entries=copyback.DEFAULT_ENTRIES)
            except (GuestError, OSError, EOFError, tarfile.TarError) as exc:
                message = exc.message if isinstance(exc, GuestError) else str(exc)
                res.warnings.append(f"{g}: could not copy the step's files: {message}")
                res.fail(self.explain(GuestError(message)))
                continue
            for why in got.skipped:
                res.warnings.append(f"{g}: not copied: {why}")
