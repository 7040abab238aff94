"""The bisect bundle's pages, written after every step (and complete once the answer is known)::

    <bundle>/
        state.json          the bisection (labctl.bisect.statefile): what was asked, every step
        summary.json        what --json prints: the answer, the steps, their times
        report.md, report.html   the step table (commit, subject, build/boot times, verdict, the
                            figure with its spread) and the answer with its diffstat
        first-bad.txt       ``git show --stat`` of the first bad commit
        compare.html        ``labctl compare`` of the last good run and the first bad one
        explained.json      that comparison in short: each run's oracle words, what differs in the setups,
                            the figures that changed most (beyond noise first)
        steps/NN-<sha>/<lab>-<time>/   one run bundle per step (NN-<sha>-build.log: a failed build)
        reference/<lab>-<time>/        the good end's run (--worse-than-good)
        configs/            config bisection: the configs as given (good-given.config, bad-given.config),
                            through olddefconfig (good.config, bad.config) and each step's (NN.config)
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TypedDict

import labctl.bisect.oracle as orc
import labctl.bisect.search as search  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.bisect.tries as tries  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.bisect.statefile import (
    NEW,
    OLD,
    CandidateRecord,
    ConfigsRecord,
    ConfirmationRecord,
    EstimateRecord,
    OracleRecord,
    ResultRecord,
    State,
    Step,
    StepFields,
)
from labctl.bundle import BEYOND as BEYOND_NOISE
from labctl.bundle import Spread, load_run
from labctl.errors import LabctlError
from labctl.paths import atomic_write
from labctl.report import Comparison, Difference, compare_blocks, compare_runs, to_html

SUMMARY = "summary.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
FIRST_BAD = "first-bad.txt"
COMPARE_HTML = "compare.html"
EXPLAINED = "explained.json"  # the first bad run explained: its oracle's words, the figures that changed most
MAX_CHANGED = 8
COLUMNS = ("#", "commit", "subject", "build s", "prepare s", "boot s", "steps s", "labctl s", "tries", "verdict",
           "figure", "why")


class Confidence(TypedDict):
    """--tries auto's confidence (:func:`confidence`): of each passing verdict, and a lower bound of the answer's."""

    verdict: float | None
    answer: float | None
    passing_verdicts: int
    below_95: bool


class ExplainedSide(TypedDict):
    """A step of :class:`Explained`: its number, commit, run bundle and the oracle's words."""

    step: int
    commit: str
    run: str
    reason: str


class ChangedFigure(TypedDict):
    """A figure that changed between the two runs of :class:`Explained` (``a``, ``b``: the means)."""

    figure: str  # STEP[.VARIANT].KEY
    label: str
    unit: str
    a: float | None
    b: float | None
    change_pct: float
    verdict: str


class Explained(TypedDict):
    """explained.json (:func:`explain`): the first bad run against the last good one."""

    last_good: ExplainedSide
    first_bad: ExplainedSide
    differences: list[Difference]
    changed: list[ChangedFigure]


class SummaryStep(StepFields):
    """A step of :class:`BisectSummary` (its verdict in the user's terms; None while it runs)."""

    verdict: str | None
    options: CandidateRecord | None


class BisectSummary(TypedDict):
    """summary.json, and what ``labctl bisect --json`` prints (with ``bundle``): :func:`summary`."""

    lab: str
    tree: str
    oracle: OracleRecord
    oracle_text: str
    terms: list[str]
    good: str
    bad: str
    done: bool
    result: ResultRecord
    tries: int | str  # "auto" before --tries auto's estimate
    tries_auto: bool
    estimate: EstimateRecord | None
    confidence: Confidence | None
    confirmation: ConfirmationRecord | None
    trust: list[str]
    configs: ConfigsRecord | None
    explained: Explained | None
    steps: list[SummaryStep]


def _fig(step: Step) -> str:
    f = step.figure
    if not f:
        return ""
    sp: Spread | dict[str, float] = f.get("spread") or {}  # {}: a record without it
    unit = f" {f.get('unit')}" if f.get("unit") else ""
    if len(f.get("values") or []) > 1:
        return f"{sp.get('mean', 0):.4g}{unit} ({sp.get('min', 0):.4g}..{sp.get('max', 0):.4g}, n={sp.get('n')})"
    return f"{(f.get('values') or [0])[0]:.4g}{unit}"


def rows(state: State) -> list[list[str]]:
    out = []
    for s in state.steps:
        t = s.times
        out.append([str(s.n), s.commit[:12], s.subject, _num(t.get("build")) + (" (cached)" if s.cached_build else ""),
                    _num(t.get("prepare")), _num(t.get("boot")), _num(t.get("steps")), _num(t.get("labctl")),
                    tries.tries_text([str(x.get("outcome")) for x in s.tries]), state.term(s.verdict) if s.verdict else "(running)", _fig(s),
                    "; ".join([s.reason, *s.notes]) if s.notes else s.reason])
    return out


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def last_old_and_first_new(state: State) -> tuple[Step | None, Step | None]:
    """The run of the latest old commit before the answer, and the answer's run (None when not run)."""
    if state.configs:
        return _config_ends(state)
    first = state.result.get("first")
    if not first:
        return None, None
    new = next((s for s in reversed(state.steps) if s.commit == first and s.verdict == NEW), None)
    olds = [s for s in state.steps if s.verdict == OLD and s.run]
    tree = Path(state.tree)
    olds = [s for s in olds if search.is_ancestor(tree, s.commit, first)]
    old = None
    if olds:  # the nearest one: fewest commits between it and the answer
        old = min(olds, key=lambda s: len(search.candidates(tree, first, [s.commit])))
    return old, new


def _config_ends(state: State) -> tuple[Step | None, Step | None]:
    """Config bisection: the runs of the final good and bad ends (None for an end that is a given config)."""
    def run_of(which: str, verdict: str) -> Step | None:
        f = state.configs.get(which)
        return next((s for s in reversed(state.steps) if s.options.get("file") == f and s.verdict == verdict and s.run),
                    None)
    return run_of("good", OLD), run_of("bad", NEW)


def config_lines(state: State) -> list[str]:
    """Config bisection: the commit, what olddefconfig changed of the given configs, the ends now."""
    c = state.configs
    if not c:
        return []
    lines = [f"config bisection at {state.good[:12]}: {c.get('differ', '?')} options differed after olddefconfig"]
    for which, changed in (c.get("olddefconfig") or {}).items():
        if changed:
            lines.append(f"olddefconfig changed the given {which} config: "
                         + ", ".join(f"{n}={v[0]} -> {v[1]}" for n, v in changed.items()))
    if c.get("resolved"):
        lines.append(f"ends: {state.term_old} {c.get('good')}, {state.term_new} {c.get('bad')}")
    return lines


def confidence(state: State) -> Confidence | None:
    """--tries auto's confidence: of each passing verdict, and (a lower bound) of the answer."""
    if not state.estimate:
        return None
    passes = sum(1 for s in state.steps if s.verdict and s.outcome == orc.PASS)
    answer = tries.answer_confidence(state.estimate, passes)
    return {"verdict": state.estimate.get("confidence"), "answer": answer, "passing_verdicts": passes,
            "below_95": bool(answer is not None and answer < 1 - tries.MISS)}


def trust_lines(state: State) -> list[str]:
    """What the answer rests on: the tries, --tries auto's estimate and confidence, the confirmation."""
    lines = []
    if state.tries != 1:
        lines.append(f"tries: {state.tries_wanted()} a commit" + (" (--tries auto)" if state.tries <= 0 else "")
                     + f"; a commit is {state.term_new if not state.oracle.get('fixed') else state.term_old} "
                     "when any try fails, else when all pass")
    if state.estimate:
        lines.append(tries.confidence_text(state.estimate))
        c = confidence(state)
        if state.done and c is not None and c["answer"] is not None:
            lines.append(f"the answer rests on {c['passing_verdicts']} passing verdicts: at least "
                         f"{float(c['answer']):.1%} sure" + (" (BELOW 95%)" if c["below_95"] else ""))
    conf = state.confirmation
    if conf:
        lines.append(f"{str(conf.get('status', '')).upper()}: {conf.get('reason', '')}")
    elif state.done and state.result.get("first") and not state.confirm and not state.configs:
        lines.append("not confirmed by a revert (--no-confirm)")
    return lines


def explain(old: Step, new: Step, result: Comparison) -> Explained:
    """The first bad run against the last good one: what the oracle said of each, how the setups differ, and the
    figures that changed most (those beyond noise first, then by the size of the change)."""
    rows: list[ChangedFigure] = []
    for pair in result["pairs"]:
        where = pair["step"] + (f".{pair['variant']}" if pair["variant"] else "")
        for m in pair["metrics"]:
            if m["change_pct"] is None or not m["change"]:
                continue
            a, b = m["a"], m["b"]
            rows.append({"figure": f"{where}.{m['key']}", "label": m["label"], "unit": m["unit"] or "",
                         "a": a["mean"] if a else None, "b": b["mean"] if b else None,
                         "change_pct": m["change_pct"], "verdict": m["verdict"]})
    rows.sort(key=lambda r: (r["verdict"] != BEYOND_NOISE, -abs(float(r["change_pct"] or 0))))

    def side(s: Step) -> ExplainedSide:
        return {"step": s.n, "commit": s.commit, "run": s.run, "reason": s.reason}

    return {"last_good": side(old), "first_bad": side(new), "differences": result["differences"],
            "changed": rows[:MAX_CHANGED]}


def explained_text(state: State, why: Explained) -> str:
    good, bad = why["last_good"], why["first_bad"]
    lines = [(f"The first {state.term_new} run explained: step {bad['step']} ({bad['commit'][:12]}): {bad['reason']}; "
              f"step {good['step']} ({good['commit'][:12]}, {state.term_old}): {good['reason']}")]
    lines += [f"- {d['what']}: {d['a']} -> {d['b']}" for d in why["differences"]]
    lines += [f"- {r['figure']} ({r['label']}): {r['a']:.4g} -> {r['b']:.4g}{' ' + r['unit'] if r['unit'] else ''} "
              f"({float(r['change_pct']):+.0f}%, {r['verdict']})" for r in why["changed"]
              if isinstance(r["a"], int | float) and isinstance(r["b"], int | float)]
    return "\n".join(lines)


def explained(bundle: Path) -> Explained | None:
    """The bundle's explanation of the first bad run (None before the answer, or without a good run to compare)."""
    try:
        data: Explained | None = json.loads((bundle / EXPLAINED).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def summary(state: State, bundle: Path | None = None) -> BisectSummary:
    return {"lab": state.lab_file, "tree": state.tree, "oracle": state.oracle,
            "oracle_text": orc.describe(orc.Oracle.from_dict(state.oracle)), "terms": [state.term_old, state.term_new],
            "good": state.good, "bad": state.bad, "done": state.done, "result": state.result,
            "tries": state.tries_wanted() if state.tries > 0 or state.estimate else "auto", "tries_auto": state.tries <= 0,
            "estimate": state.estimate or None, "confidence": confidence(state),
            "confirmation": state.confirmation or None, "trust": trust_lines(state),
            "configs": state.configs or None,
            "explained": explained(bundle) if bundle is not None else None,
            "steps": [{"n": s.n, "commit": s.commit, "subject": s.subject,
                       "verdict": state.term(s.verdict) if s.verdict else None, "outcome": s.outcome,
                       "reason": s.reason, "figure": s.figure, "run": s.run, "attempts": s.attempts, "tries": s.tries,
                       "cached_build": s.cached_build, "times": s.times, "options": s.options or None,
                       "notes": s.notes}
                      for s in state.steps]}


def answer_text(state: State) -> str:
    r = state.result
    if state.configs:
        return str(r.get("text") or "not known yet")
    if r.get("first"):
        return f"first {state.term_new} commit: {r['first']} {r.get('subject', '')}"
    if r.get("candidates"):
        return (f"the first {state.term_new} commit is one of {len(r['candidates'])} (the others were skipped): "
                + " ".join(c[:12] for c in r["candidates"]))
    return "not known yet"


def _compare(bundle: Path, state: State) -> list[str]:
    """compare.html and explained.json of the last good and the first bad run; what the report says of them."""
    old, new = last_old_and_first_new(state)
    if old is None or new is None or not new.run:
        what = "the answer's bad end" if state.configs else f"{str(state.result.get('first'))[:12]}"
        return [f"no comparison: no run of a {state.term_old} {'config' if state.configs else 'commit'}"
                if new is not None else f"no comparison: {what} was never run (the {state.term_new} end)"]
    try:
        result = compare_runs(load_run(bundle / old.run), load_run(bundle / new.run))
        atomic_write(bundle / COMPARE_HTML, to_html(compare_blocks(result),
                                                    f"labctl compare: step {old.n} vs step {new.n}"))
        why = explain(old, new, result)
        atomic_write(bundle / EXPLAINED, json.dumps(why, indent=1) + "\n")
        return [(f"[{COMPARE_HTML}]({COMPARE_HTML}): labctl compare of step {old.n} ({state.term_old}, "
                 f"{old.commit[:12]}) and step {new.n} ({state.term_new}, {new.commit[:12]}), "
                 f"{result.get('flagged', 0)} figures changed beyond noise"), explained_text(state, why)]
    except LabctlError as exc:
        return [f"no comparison: {exc.message}"]


def write(bundle: Path, state: State) -> None:
    """Every page of the bisect bundle, from the state (the compare page once the answer is known)."""
    tree = Path(state.tree)
    extra: list[str] = list(config_lines(state))
    if state.done and state.configs:
        extra += _compare(bundle, state)
    elif state.done and state.result.get("first"):
        first = state.result["first"]
        try:
            stat = search.diffstat(tree, first)
        except LabctlError as exc:
            stat = exc.message
        atomic_write(bundle / FIRST_BAD, stat)
        extra.append(f"`git show --stat` of {first[:12]} ({FIRST_BAD}):\n\n```\n{stat.rstrip()}\n```")
        extra += _compare(bundle, state)
    ends = (f"at {state.good[:12]}, {state.term_old} config {state.configs.get('given_good', '')}, {state.term_new} "
            f"config {state.configs.get('given_bad', '')}" if state.configs else
            f"{state.term_old} {state.good[:12]}, {state.term_new} {state.bad[:12]}")
    head = [f"# labctl bisect: {state.lab_file}", "",
            f"tree {state.tree}, {ends}; oracle: {orc.describe(orc.Oracle.from_dict(state.oracle))}", "",
            f"**{answer_text(state)}**", ""]
    head += [f"- {line}" for line in trust_lines(state)] + ([""] if trust_lines(state) else [])
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows(state)]
    md = "\n".join(head + table + [""] + [e + "\n" for e in extra])
    atomic_write(bundle / REPORT_MD, md + "\n")
    cells = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows(state))
    extra_html = "".join(f"<pre>{html.escape(e)}</pre>" for e in extra)
    page = ("<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>labctl bisect</title><style>td,th{{border:1px solid #ccc;padding:2px 6px}}"
            f"table{{border-collapse:collapse}}</style></head><body>"
            f"<h1>labctl bisect: {html.escape(state.lab_file)}</h1>"
            f"<p>{html.escape(head[2])}</p><p><b>{html.escape(answer_text(state))}</b></p>"
            + "".join(f"<p>{html.escape(line)}</p>" for line in trust_lines(state)) +
            f"<table><tr>{cells}</tr>{body}</table>{extra_html}</body></html>\n")
    atomic_write(bundle / REPORT_HTML, page)
    atomic_write(bundle / SUMMARY, json.dumps(summary(state, bundle), indent=2) + "\n")
