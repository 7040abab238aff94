"""Two step kinds that watch packets in the guests' kernels: every drop (always), and the packets a step follows.

:class:`DropsKind` is part of every step unless the lab says ``drops: false`` (or ``labctl run
--no-drops``): each guest of the lab that runs records ``skb:kfree_skb`` from before the step's
workload to after it (:mod:`labctl.follow.dropwatch`; its instance made at the first step and removed when
the run ends), into ``<step>/<guest>/drops.txt`` with the
ruleset before and after (``drops-ruleset-before.txt``...) and ``drops.json`` (how it recorded, what
it lacked, events lost). The report's drops section reads them.

:class:`FollowKind` is a step's ``follow:`` (:mod:`labctl.lab.followspec`): a
:class:`labctl.follow.Follower` on its guests from ``begin`` to ``end``, with a clock round at each
end; its raw material goes to ``<step>/follow/`` (each guest's events, the clock samples, the
topology, the wire's frames, the rulesets) and the report turns it into ``journey.json``, a table of
paths and a Perfetto timeline (:mod:`labctl.trace.journeyfiles`). A guest that cannot follow (an old
kernel, no debug info) is a warning on the step, never a failure.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from labctl.errors import LabctlError
from labctl.follow import (
    DropWatch,
    Follower,
    XdpWatch,
    finish_dropwatch,
    finish_xdpwatch,
    parallel,
    remove_dropwatch,
    start_dropwatch,
    start_xdpwatch,
    xdpwatch_stop_texts,
)
from labctl.lab import Lab, Step, render
from labctl.paths import atomic_write
from labctl.pktfilter import parse
from labctl.steps.variant import StepKind, Variant
from labctl.trace import FOLLOW_DIR, FOLLOW_INPUTS, XDP_FILE, follow_inputs

log = logging.getLogger(__name__)
DROPS_TXT, DROPS_JSON = "drops.txt", "drops.json"
XDP_JSON = "xdp-drops.json"  # the XDP programs' drops (labctl.follow.xdpwatch)
RULESET_BEFORE, RULESET_AFTER = "drops-ruleset-before.txt", "drops-ruleset-after.txt"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)


class DropsKind(StepKind):
    """Every skb each running guest dropped during the step (see the module docstring)."""

    name = "drops"

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.watches: dict[str, DropWatch] = {}
        self.xdp: dict[str, XdpWatch] = {}

    @classmethod
    def of(cls, lab: Lab) -> DropsKind | None:
        return cls(lab) if lab.drops else None

    def begin(self, v: Variant) -> None:
        guests = [g for g in self.lab.guests if g in v.state.guests and v.sessions.alive(g)]

        def one(g: str) -> DropWatch | None:
            kept = v.sessions.kept.get((self.name, g))
            try:
                w = start_dropwatch(v.state, g, v.sessions.ssh(g), kept if isinstance(kept, DropWatch) else None)
            except LabctlError as exc:
                v.res.warnings.append(f"{g}: drops not recorded: {exc.message}")
                return None
            if w is not None and w.mode and w is not kept:
                v.sessions.kept[(self.name, g)] = w
                v.sessions.at_close.append(lambda: self._remove(v, g, w))
            return w

        self.watches = {g: w for g, w in parallel(guests, one).items() if w is not None}
        self.xdp = {g: w for g, w in parallel(guests, lambda g: self._xdp_start(v, g)).items() if w is not None}

    def _xdp_start(self, v: Variant, g: str) -> XdpWatch | None:
        spec = v.state.guest_spec(g)
        nics = spec["nics"] if spec else []
        try:
            return start_xdpwatch(v.sessions.ssh(g), g, nics)
        except LabctlError as exc:
            v.res.warnings.append(f"{g}: XDP drops not recorded: {exc.message}")
            return None

    @staticmethod
    def _remove(v: Variant, g: str, w: DropWatch) -> None:
        """The run is over: the guest's instance and probe go (not from a guest that is gone)."""
        if v.sessions.alive(g):
            remove_dropwatch(w, v.sessions.ssh(g))

    def end(self, v: Variant) -> None:
        live = [g for g in self.watches if v.sessions.alive(g)]

        def one(g: str) -> None:
            w = self.watches[g]
            try:
                text, lost, after = finish_dropwatch(w, v.sessions.ssh(g))
            except LabctlError as exc:
                v.res.warnings.append(f"{g}: drops could not be read: {exc.message}")
                return
            out = v.bundle / v.rel / g
            _write(out / DROPS_TXT, text)
            if w.ruleset or after:
                _write(out / RULESET_BEFORE, w.ruleset)
                _write(out / RULESET_AFTER, after)
            _write(out / DROPS_JSON, json.dumps({"mode": w.mode, "notes": w.notes, "lost": lost,
                                                  **({"reasons": w.reasons} if w.reasons else {})}) + "\n")
            xw = self.xdp.get(g)
            if xw is not None:
                try:
                    got = finish_xdpwatch(v.sessions.ssh(g), xw)
                except LabctlError as exc:
                    v.res.warnings.append(f"{g}: XDP drops could not be read: {exc.message}")
                    return
                v.res.warnings += [f"{g}: {n}" for n in xw.notes]
                _write(out / XDP_JSON, json.dumps([r.as_dict() for r in got]) + "\n")

        parallel(live, one)


class FollowKind(StepKind):
    """The step's ``follow:`` (see the module docstring)."""

    name = "follow"

    def __init__(self, lab: Lab, step: Step, row: dict[str, str]) -> None:
        assert step.follow is not None
        self.lab, self.spec, self.row = lab, step.follow, row
        self.follower: Follower | None = None
        self.filter = ""
        self.xdp: dict[str, XdpWatch] = {}  # XDP verdicts of the followed guests (labctl.trace.xdphops)

    @classmethod
    def of(cls, lab: Lab, step: Step, row: dict[str, str]) -> FollowKind | None:
        return cls(lab, step, row) if step.follow is not None else None

    def begin(self, v: Variant) -> None:
        self.filter = render(self.spec.filter, self.row, v.addresses, quote=False)
        guests = [g for g in (self.spec.guests or tuple(self.lab.guests)) if v.sessions.alive(g)]
        f = Follower(v.state, v.backend, guests, parse(self.filter), v.sessions.ssh, wire=self.spec.wire,
                     purpose="follow-step")
        try:
            f.check()
            f.start()
        except LabctlError as exc:
            v.res.warnings.append(f"follow did not run: {exc.message}")
            return
        self.follower = f

        def xdp(g: str) -> XdpWatch | None:
            spec = v.state.guest_spec(g)
            nics = spec["nics"] if spec else []
            try:
                return start_xdpwatch(v.sessions.ssh(g), g, nics, tag="f", counters=False)
            except LabctlError as exc:
                v.res.warnings.append(f"follow: {g}: XDP verdicts not followed: {exc.message}")
                return None

        self.xdp = {g: w for g, w in parallel(guests, xdp).items() if w is not None}

    def end(self, v: Variant) -> None:
        f = self.follower
        if f is None:
            return
        inputs: dict[str, Any] = {}
        try:
            alive = [g for g in f.guests if v.sessions.alive(g)]
            f.sync()  # the closing round: guest clocks drift
            texts = parallel(alive, f.read)
            f.read_wire()
            after = parallel(alive, f.ruleset)
            out = v.bundle / v.rel / FOLLOW_DIR
            for g, (text, _) in texts.items():
                _write(out / f"{g}.txt", text)
            for g, xw in self.xdp.items():
                dumps = xdpwatch_stop_texts(v.sessions.ssh(g), xw)
                _write(out / XDP_FILE.format(guest=g), json.dumps({"wall_minus_mono": f.wall_minus_mono, "nics": {
                    n: {"program": x.program, "mode": x.mode, "text": dumps.get(n, "")} for n, x in xw.nics.items()}}))
            inputs = follow_inputs(self.filter, f.guests, f.topology(), f.samples, f.wire,
                                   {g: lost for g, (_, lost) in texts.items()},
                                   {g: (p.ruleset, after.get(g, "")) for g, p in f.probes.items()}, f.reasons)
        except LabctlError as exc:
            v.res.warnings.append(f"follow: {exc.message}")
        finally:
            warnings = f.stop()
        if inputs:
            inputs["warnings"] = warnings
            _write(v.bundle / v.rel / FOLLOW_DIR / FOLLOW_INPUTS, json.dumps(inputs, indent=1) + "\n")
        v.res.warnings += [f"follow: {w}" for w in warnings]
