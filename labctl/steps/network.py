"""A step's network: its impairments and captures for its duration, its link changes, all put back after.

:class:`StepNetwork` is used by the runner around each step variant:
:meth:`~StepNetwork.begin` (before the statistics snapshots) puts the step's
impairments in force and starts its captures (the NICs its ``trace``
captures and those the lab's networks capture); :meth:`~StepNetwork.link`
runs a ``{link: ..., state: ...}`` entry; :meth:`~StepNetwork.end` (after
the last snapshots) stops the captures, writes each one as
``<guest>/<nic>.pcapng`` in the step's bundle directory, and puts back the
links and impairments that were in force before the step. Captures thus
cover the snapshot window, and the report compares their frame counts with
the NICs' own counters.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labctl.backends.base import Backend
from labctl.bundle.layout import capture_file
from labctl.errors import LabctlError
from labctl.lab.impair import Impairment
from labctl.lab.model import Lab
from labctl.lab.netopts import LinkSpec, render_impairment
from labctl.lab.steps import Step, render
from labctl.live import capture, netctl
from labctl.ssh import Session
from labctl.state import netstate
from labctl.state.runstate import LabState
from labctl.steps.result import StepResult

log = logging.getLogger(__name__)


def captured_nics(lab: Lab, step: Step) -> list[tuple[str, str]]:
    """(guest, nic) of every NIC a step captures: its trace's and the lab's networks', in lab order."""
    wanted = {(g, n) for g, spec in step.trace.items() for n in spec.capture}
    wanted |= {m for net in lab.networks.values() for m in net.capture}
    return [(g.name, n.name) for g in lab.guests.values() for n in g.nics if (g.name, n.name) in wanted]


def link_guest(spec: LinkSpec, row: dict[str, str]) -> str:
    """The guest a step's link entry acts on, for the row."""
    return render(spec.nic, row, {}, quote=False).partition(".")[0]


class StepNetwork:
    """The network side of one step variant (see the module docstring)."""

    def __init__(self, lab: Lab, state: LabState, backend: Backend, bundle: Path,
                 ssh: Callable[[str], Session]) -> None:
        self.lab, self.state, self.backend, self.bundle, self.ssh = lab, state, backend, bundle, ssh
        self.captures: list[capture.Capture] = []
        self.impaired: dict[tuple[str, str], Impairment | None] = {}  # NIC -> what was in force before
        self.links: dict[tuple[str, str], bool] = {}  # NIC -> link up before the step
        self.rel = Path()

    def begin(self, step: Step, row: dict[str, str], rel: Path, res: StepResult) -> None:
        """Impairments in force, captures running.

        :raise LabctlError: when a NIC refuses its impairment or its capture (the step fails).
        """
        self.rel = rel
        for label in capture.reap(self.state, self.backend):
            res.warnings.append(f"removed a capture of {label} left by a labctl that was killed")
        before = netstate.load(self.state.path)
        network: dict[str, Any] = {"impair": {}, "links": {}}
        res.network = network
        for spec in step.impair:
            guest, _, nic = render(spec.nic, row, {}, quote=False).partition(".")
            try:
                imp = render_impairment(spec, lambda t: render(t, row, {}, quote=False))
            except ValueError as exc:
                raise LabctlError(f"impair {guest}.{nic}: {exc}") from exc
            self.impaired.setdefault((guest, nic), before.impairment(guest, nic))
            netctl.apply_impairment(self.state, guest, nic, imp, self.ssh(guest))
        now = netstate.load(self.state.path)
        network["impair"] = {k: v for k, v in now.impair.items()}
        for guest, nic in captured_nics(self.lab, step):
            self.captures.append(capture.start(self.state, self.backend, guest, nic, "step"))

    def link(self, spec: LinkSpec, row: dict[str, str], res: StepResult) -> str:
        """Run a step's link entry; the command line it stands for (for the manifest).

        :raise LabctlError: when QEMU refuses it.
        """
        guest, _, nic = render(spec.nic, row, {}, quote=False).partition(".")
        self.links.setdefault((guest, nic), netstate.load(self.state.path).link_up(guest, nic))
        netctl.set_link(self.state, guest, nic, spec.up, self.backend)
        if res.network is not None:
            res.network.setdefault("links", {})[f"{guest}.{nic}"] = "up" if spec.up else "down"
        return f"labctl link {self.state.lab} {guest} {nic} {'up' if spec.up else 'down'}"

    def end(self, res: StepResult) -> None:
        """Captures stopped and written, links and impairments put back; failures become warnings."""
        for cap in self.captures:
            self._save(cap, res)
        self.captures = []
        for (guest, nic), up in self.links.items():
            self._best_effort(res, f"could not bring {guest}.{nic} back {'up' if up else 'down'}",
                              functools.partial(netctl.set_link, self.state, guest, nic, up, self.backend))
        self.links = {}
        for (guest, nic), imp in self.impaired.items():
            self._best_effort(res, f"could not put back the impairment of {guest}.{nic}",
                              self._impairer(guest, nic, imp))
        self.impaired = {}

    def _save(self, cap: capture.Capture, res: StepResult) -> None:
        warnings = capture.stop(self.state, self.backend, cap)
        dest = self.bundle / self.rel / capture_file(cap.guest, cap.nic)
        entry: dict[str, Any] = {"guest": cap.guest, "nic": cap.nic, "file": str(dest.relative_to(self.bundle)),
                                 "calibrated": cap.shift_us is not None}
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            written, more = capture.save(self.state, cap, dest)
        except OSError as exc:
            capture.discard(self.state, cap)
            res.warnings.append(f"{cap.label}: the capture could not be written: {exc.strerror or exc}")
            entry["file"] = None
        else:
            warnings += [w for w in more if w not in warnings]
            entry.update(frames=written.frames, bytes=written.bytes, first_us=written.first_us,
                         last_us=written.last_us)
        entry["warnings"] = warnings
        res.warnings += warnings
        res.captures.append(entry)

    def _impairer(self, guest: str, nic: str, imp: Impairment | None) -> Callable[[], None]:
        """Putting ``imp`` back on ``guest``'s ``nic``, for :meth:`_best_effort` (its SSH session too)."""
        return lambda: netctl.apply_impairment(self.state, guest, nic, imp, self.ssh(guest))

    @staticmethod
    def _best_effort(res: StepResult, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except LabctlError as exc:
            res.warnings.append(f"{what}: {exc.message}")
