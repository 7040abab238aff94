"""The whole pipeline in one place::

    lab file (labctl.lab) -> model -> [prepare: capacity (labctl.training) ->
    image (labctl.image) -> kernels and preflight (labctl.kernel)] -> accelerator
    and network plan (labctl.up, labctl.net) -> backend (labctl.backends) -> up
    -> steps (labctl.steps: tracers, gdb) -> bundle (labctl.bundle) -> report
    (labctl.report) -> down

:func:`prepare` is the front, which every command that brings a lab up calls
first (``up``, ``run``, ``class up``, ``bisect``); :func:`run_lab` does the
rest (``labctl run``, and ``labctl up`` of a lab with steps, which keeps the
lab up); :func:`run_steps` the part from steps to report, on a lab that is up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from labctl.bundle import write
from labctl.events import PrepareEvents, UpEvents
from labctl.image import Image, ImageStore, build_image, load_recipe
from labctl.kernel import Kernel
from labctl.kernel import lab as kernel_lab
from labctl.lab import Lab
from labctl.report import render_run, summarize, write_summary
from labctl.state import LabState, lab_lock
from labctl.steps import Runner, StepEvents, StepResult, now
from labctl.up import Estimate, UpOptions, check_capacity, down, up


@dataclass(frozen=True)
class Prepared:
    """What ``up`` needs before anything starts: the image and each guest's kernel."""

    image: Image
    kernels: dict[str, Kernel]  # guest -> its prepared kernel
    capacity: Estimate | None = None  # the memory check's figures (None: not checked)


def prepare(lab: Lab, events: PrepareEvents | None = None, *, copies: Sequence[Lab] | None = None,
            overcommit: bool = False, capacity: bool = True, kernels: bool = True) -> Prepared:
    """The front of the pipeline, cheapest refusal first, with an error checkpoint after each
    stage (a stage never runs after an earlier one refused, and nothing is started):

    1. capacity: the host holds ``copies`` (default: the lab alone), unless ``overcommit``;
    2. the image, from the cache or built (the slow part of a first run);
    3. the kernels: each can be had (lab file lines), and the preflight of the lab against
       each kernel's ``.config``; its refusals stop here, its warnings go to ``events``;
    4. each guest's kernel prepared (from the cache by content, else downloaded or built),
       unless not ``kernels``: the caller prepares them later itself (bisect, at each commit;
       the kernels of the result are then none).

    :raise HostError: the host cannot hold the guests (exit 3).
    :raise LabFileError: a kernel cannot be had or cannot run the lab (exit 2).
    :raise ImageError: the image or a kernel cannot be made.
    """
    events = events or PrepareEvents()
    estimate = check_capacity(list(copies or [lab]), overcommit=overcommit) if capacity else None
    image = prepare_image(lab.image, events)
    if not kernels:
        _kernel_checks(lab, image, events)
        return Prepared(image, {}, estimate)
    return Prepared(image, prepare_kernels(lab, image, events), estimate)


def prepare_image(name: str, events: PrepareEvents | None = None, force: bool = False) -> Image:
    """The current image ``name``: from the cache, else built (progress to ``events``).

    :raise ImageError: when it cannot be built.
    """
    events = events or PrepareEvents()
    recipe = load_recipe(name)
    store = ImageStore()
    found = None if force else store.get(name, recipe.key())
    if found is not None:
        return found
    with events.slow(f"building image {name}" + ("" if force else " (first use; cached afterwards)")) as rep:
        return build_image(recipe, store, rep, force=force)


def prepare_kernels(lab: Lab, image: Image, events: PrepareEvents | None = None) -> dict[str, Kernel]:
    """Every guest's kernel: checked (each can be had), the preflight from the kernels' configs
    (before the heavy preparation), then prepared when the cache lacks it.

    :raise LabFileError: a kernel cannot be had or cannot run the lab (exit 2).
    :raise ImageError: when preparing one fails.
    """
    events = events or PrepareEvents()
    _kernel_checks(lab, image, events)
    recipe = load_recipe(image.name)
    if kernel_lab.all_prepared(lab, image, recipe):
        return kernel_lab.prepare(lab, image, recipe)
    with events.slow(f"preparing kernels for {lab.name} (first use of each; cached afterwards)") as rep:
        return kernel_lab.prepare(lab, image, recipe, rep)


def _kernel_checks(lab: Lab, image: Image, events: PrepareEvents | None = None) -> None:
    """Each guest's kernel can be had (the lab file's lines), and the lab checked against each
    kernel's ``.config`` (a Debian kernel's package is fetched for it, nothing is built).

    :raise LabFileError: for refusals (exit 2); warnings and notes go to ``events``.
    """
    events = events or PrepareEvents()
    kernel_lab.check(lab, image)
    report = kernel_lab.preflight(lab, image)
    kernel_lab.refuse(report)
    for line in kernel_lab.warning_lines(report):
        events.warn(line)


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


def run_lab(lab: Lab, prepared: Prepared, opts: UpOptions, out_root: Path, up_events: UpEvents | None = None,
            step_events: StepEvents | None = None, keep: bool = False,
            on_up: Callable[[LabState], None] | None = None) -> RunOutcome:
    """The chain after :func:`prepare`, for ``labctl run`` and ``labctl up`` of a lab with steps:
    bundle directory (a bad ``out_root`` fails before anything boots), up,
    ``on_up(state)``, steps, bundle, report, and down unless ``keep``. The lab's
    lock is held throughout: no other labctl takes the lab meanwhile.
    """
    with lab_lock(lab.ident):
        bundle = write.new_bundle_dir(out_root, lab.ident)
        state = up(lab, prepared.image, prepared.kernels, opts, up_events)
        try:
            if on_up is not None:
                on_up(state)
            return run_steps(lab, state, bundle, step_events)
        finally:
            if not keep:
                down(lab.ident)
