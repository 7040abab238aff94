"""Oracles: what makes a run of the lab *pass* (the old behaviour) or *fail* (the new one).

Each oracle looks at one run of the lab and says ``pass``, ``fail`` or ``undecided`` with its
reason; the engine maps pass/fail to good/bad (or to the user's terms) and an undecided run is
retried once, then skipped, never guessed.

* ``check NAME``: the lab's graded check NAME passes (run on the guests after the steps);
* ``step NAME``: every run of step NAME succeeds: no failed command, no timeout, no guest gone,
  and no oops or panic on any console;
* ``panic``: no guest panics or oopses during the run;
* ``command CMD`` (on a guest): the command exits 0;
* ``drgn EXPR`` (on a guest): the expression on its running kernel is true, read with drgn after the
  steps (the language of a lab file's ``drgn:`` check, :mod:`labctl.lab.drgnexpr`);
* ``figure STEP[.VARIANT].KEY`` with ``below X`` (fail when below), ``above X`` (fail when
  above) or ``worse_than_good PCT`` (fail when worse than the good end's runs by more than PCT
  percent and beyond their noise): judged over the step's ``repeat:`` runs. When the runs'
  range straddles the bound (or the change is beyond PCT but within the noise) the run is
  undecided.

Pure functions of what a run left (its summary.json, consoles, check results): no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from labctl.bisect.statefile import NEW, OLD, FigureRecord, OracleRecord
from labctl.bundle import BEYOND as BEYOND_NOISE
from labctl.bundle import Summary, repeat_key, run_steps, spread, verdict
from labctl.errors import UsageError
from labctl.grading import CheckRecord
from labctl.report import step_metrics

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
KINDS = ("check", "step", "panic", "command", "drgn", "figure")
ALIASES = {"throughput": "throughput_mbit_s", "cpu_load": "cpu_load_pct", "driver_share": "driver_share_pct"}


@dataclass(frozen=True)
class Oracle:
    """What makes a run pass, as the command line asked it (:func:`make` checks it). The state file
    keeps :meth:`to_dict` (its kind and the fields given)."""

    kind: str
    name: str | None = None  # check, step
    command: str | None = None  # command; drgn: the expression
    guest: str | None = None  # command's and drgn's --on
    timeout: float | None = None  # command, drgn
    figure: str | None = None  # STEP[.VARIANT].KEY
    below: float | None = None
    above: float | None = None
    worse_than_good: float | None = None
    fixed: bool = False  # look for the commit that made it pass

    def to_dict(self) -> OracleRecord:
        out: OracleRecord = {"kind": self.kind}
        if self.name is not None:
            out["name"] = self.name
        if self.command is not None:
            out["command"] = self.command
        if self.guest is not None:
            out["guest"] = self.guest
        if self.timeout is not None:
            out["timeout"] = self.timeout
        if self.figure is not None:
            out["figure"] = self.figure
        if self.below is not None:
            out["below"] = self.below
        if self.above is not None:
            out["above"] = self.above
        if self.worse_than_good is not None:
            out["worse_than_good"] = self.worse_than_good
        if self.fixed:
            out["fixed"] = True
        return out

    @classmethod
    def from_dict(cls, d: OracleRecord) -> Oracle:
        """An oracle from the state file (unknown keys ignored).

        :raise UsageError: when it has no kind.
        """
        if not isinstance(d.get("kind"), str):
            raise UsageError("the bisection's oracle has no kind: its state file is damaged")
        return cls(d["kind"], d.get("name"), d.get("command"), d.get("guest"), d.get("timeout"), d.get("figure"),
                   d.get("below"), d.get("above"), d.get("worse_than_good"), d.get("fixed", False))


@dataclass(frozen=True)
class Judgement:
    outcome: str  # PASS, FAIL, UNDECIDED
    reason: str
    figure: FigureRecord | None = None


@dataclass
class Evidence:
    """What one run of the lab left, for the oracles."""

    summary: Summary = field(default_factory=Summary)  # the run bundle's summary.json
    oopses: Mapping[str, Sequence[str]] = field(default_factory=dict)  # guest -> titles of its oopses/panics
    checks: Sequence[CheckRecord] = ()  # the checks run after the steps
    command: CheckRecord | None = None  # the command oracle's


def make(kind: str, **kw: Any) -> Oracle:
    """An oracle, checked.

    :raise UsageError: for a bad combination.
    """
    if kind not in KINDS:
        raise UsageError(f"unknown oracle '{kind}'")
    if kind in ("check", "step") and not kw.get("name"):
        raise UsageError(f"--{kind} needs a name")
    if kind == "command" and not kw.get("command"):
        raise UsageError("--command needs a command")
    if kind == "drgn":
        from labctl.lab import parse_drgn

        try:
            parse_drgn(str(kw.get("command") or ""))
        except ValueError as exc:
            raise UsageError(f"--drgn: {exc}") from None
    if kind == "figure":
        bounds = [k for k in ("below", "above", "worse_than_good") if kw.get(k) is not None]
        if len(bounds) != 1:
            raise UsageError("--figure needs one of --below X, --above X, --worse-than-good PCT")
        if not kw.get("figure") or "." not in str(kw["figure"]):
            raise UsageError("--figure: give STEP.KEY or STEP.VARIANT.KEY (for example transfer.e1000.throughput)")
        if kw.get("worse_than_good") is not None and float(kw["worse_than_good"]) < 0:
            raise UsageError("--worse-than-good: give a percentage of at least 0")
    return Oracle(kind, **{k: v for k, v in kw.items() if v is not None})


def describe(oracle: Oracle) -> str:
    kind = oracle.kind
    if kind == "check":
        return f"check {oracle.name} passes"
    if kind == "step":
        return f"step {oracle.name} succeeds"
    if kind == "panic":
        return "no guest panics or oopses"
    if kind == "command":
        return f"'{oracle.command}' on {oracle.guest or 'the first guest'} exits 0"
    if kind == "drgn":
        return f"'{oracle.command}' is true on {oracle.guest or 'the first guest'}'s kernel"
    if kind == "figure":
        if oracle.below is not None:
            return f"{oracle.figure} is not below {oracle.below:g}"
        if oracle.above is not None:
            return f"{oracle.figure} is not above {oracle.above:g}"
        return f"{oracle.figure} is not worse than the good end's by more than {oracle.worse_than_good:g}%"
    return str(kind)


def needs_lab_after_steps(oracle: Oracle) -> bool:
    """True when the oracle runs something on the guests once the steps are done."""
    return oracle.kind in ("check", "command", "drgn")


def term_of(outcome: str, fixed: bool) -> str:
    """A decided run's verdict in git bisect's words: a pass is the old behaviour, a failure the new
    one; looking for the fix (``fixed``), the other way round."""
    if outcome == PASS:
        return NEW if fixed else OLD
    return OLD if fixed else NEW


def judge(oracle: Oracle, ev: Evidence, reference: Summary | None = None) -> Judgement:
    """The oracle's verdict on one run; ``reference`` is the good end's summary (worse_than_good)."""
    kind = oracle.kind
    if kind == "check":
        return _check(str(oracle.name), ev)
    if kind == "step":
        return _step(str(oracle.name), ev)
    if kind == "panic":
        return _panic(ev)
    if kind in ("command", "drgn"):
        return _command(ev, "the command" if kind == "command" else "the expression")
    if kind == "figure":
        return _figure(oracle, ev, reference)
    return Judgement(UNDECIDED, f"unknown oracle {kind}")


def _oops_text(ev: Evidence) -> str:
    return "; ".join(f"{g}: {t[0]}" + (f" (+{len(t) - 1} more)" if len(t) > 1 else "")
                     for g, t in sorted(ev.oopses.items()) if t)


def _check(name: str, ev: Evidence) -> Judgement:
    found = [c for c in ev.checks if c.get("name") == name]
    if not found:
        return Judgement(UNDECIDED, f"check {name} did not run")
    c = found[0]
    status = c.get("status")
    if status == "pass":
        return Judgement(PASS, f"check {name} passed")
    if status in ("fail", "timeout"):
        why = f"exit {c.get('exit_status')}" if status == "fail" else "timed out"
        return Judgement(FAIL, f"check {name} failed ({why})")
    return Judgement(UNDECIDED, f"check {name} could not run: {c.get('detail') or status}")


def _step(name: str, ev: Evidence) -> Judgement:
    runs = [s for s in run_steps(ev.summary) if s.get("name") == name]
    if not runs:
        return Judgement(UNDECIDED, f"step {name} did not run")
    oops = _oops_text(ev)
    if oops:
        return Judgement(FAIL, f"oops: {oops}")
    failed = [s for s in runs if s.get("status") == "failed"]
    if failed:
        return Judgement(FAIL, f"step {name} failed: {failed[0].get('reason') or 'failed'}")
    if any(s.get("status") == "skipped" for s in runs):
        return Judgement(UNDECIDED, f"step {name} was skipped (an earlier step stopped the run)")
    return Judgement(PASS, f"step {name} succeeded" + (f" ({len(runs)} runs)" if len(runs) > 1 else ""))


def _panic(ev: Evidence) -> Judgement:
    oops = _oops_text(ev)
    if oops:
        return Judgement(FAIL, f"oops: {oops}")
    if not ev.summary:
        return Judgement(UNDECIDED, "the run left no summary")
    return Judgement(PASS, "no guest panicked or oopsed")


def _command(ev: Evidence, what: str = "the command") -> Judgement:
    c = ev.command
    if not c:
        return Judgement(UNDECIDED, f"{what} did not run")
    status = c.get("status")
    if status == "pass":
        return Judgement(PASS, f"{what} exited 0" if c.get("exit_status") is not None else f"{what} is true")
    if status == "fail":
        return Judgement(FAIL, f"{what} exited {c.get('exit_status')}" if c.get("exit_status") is not None
                         else f"{what} is false: {c.get('detail')}")
    if status == "timeout":
        return Judgement(FAIL, f"{what} timed out")
    return Judgement(UNDECIDED, f"{what} could not run: {c.get('detail') or status}")


def figure_values(summary: Summary, name: str) -> tuple[list[float], str] | None:
    """The values of figure ``STEP[.VARIANT].KEY`` over the step's runs (repeats), and its unit;
    None when no run of the step has it. A variant name is taken when the step has one of that name."""
    step, _, rest = name.partition(".")
    runs = [s for s in run_steps(summary) if s.get("name") == step]
    variants = {repeat_key(s)[1] for s in runs}
    variant: str | None = None
    head, _, tail = rest.partition(".")
    if tail and head in variants:
        variant, key = head, tail
    else:
        key = rest
        if len(variants) > 1:
            return None  # ambiguous: the figure must name the variant
    key = ALIASES.get(key, key)
    values: list[float] = []
    unit = ""
    for s in runs:
        if repeat_key(s)[1] != variant or s.get("status") in ("failed", "skipped"):
            continue
        got = step_metrics(s).get(key)
        if got is not None:
            values.append(float(got[0]))
            unit = got[2]
    return (values, unit) if values else None


def _figure(oracle: Oracle, ev: Evidence, reference: Summary | None) -> Judgement:
    name = str(oracle.figure)
    got = figure_values(ev.summary, name)
    if got is None:
        step = name.partition(".")[0]
        failed = [s for s in run_steps(ev.summary) if s.get("name") == step and s.get("status") == "failed"]
        why = f": step {step} failed ({failed[0].get('reason')})" if failed else ""
        return Judgement(UNDECIDED, f"no value of {name} in the run{why}")
    values, unit = got
    fig: FigureRecord = {"name": name, "unit": unit, "values": values, "spread": spread(values)}
    lo, hi = min(values), max(values)
    u = f" {unit}" if unit else ""
    shown = f"{lo:.4g}..{hi:.4g}{u}" if len(values) > 1 else f"{lo:.4g}{u}"
    if oracle.below is not None or oracle.above is not None:
        below = oracle.below is not None
        bound = float(oracle.below if oracle.below is not None else oracle.above)  # type: ignore[arg-type]
        fig["bound"] = bound
        if (hi < bound) if below else (lo > bound):
            return Judgement(FAIL, f"{name} {shown}: {'below' if below else 'above'} {bound:g}", fig)
        if (lo >= bound) if below else (hi <= bound):
            return Judgement(PASS, f"{name} {shown}: not {'below' if below else 'above'} {bound:g}", fig)
        return Judgement(UNDECIDED, f"{name} {shown}: the runs straddle {bound:g}", fig)
    pct = float(oracle.worse_than_good or 0.0)
    ref = figure_values(reference or {}, name)
    if ref is None:
        return Judgement(UNDECIDED, f"no value of {name} in the good end's run", fig)
    ref_values = ref[0]
    better = _better(ev.summary, name)
    base = sum(ref_values) / len(ref_values)
    mean = sum(values) / len(values)
    change = 100.0 * (mean - base) / abs(base) if base else 0.0
    worse = -change * better if better else abs(change)
    fig.update({"reference": ref_values, "change_pct": round(change, 2)})
    noise = verdict(ref_values, values)
    fig["noise"] = noise
    if worse <= pct:
        return Judgement(PASS, f"{name} {shown}: {change:+.1f}% against the good end (not worse by {pct:g}%)", fig)
    if noise == BEYOND_NOISE:
        return Judgement(FAIL, f"{name} {shown}: {change:+.1f}% against the good end, beyond noise", fig)
    return Judgement(UNDECIDED, f"{name} {shown}: {change:+.1f}% against the good end but {noise}", fig)


def _better(summary: Summary, name: str) -> int:
    """+1 when more is better for the figure, -1 when less is, 0 when neither."""
    step, _, rest = name.partition(".")
    rest = ".".join(ALIASES.get(p, p) for p in rest.split("."))
    for s in run_steps(summary):
        if s.get("name") != step:
            continue
        for key, (_, _, _, better) in step_metrics(s).items():
            if rest == key or rest.endswith("." + key):
                return int(better)
    return 0
