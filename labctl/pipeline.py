"""The whole pipeline in one place::

    lab file (labctl.lab) -> model -> [prepare: capacity (labctl.up) ->
    image (labctl.image) -> kernels and preflight (labctl.kernel)] -> accelerator
    and network plan (labctl.up, labctl.net) -> backend (labctl.backends) -> up
    -> steps (labctl.steps: tracers, gdb) -> bundle (labctl.bundle) -> report
    (labctl.report) -> down

:func:`prepare` is the front, which every command that brings a lab up calls
first (``up``, ``run``, ``class up``, ``bisect``); :func:`run_lab` does the
rest (``labctl run``, and ``labctl up`` of a lab with steps, which keeps the
lab up); :func:`run_steps` the part from steps to report, on a lab that is up.
A packed lab (:mod:`labctl.pack`) goes through :func:`prepare` too, ``pinned``: its image and
kernels must be the packed ones; :func:`pack_lab` prepares a lab and packs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from labctl.errors import LabctlError, UsageError
from labctl.events import PrepareEvents, UpEvents
from labctl.image import Image, ImageStore, build_image, load_recipe
from labctl.kernel import (
    Kernel,
    all_prepared,
    check_guest_kernels,
    kernel_specs,
    kernel_warning_lines,
    preflight_kernels,
    prepare_guest_kernels,
    refuse_kernels,
)
from labctl.lab import Check, KernelSpec, Lab, load_lab_text
from labctl.pack import PackResult, Pinned, check_archive, check_image, check_kernels, run_inputs
from labctl.pack import pack_lab as write_pack
from labctl.state import LabState, lab_lock
from labctl.up import Estimate, UpOptions, check_capacity, down, up

if TYPE_CHECKING:  # what running steps and checks needs loads when they run: ``labctl up`` of a lab without steps never does
    from labctl.bundle import VmcoreRecord
    from labctl.grading import CheckResult
    from labctl.steps import Runner, StepEvents, StepResult


@dataclass(frozen=True)
class Prepared:
    """What ``up`` needs before anything starts: the image and each guest's kernel."""

    image: Image
    kernels: dict[str, Kernel]  # guest -> its prepared kernel
    capacity: Estimate | None = None  # the memory check's figures (None: not checked)


def prepare(lab: Lab, events: PrepareEvents | None = None, *, copies: Sequence[Lab] | None = None,
            overcommit: bool = False, capacity: bool = True, kernels: bool = True,
            pinned: Pinned | None = None) -> Prepared:
    """The front of the pipeline, cheapest refusal first, with an error checkpoint after each
    stage (a stage never runs after an earlier one refused, and nothing is started):

    1. capacity: the host holds ``copies`` (default: the lab alone), unless ``overcommit``;
    2. the image, from the cache or built (the slow part of a first run);
    3. the kernels: each can be had (lab file lines), and the preflight of the lab against
       each kernel's ``.config``; its refusals stop here, its warnings go to ``events``;
    4. each guest's kernel prepared (from the cache by content, else downloaded or built),
       unless not ``kernels``: the caller prepares them later itself (bisect, at each commit;
       the kernels of the result are then none).

    ``pinned``: a packed lab's promises (:mod:`labctl.pack`): its image (packed, else the one
    built here, which must have its packages) and the Debian kernels it names still in the
    archive, checked after stage 2; every kernel's build id after stage 4. A refusal is a
    UsageError (exit 2), nothing started.

    :raise HostError: the host cannot hold the guests (exit 3).
    :raise LabFileError: a kernel cannot be had or cannot run the lab (exit 2).
    :raise ImageError: the image or a kernel cannot be made.
    """
    events = events or PrepareEvents()
    estimate = check_capacity(list(copies or [lab]), overcommit=overcommit) if capacity else None
    image = pinned.image if pinned is not None and pinned.image is not None else prepare_image(lab.image, events)
    if pinned is not None:
        check_image(pinned, image)
        check_archive(pinned)
    if not kernels:
        _kernel_checks(lab, image, events)
        return Prepared(image, {}, estimate)
    prepared = prepare_kernels(lab, image, events)
    if pinned is not None:
        check_kernels(pinned, prepared)
    return Prepared(image, prepared, estimate)


def pack_lab(lab: Lab, out: Path, events: PrepareEvents | None = None, *, with_image: bool = True,
             debug: bool = False) -> PackResult:
    """``labctl pack LAB.yaml``: the lab prepared (image and kernels, as :func:`prepare` without the
    capacity check), then packed into ``out`` (:func:`labctl.pack.pack_lab`).

    :raise LabctlError: as :func:`prepare`, or when the lab cannot be packed.
    """
    events = events or PrepareEvents()
    prepared = prepare(lab, events, capacity=False)
    with events.slow(f"packing {lab.name}") as rep:
        return write_pack(lab, prepared.image, prepared.kernels, out, with_image=with_image, debug=debug,
                          reporter=rep)


def pack_run(run_dir: Path, out: Path, events: PrepareEvents | None = None, *, with_image: bool = True,
             debug: bool = False) -> PackResult:
    """``labctl pack RUN_DIR``: the run's lab with the very kernels and image it ran (still in the cache)
    and its manifest and summary.

    :raise UsageError: when the bundle lacks them or its kernels or image are gone from the cache.
    """
    text, image_ref, kernel_dirs = run_inputs(run_dir)
    lab = load_lab_text(text, str(run_dir / "lab.yaml"))
    image = ImageStore().get(str(image_ref.get("name")), str(image_ref.get("key")))
    if image is None:
        raise UsageError(f"{run_dir}: the run's image {image_ref.get('name')} {image_ref.get('key')} is no longer "
                         "in the cache", hint="pack the lab file instead")
    kernels_ = {g: Kernel.at(d) for g, d in kernel_dirs.items()}
    with (events or PrepareEvents()).slow(f"packing the run {run_dir.name}") as rep:
        return write_pack(lab, image, kernels_, out, with_image=with_image, debug=debug, run_dir=run_dir,
                          reporter=rep)


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
    by_guest = kernel_specs(lab, image)  # once: each step below reads it
    _kernel_checks(lab, image, events, by_guest)
    recipe = load_recipe(image.name)
    if all_prepared(by_guest, recipe):
        return prepare_guest_kernels(by_guest, recipe)
    with events.slow(f"preparing kernels for {lab.name} (first use of each; cached afterwards)") as rep:
        return prepare_guest_kernels(by_guest, recipe, rep)


def _kernel_checks(lab: Lab, image: Image, events: PrepareEvents | None = None,
                   by_guest: Mapping[str, KernelSpec] | None = None) -> None:
    """Each guest's kernel can be had (the lab file's lines), and the lab checked against each
    kernel's ``.config`` (a Debian kernel's package is fetched for it, nothing is built).

    :raise LabFileError: for refusals (exit 2); warnings and notes go to ``events``.
    """
    events = events or PrepareEvents()
    by_guest = kernel_specs(lab, image) if by_guest is None else by_guest
    check_guest_kernels(lab, by_guest)
    report = preflight_kernels(lab, by_guest)
    refuse_kernels(report)
    for line in kernel_warning_lines(report):
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
    from labctl.bundle import copy_inputs, write_manifest
    from labctl.report import render_run, summarize, write_summary
    from labctl.steps import Runner, now

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
    copy_inputs(bundle, lab, state)
    write_manifest(bundle, lab, state, started, finished, runner.commands, status, reason,
                   vmcores=runner.vmcores)
    header = {"lab": lab.name, "status": status, "reason": reason, "started_at": started, "finished_at": finished,
              "accel": state.accel, "vmcores": runner.vmcores}
    write_summary(bundle, summarize(bundle, header, (r.entry() for r in runner.results)))
    reports = list(render_run(bundle))
    outcome = RunOutcome(bundle, status, reason, runner.results, reports)
    if interrupted is not None:
        raise interrupted
    return outcome


class BootCrashes:
    """A guest that crashes while ``run_lab``'s lab comes up: its vmcore, drgn's summary and its
    console in the run's bundle, taken before ``up`` stops it; then the bundle of a run that never
    started its steps (manifest, summary, report), so that the crash is there to read."""

    def __init__(self, lab: Lab, bundle: Path) -> None:
        self.lab, self.bundle = lab, bundle
        self.records: list[VmcoreRecord] = []

    def keep(self, state: LabState, guest: str) -> str:
        """The guest's vmcore, summary and console into the bundle; the line that ends up's error."""
        from labctl.bundle import copy_console, guest_dir, vmcore_record
        from labctl.inspect import capture_crash

        where = self.bundle / guest_dir(guest)
        rec = capture_crash(state, guest, where, when="up", nics=[n.name for n in self.lab.guests[guest].nics])
        copy_console(self.bundle, guest, Path(state.guests[guest].console), state.kernel(guest))
        self.records.append(vmcore_record(self.bundle, rec))
        return f"its vmcore: {where / 'vmcore'}" if rec.get("file") else str(rec.get("error") or "")

    def write_bundle(self, started: str, reason: str, kernels: dict[str, Kernel]) -> None:
        """The bundle of a lab that did not come up, when a guest's crash is in it (else nothing)."""
        if not self.records:
            return
        from labctl.bundle import lab_section, write_crash_manifest
        from labctl.report import render_run, summarize, write_summary
        from labctl.steps import now

        write_crash_manifest(self.bundle, lab_section(self.lab), started, now(), f"up: {reason}", kernels,
                             self.records, self.lab.text)
        header = {"lab": self.lab.name, "status": "failed", "reason": f"up: {reason}", "started_at": started,
                  "finished_at": now(), "accel": None, "vmcores": self.records}
        write_summary(self.bundle, summarize(self.bundle, header, []))
        render_run(self.bundle)


def run_lab(lab: Lab, prepared: Prepared, opts: UpOptions, out_root: Path, up_events: UpEvents | None = None,
            step_events: StepEvents | None = None, keep: bool = False,
            on_up: Callable[[LabState], None] | None = None) -> RunOutcome:
    """The chain after :func:`prepare`, for ``labctl run`` and ``labctl up`` of a lab with steps:
    bundle directory (a bad ``out_root`` fails before anything boots), up,
    ``on_up(state)``, steps, bundle, report, and down unless ``keep``. The lab's
    lock is held throughout: no other labctl takes the lab meanwhile.
    """
    from labctl.bundle import new_bundle_dir
    from labctl.steps import now

    with lab_lock(lab.ident):
        bundle = new_bundle_dir(out_root, lab.ident)
        started, crashes = now(), BootCrashes(lab, bundle)
        try:
            state = up(lab, prepared.image, prepared.kernels, dataclasses.replace(opts, on_boot_crash=crashes.keep),
                       up_events)
        except LabctlError as exc:
            crashes.write_bundle(started, exc.message, prepared.kernels)
            raise
        try:
            if on_up is not None:
                on_up(state)
            return run_steps(lab, state, bundle, step_events)
        finally:
            if not keep:
                down(lab.ident)


@dataclass
class CheckedLab:
    """The results of a lab's checks, and the bundle of the guests that crashed meanwhile (None: none did)."""

    results: list[CheckResult]
    bundle: Path | None = None


def check_lab(state: LabState, checks: Sequence[Check] | None = None, out_root: Path | None = None) -> CheckedLab:
    """The lab's graded checks (:func:`labctl.grading.run_checks`) with the guests' consoles watched:
    a guest that panics or oopses meanwhile leaves a bundle under ``out_root`` (its console, oopses,
    vmcore, drgn's summary and a report), and its checks that did not pass say so. No ``out_root``:
    the checks alone."""
    from labctl.bundle import guest_dir, new_bundle_dir, vmcore_record
    from labctl.grading import ERROR, run_checks
    from labctl.inspect import CrashWatch
    from labctl.steps import now

    if out_root is None:
        return CheckedLab(run_checks(state, checks))
    made: list[Path] = []

    def where(guest: str) -> Path:
        if not made:
            made.append(new_bundle_dir(out_root, f"{state.lab}-check"))
        return made[0] / guest_dir(guest)

    started = now()
    watch = CrashWatch(state, where, {g: [str(n["name"]) for n in state.resolved["guests"][g]["nics"]]
                                      for g in state.guests}, when="labctl check").start()
    try:
        results = run_checks(state, checks)
    finally:
        taken = watch.stop()
    if not taken:
        return CheckedLab(results)
    bundle = made[0] if made else new_bundle_dir(out_root, f"{state.lab}-check")
    crashed = _check_crash_bundle(state, bundle, [vmcore_record(bundle, r) for r in taken], started)
    results = [r if r.passed or r.guest not in crashed else
               dataclasses.replace(r, status=ERROR, detail=f"guest {r.guest} crashed: {crashed[r.guest]}; bundle {bundle}")
               for r in results]
    return CheckedLab(results, bundle)


def _check_crash_bundle(state: LabState, bundle: Path, records: list[VmcoreRecord], started: str) -> dict[str, str]:
    """The bundle of the guests that crashed during a lab's checks: their consoles, the vmcores
    (there already), manifest, summary and report; guest -> its crash's title."""
    from labctl.bundle import copy_console, write_crash_manifest
    from labctl.report import render_run, summarize, write_summary
    from labctl.steps import now

    crashed = {r["guest"]: r.get("title") or "see its console" for r in records}
    for guest in crashed:
        copy_console(bundle, guest, Path(state.guests[guest].console), state.kernel(guest))
    why = "; ".join(f"guest {g} crashed during the checks: {title}" for g, title in crashed.items())
    write_crash_manifest(bundle, {"name": state.lab, "source": state.source, "resolved": state.resolved},
                         started, now(), why, {g: state.kernel(g) for g in state.guests}, records)
    header = {"lab": state.lab, "status": "failed", "reason": why, "started_at": started, "finished_at": now(),
              "accel": state.accel, "vmcores": records}
    write_summary(bundle, summarize(bundle, header, []))
    render_run(bundle)
    return crashed
