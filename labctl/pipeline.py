"""The whole pipeline in one place::

    lab file (labctl.lab) -> model -> image (labctl.image) -> accelerator and
    network plan (labctl.up, labctl.net) -> backend (labctl.backends) -> up
    -> steps (labctl.steps: tracers, gdb) -> bundle (labctl.bundle) -> report
    (labctl.report) -> down

:func:`run_lab` does all of it (``labctl run``, and ``labctl up`` of a lab
with steps, which keeps the lab up); :func:`run_steps` the part from steps
to report, on a lab that is up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from labctl.bundle import write
from labctl.bundle.summary import summarize, write_summary
from labctl.events import UpEvents
from labctl.steps.events import StepEvents
from labctl.image.store import Image
from labctl.kernel.store import Kernel
from labctl.lab.model import Lab
from labctl.report import render_run
from labctl.steps.result import StepResult
from labctl.steps.runner import Runner, now
from labctl.up.lifecycle import UpOptions, down, up
from labctl.state.runstate import LabState, lab_lock


@dataclass
class RunOutcome:
    bundle: Path
    status: str  # ok | failed
    reason: str | None
    results: list[StepResult]
    reports: list[Path]


def run_steps(lab: Lab, state: LabState, bundle: Path, events: StepEvents | None = None, *,
              runner: Runner | None = None) -> RunOutcome:
    """Run the lab's steps and write the bundle into ``bundle`` (made by
    :func:`labctl.bundle.write.new_bundle_dir`), whatever happens (Ctrl-C
    re-raised after). ``runner`` is the lab's :class:`Runner` (tests inject one
    with their own sessions and backend)."""
    started = now()
    runner = runner or Runner(lab, state, bundle, events)
    status, reason = "ok", None
    interrupted: BaseException | None = None
    try:
        runner.run()
    except KeyboardInterrupt as exc:
        interrupted = exc
        status, reason = "failed", "interrupted (Ctrl-C)"
    failed = [r for r in runner.results if r.status == "failed"]
    if failed and status == "ok":
        status, reason = "failed", f"step {failed[0].name}" + (
            f" ({failed[0].variant})" if failed[0].variant else "") + f": {failed[0].reason}"
    finished = now()
    write.copy_inputs(bundle, lab, state)
    write.write_manifest(bundle, lab, state, started, finished, runner.commands, status, reason, runner.backend)
    header = {"lab": lab.name, "status": status, "reason": reason, "started_at": started, "finished_at": finished,
              "accel": state.accel}
    write_summary(bundle, summarize(bundle, header, (asdict(r) for r in runner.results)))
    reports = list(render_run(bundle))
    outcome = RunOutcome(bundle, status, reason, runner.results, reports)
    if interrupted is not None:
        raise interrupted
    return outcome


def run_lab(lab: Lab, image: Image, opts: UpOptions, out_root: Path, up_events: UpEvents | None = None,
            step_events: StepEvents | None = None, keep: bool = False,
            on_up: Callable[[LabState], None] | None = None, kernels: dict[str, Kernel] | None = None) -> RunOutcome:
    """The whole chain, for ``labctl run`` and ``labctl up`` of a lab with steps:
    bundle directory (a bad ``out_root`` fails before anything boots), up,
    ``on_up(state)``, steps, bundle, report, and down unless ``keep``. The lab's
    lock is held throughout: no other labctl takes the lab meanwhile.
    """
    with lab_lock(lab.ident):
        bundle = write.new_bundle_dir(out_root, lab.ident)
        state = up(lab, image, opts, up_events, kernels)
        try:
            if on_up is not None:
                on_up(state)
            return run_steps(lab, state, bundle, step_events)
        finally:
            if not keep:
                down(lab.ident)
