"""The bisection loop: next commit, build, prepare, run the lab, judge, record; until one is left.

Every step goes to the state file before and after it runs, so a bisection interrupted anywhere
(Ctrl-C, a crash, a reboot) goes on with ``--continue`` at the step that was running. An
undecided run is run once more; undecided twice, the commit is skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import labctl.bisect.bundlepages as bundlepages  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.bisect.cfgloop as cfgloop  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.bisect.oracle as orc
import labctl.bisect.search as search  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.bisect.verify as verify  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.bisect.statefile import SKIP, State, Step, save
from labctl.bisect.verify import Run, TryEnv
from labctl.bisect.worktree import OBJTOOL_NOTE, BuildCache, Worktree, config_hash, hash_bytes, objtool_relinked
from labctl.bundle import CONSOLE, GUESTS, SUMMARY, Summary
from labctl.debug import make_title, parse_oopses
from labctl.errors import LabctlError
from labctl.events import NullReporter
from labctl.grading import checks_of, run_checks
from labctl.image import Image, Recipe
from labctl.kernel import Kernel, kernel_options, kernel_specs, prepare_kernel
from labctl.lab import TREE, Check, KernelSpec, Lab
from labctl.pipeline import Prepared, run_lab
from labctl.state import LabState, up_labs
from labctl.up import UpOptions, down

STEPS_DIR = "steps"
REFERENCE_DIR = "reference"
CONFIRM_DIR = verify.CONFIRM_DIR
CONFIRMED, NOT_CONFIRMED = verify.CONFIRMED, verify.NOT_CONFIRMED
COMMAND_TIMEOUT = 120.0


def tree_guests(lab: Lab, tree: Path) -> list[str]:
    """The guests that boot ``tree`` (all of them when no guest names it: the tree is then every guest's)."""
    want = tree.resolve()
    named = [g for g in lab.guests if (s := lab.kernel_of(g)) is not None and s.kind == TREE
             and s.tree is not None and Path(s.tree).resolve() == want]
    return named or list(lab.guests)


def on_tree(lab: Lab, tree: Path, other: Path) -> Lab:
    """``lab`` with every guest that boots ``tree`` booting ``other`` instead; the others keep theirs."""
    want = tree.resolve()

    def moved(spec: KernelSpec | None) -> KernelSpec | None:
        if spec is not None and spec.kind == TREE and spec.tree is not None \
                and Path(spec.tree).resolve() == want:
            return dataclasses.replace(spec, tree=other)
        return spec

    guests = {n: dataclasses.replace(g, kernel=moved(g.kernel)) for n, g in lab.guests.items()}
    changed = dataclasses.replace(lab, kernel=moved(lab.kernel), guests=guests)
    if changed == lab:  # no guest names the tree: every guest boots it
        return lab.with_kernel(KernelSpec(kind=TREE, tree=other, path="--kernel"))
    return changed


def evidence(run_dir: Path | None) -> orc.Evidence:
    """What a run bundle says, for the oracles: its summary and the oopses on each console."""
    ev = orc.Evidence()
    if run_dir is None:
        return ev
    try:
        ev.summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        ev.summary = {}
    oopses: dict[str, list[str]] = {}
    for console in sorted((run_dir / GUESTS).glob(f"*/{CONSOLE}")):
        try:
            found = parse_oopses(console.read_text(errors="replace"))
        except OSError:
            continue
        if found:
            oopses[console.parent.name] = [make_title(o) for o in found]
    ev.oopses = oopses
    return ev


class Bisector:
    """Runs the bisection whose state is ``state``, writing into the bisect bundle ``bundle``."""

    def __init__(self, bundle: Path, state: State, lab: Lab, image: Image, recipe: Recipe, opts: UpOptions,
                 say: Callable[[str], None] = lambda _: None, on_build_line: Callable[[str], None] = lambda _: None,
                 jobs: int | None = None) -> None:
        self.bundle = bundle
        self.state = state
        self.tree = Path(state.tree)
        self.work = Path(state.work)
        self.wt = Worktree(self.tree, self.work)
        self.cache = BuildCache(self.work)
        self.lab = on_tree(lab, self.tree, self.wt.path)
        self.image = image
        self.recipe = recipe
        self.opts = opts
        self.say = say
        self.on_build_line = on_build_line
        self.jobs = jobs or os.cpu_count() or 1
        self.cfg = config_hash(self.tree)
        self.oracle = orc.Oracle.from_dict(state.oracle)

    # ------------------------------------------------------------------ the loop

    def run(self) -> State:
        """Step until the answer is known; the state saved after every step. Ctrl-C re-raised."""
        st = self.state
        if st.configs:
            return cfgloop.run(self)
        for done in st.steps:  # a verdict reached just before an interruption, not counted yet
            if done.verdict:
                st.record(done)
        self.wt.ensure(st.good, self.say)
        self.prelude()
        while not st.done:
            nxt = search.next_step(self.tree, st.news[-1] if st.news else st.bad, st.olds or [st.good], st.skips)
            if nxt.commit is None:
                st.done = True
                st.result = ({"first": nxt.first, "subject": search.subject(self.tree, nxt.first or "")}
                             if nxt.first else {"candidates": list(nxt.candidates)})
                save(self.bundle, st)
                break
            pending = [s for s in st.steps if s.commit == nxt.commit and not s.verdict]
            step = pending[0] if pending else Step(n=len(st.steps) + 1, commit=nxt.commit,
                                                   subject=search.subject(self.tree, nxt.commit))
            if not pending:
                st.steps.append(step)
            self.say(f"step {step.n}: {nxt.commit[:12]} {step.subject}  "
                     f"({nxt.remaining} commits left, about {nxt.steps_left} steps)")
            save(self.bundle, st)
            self.one_step(step)
            st.record(step)
            save(self.bundle, st)
            bundlepages.write(self.bundle, st)
            self.say(f"step {step.n}: {step.commit[:12]} is {st.term(step.verdict)}: {step.reason}  "
                     f"[{times_text(step.times)}]")
        if st.confirm and st.result.get("first") and not st.confirmation:
            verify.confirm(self)
            save(self.bundle, st)
            bundlepages.write(self.bundle, st)
        return st

    def prelude(self) -> None:
        """What runs before the first step: the good end for --worse-than-good, the failing end for --tries auto."""
        if self.oracle.kind == "figure" and self.oracle.worse_than_good is not None and not self.state.reference:
            self._reference()
        if self.state.tries <= 0 and not self.state.estimate:
            verify.estimate(self)

    def end_config(self, new: bool) -> bytes | None:
        """Config bisection: the new (bad) or old (good) end's ``.config``; None when commits are bisected."""
        if not self.state.configs:
            return None
        return cfgloop.end_bytes(self.bundle, self.state, "bad" if new else "good")

    def times_text(self, t: dict[str, float]) -> str:
        return times_text(t)

    def _reference(self) -> None:
        """--worse-than-good: the good end run once, its figures the reference."""
        st = self.state
        self.say(f"reference: the {st.term_old} end {st.good[:12]} (for --worse-than-good)")
        kernel, _, why = self.kernel(st.good, Step(n=0, commit=st.good), config=self.end_config(False))
        if kernel is None:
            raise LabctlError(f"the {st.term_old} end {st.good[:12]} cannot be built: {why}")
        run = self.run_lab(kernel, self.bundle / REFERENCE_DIR)
        if run.run_dir is None:
            raise LabctlError(f"the {st.term_old} end {st.good[:12]} does not run the lab: {run.error}")
        st.reference = str(run.run_dir.relative_to(self.bundle))
        save(self.bundle, st)

    # ------------------------------------------------------------------ one step

    def one_step(self, step: Step, config: bytes | None = None) -> None:
        """Build the step's commit (with ``config``, config bisection), run the lab on it, judge it."""
        t0 = time.monotonic()
        step.times = {}
        step.tries = []
        step.notes = []
        kernel, _built, why = self.kernel(step.commit, step, config=config)
        if kernel is None:
            step.verdict, step.outcome, step.reason = SKIP, "", why
            step.times["total"] = round(time.monotonic() - t0, 2)
            return
        out = self.bundle / STEPS_DIR / f"{step.n:02d}-{step.commit[:12]}"
        j = verify.run_tries(self, kernel, step.commit, out, self.state.tries_wanted(), step.times, step.tries)
        step.attempts, step.run, step.figure = j.attempts, j.run, j.figure
        step.outcome, step.reason = j.outcome, j.reason
        step.verdict = SKIP if j.outcome in ("", orc.UNDECIDED) else self.verdict(j.outcome)
        verify.own_share(step.times, t0)

    def verdict(self, outcome: str) -> str:
        return orc.term_of(outcome, self.oracle.fixed)

    def reference_summary(self) -> Summary | None:
        if not self.state.reference:
            return None
        return evidence(self.bundle / self.state.reference).summary.copy()

    def kernel(self, commit: str, step: Step, revert_of: str = "",
               config: bytes | None = None) -> tuple[Kernel | None, bool, str]:
        """The commit's kernel (with ``revert_of`` reverted on it; built with ``config``, else the tree's
        ``.config``), prepared: from the build cache, else checked out, built and prepared."""
        key = f"{commit}-revert-{revert_of}" if revert_of else commit
        cfg = hash_bytes(config) if config is not None else self.cfg
        cached = self.cache.get(key, cfg)
        if cached is not None:
            step.cached_build = True
            step.times.update({"build": 0.0, "prepare": 0.0})
            self.say(f"  {commit[:12]}: built before (kernel {cached.name})")
            return Kernel.at(cached), False, ""
        failed = self.cache.failure(key, cfg)
        if failed is not None:
            step.cached_build = True
            step.times["build"] = 0.0
            return None, False, f"does not build: {failed} (built before)"
        t0 = time.monotonic()
        self.wt.checkout(commit)
        if revert_of:
            why = self.wt.revert(revert_of)
            if why:
                return None, False, f"cannot be made: the revert does not apply: {why}"
        step.times["checkout"] = round(time.monotonic() - t0, 2)
        self.say(f"  {commit[:12]}{' with ' + revert_of[:12] + ' reverted' if revert_of else ''}: building "
                 f"(make -j{self.jobs} vmlinux modules)")
        res = self.wt.build(self.jobs, self._build_line(step), config)
        step.times["build"] = round(res.seconds, 2)
        if not res.ok:
            (self.bundle / STEPS_DIR).mkdir(parents=True, exist_ok=True)
            log = f"{CONFIRM_DIR}-build.log" if revert_of else f"{step.n:02d}-{commit[:12]}-build.log"
            (self.bundle / STEPS_DIR / log).write_text(res.log + "\n")
            if ": error:" in res.reason:  # the code does not compile (not a killed or out-of-space make)
                self.cache.put_failure(key, cfg, res.reason)
            return None, False, f"does not build: {res.reason}"
        self.say(f"  {commit[:12]}: built in {res.seconds:.0f} s; preparing the kernel")
        t1 = time.monotonic()
        spec = KernelSpec(kind=TREE, tree=self.wt.path, path="--kernel")
        try:
            kernel = prepare_kernel(spec, kernel_options(self.recipe), NullReporter())
        except LabctlError as exc:
            return None, True, f"its kernel cannot be prepared: {exc.message}"
        step.times["prepare"] = round(time.monotonic() - t1, 2)
        self.cache.put(key, cfg, kernel.dir)
        return kernel, True, ""

    def _build_line(self, step: Step) -> Callable[[str], None]:
        """make's lines to the CLI; the progress says why when objtool is rebuilt (the whole kernel follows)."""
        def line(text: str) -> None:
            if objtool_relinked(text) and OBJTOOL_NOTE not in step.notes:
                step.notes.append(OBJTOOL_NOTE)
                self.say(f"  {OBJTOOL_NOTE}")
            self.on_build_line(text)
        return line

    def _kernels(self, tree_kernel: Kernel) -> dict[str, Kernel]:
        guests = set(tree_guests(self.lab, self.wt.path))
        opts = kernel_options(self.recipe)
        out: dict[str, Kernel] = {}
        for g, spec in kernel_specs(self.lab, self.image).items():
            out[g] = tree_kernel if g in guests else prepare_kernel(spec, opts, NullReporter())
        return out

    def run_lab(self, kernel: Kernel, out_root: Path, env: TryEnv | None = None) -> Run:
        """Up, the lab's steps into a run bundle under ``out_root``, the oracle's commands, down."""
        times: dict[str, float] = {}
        t0 = time.monotonic()
        up_state: list[LabState] = []

        def on_up(state: LabState) -> None:
            times["boot"] = round(time.monotonic() - t0, 2)
            up_state.append(state)
            how = "restored" if state.warm else "up"
            self.say(f"  {how} in {times['boot']:.1f} s; running the lab's steps")

        kernels = self._kernels(kernel)
        if self.state.lab_up and self.lab.ident in up_labs():  # left up by this bisection when interrupted
            with contextlib.suppress(LabctlError):
                down(self.lab.ident)
        self.state.lab_up = True
        save(self.bundle, self.state)
        self.say(f"  booting {self.lab.name} on {kernel.name}")
        run_dir: Path | None = None
        error = ""
        ev = orc.Evidence()
        try:
            try:
                outcome = run_lab(self.lab, Prepared(self.image, kernels), self.opts, out_root, None, None, keep=True,
                                  on_up=on_up)
                run_dir = outcome.bundle
                t1 = time.monotonic()
                times["steps"] = round(t1 - t0 - times.get("boot", 0.0), 2)
                ev = evidence(run_dir)
                if orc.needs_lab_after_steps(self.oracle) and up_state:
                    self._after_steps(up_state[0], ev, env or TryEnv())
                times["oracle_run"] = round(time.monotonic() - t1, 2)
            except LabctlError as exc:
                error = exc.message
                if not up_state:
                    times["boot"] = round(time.monotonic() - t0, 2)
                dirs = sorted(p for p in out_root.glob("*") if p.is_dir()) if out_root.is_dir() else []
                if dirs and (dirs[-1] / SUMMARY).is_file():
                    run_dir = dirs[-1]
                    ev = evidence(run_dir)
        finally:
            t2 = time.monotonic()
            if up_state:
                try:
                    down(self.lab.ident)
                except LabctlError:
                    pass
            times["down"] = round(time.monotonic() - t2, 2)
            self.state.lab_up = False
            save(self.bundle, self.state)
        return Run(ev, run_dir, times, error, bool(up_state and up_state[0].warm))

    def _after_steps(self, state: LabState, ev: orc.Evidence, env: TryEnv) -> None:
        o = self.oracle
        if o.kind == "check":
            wanted = [c for c in checks_of(state) if c.name == o.name]
            ev.checks = [r.to_dict() for r in run_checks(state, wanted)] if wanted else []
        elif o.kind in ("command", "drgn"):
            guest = str(o.guest or next(iter(self.lab.guests)))
            command = str(o.command) if o.kind == "drgn" else env.prefix() + str(o.command)
            check = Check(name=o.kind, guest=guest, command=command, timeout=float(o.timeout or COMMAND_TIMEOUT),
                          kind="drgn" if o.kind == "drgn" else "shell")
            ev.command = run_checks(state, [check])[0].to_dict()


def times_text(t: dict[str, float]) -> str:
    parts = [f"{k} {t[k]:.1f}s" for k in ("build", "prepare", "boot", "steps", "oracle_run", "down", "labctl",
                                          "total") if k in t]
    return ", ".join(parts)
