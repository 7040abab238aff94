"""A step's network kind: its impairments and captures for its duration, its link changes, all put back after.

Every step has one (:class:`NetworkKind`): :meth:`~NetworkKind.begin` (before the statistics
snapshots) puts the step's impairments in force and starts its captures (the NICs its ``trace``
captures and those the lab's networks capture); :meth:`~NetworkKind.link` runs a ``{link: ...,
state: ...}`` entry of the step's commands (:mod:`.commands`); :meth:`~NetworkKind.end` (after the
last snapshots) stops the captures, writes each one as ``<guest>/<nic>.pcapng`` in the step's
bundle directory, and puts back the links and impairments that were in force before the step.
Captures thus cover the snapshot window, and the report compares their frame counts with the
NICs' own counters.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from labctl.bundle import CaptureRecord, NetworkRecord, capture_file
from labctl.errors import LabctlError
from labctl.lab import Impairment, Lab, LinkSpec, Step, render, render_impairment
from labctl.live import (
    Capture,
    apply_impairment,
    discard_capture,
    reap_captures,
    save_capture,
    set_link,
    start_capture,
    stop_capture,
)
from labctl.state import load_netstate
from labctl.steps.result import StepResult
from labctl.steps.variant import StepKind, Variant

log = logging.getLogger(__name__)


def captured_nics(lab: Lab, step: Step) -> list[tuple[str, str]]:
    """(guest, nic) of every NIC a step captures: its trace's and the lab's networks', in lab order."""
    wanted = {(g, n) for g, spec in step.trace.items() for n in spec.capture}
    wanted |= {m for net in lab.networks.values() for m in net.capture}
    return [(g.name, n.name) for g in lab.guests.values() for n in g.nics if (g.name, n.name) in wanted]


def link_guest(spec: LinkSpec, row: dict[str, str]) -> str:
    """The guest a step's link entry acts on, for the row."""
    return render(spec.nic, row, {}, quote=False).partition(".")[0]


class NetworkKind(StepKind):
    """The network side of one step variant (see the module docstring)."""

    name = "network"

    def __init__(self, lab: Lab, step: Step, row: dict[str, str]) -> None:
        self.lab, self.step, self.row = lab, step, row
        self.captures: list[Capture] = []
        self.impaired: dict[tuple[str, str], Impairment | None] = {}  # NIC -> what was in force before
        self.links: dict[tuple[str, str], bool] = {}  # NIC -> link up before the step
        self.network: NetworkRecord = {"impair": {}, "links": {}}  # the step's records: network, captures
        self.saved: list[CaptureRecord] = []

    @classmethod
    def of(cls, lab: Lab, step: Step, row: dict[str, str]) -> NetworkKind:
        return cls(lab, step, row)

    def guests(self) -> list[str]:
        return [g for g, _ in captured_nics(self.lab, self.step)]

    def begin(self, v: Variant) -> None:
        """Impairments in force, captures running.

        :raise LabctlError: when a NIC refuses its impairment or its capture (the step fails).
        """
        state, backend, res, row = v.state, v.backend, v.res, self.row
        for label in reap_captures(state, backend):
            res.warnings.append(f"removed a capture of {label} left by a labctl that was killed")
        before = load_netstate(state.path)
        network = self.network
        res.records["network"], res.records["captures"] = network, self.saved
        for spec in self.step.impair:
            guest, _, nic = render(spec.nic, row, {}, quote=False).partition(".")
            try:
                imp = render_impairment(spec, lambda t: render(t, row, {}, quote=False))
            except ValueError as exc:
                raise LabctlError(f"impair {guest}.{nic}: {exc}") from exc
            self.impaired.setdefault((guest, nic), before.impairment(guest, nic))
            apply_impairment(state, guest, nic, imp, v.sessions.ssh(guest))
        network["impair"] = dict(load_netstate(state.path).impair.items())
        for guest, nic in captured_nics(self.lab, self.step):
            self.captures.append(start_capture(state, backend, guest, nic, "step"))

    def link(self, v: Variant, spec: LinkSpec) -> str:
        """Run a step's link entry; the command line it stands for (for the manifest).

        :raise LabctlError: when QEMU refuses it.
        """
        guest, _, nic = render(spec.nic, self.row, {}, quote=False).partition(".")
        self.links.setdefault((guest, nic), load_netstate(v.state.path).link_up(guest, nic))
        set_link(v.state, guest, nic, spec.up, v.backend)
        self.network["links"][f"{guest}.{nic}"] = "up" if spec.up else "down"
        return f"labctl link {v.state.lab} {guest} {nic} {'up' if spec.up else 'down'}"

    def end(self, v: Variant) -> None:
        """Captures stopped and written, links and impairments put back; failures become warnings."""
        res = v.res
        for cap in self.captures:
            self._save(v, cap)
        self.captures = []
        for (guest, nic), up in self.links.items():
            self._best_effort(res, f"could not bring {guest}.{nic} back {'up' if up else 'down'}",
                              functools.partial(set_link, v.state, guest, nic, up, v.backend))
        self.links = {}
        for (guest, nic), imp in self.impaired.items():
            self._best_effort(res, f"could not put back the impairment of {guest}.{nic}",
                              self._impairer(v, guest, nic, imp))
        self.impaired = {}

    def _save(self, v: Variant, cap: Capture) -> None:
        res = v.res
        warnings = stop_capture(v.state, v.backend, cap)
        dest = v.bundle / v.rel / capture_file(cap.guest, cap.nic)
        entry: CaptureRecord = {"guest": cap.guest, "nic": cap.nic, "file": str(dest.relative_to(v.bundle)),
                                "calibrated": cap.shift_us is not None}
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            written, more = save_capture(v.state, cap, dest)
        except OSError as exc:
            discard_capture(v.state, cap)
            res.warnings.append(f"{cap.label}: the capture could not be written: {exc.strerror or exc}")
            entry["file"] = None
        else:
            warnings += [w for w in more if w not in warnings]
            entry["frames"], entry["bytes"] = written.frames, written.bytes
            entry["first_us"], entry["last_us"] = written.first_us, written.last_us
        entry["warnings"] = warnings
        res.warnings += warnings
        self.saved.append(entry)

    @staticmethod
    def _impairer(v: Variant, guest: str, nic: str, imp: Impairment | None) -> Callable[[], None]:
        """Putting ``imp`` back on ``guest``'s ``nic``, for :meth:`_best_effort` (its SSH session too)."""
        return lambda: apply_impairment(v.state, guest, nic, imp, v.sessions.ssh(guest))

    @staticmethod
    def _best_effort(res: StepResult, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except LabctlError as exc:
            res.warnings.append(f"{what}: {exc.message}")
