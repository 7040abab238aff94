"""The bisect bundle's pages, written after every step (and complete once the answer is known)::

    <bundle>/
        state.json          the bisection (labctl.bisect.state): what was asked, every step
        summary.json        what --json prints: the answer, the steps, their times
        report.md, report.html   the step table (commit, subject, build/boot times, verdict, the
                            figure with its spread) and the answer with its diffstat
        first-bad.txt       ``git show --stat`` of the first bad commit
        compare.html        ``labctl compare`` of the last good run and the first bad one
        steps/NN-<sha>/<lab>-<time>/   one run bundle per step (NN-<sha>-build.log: a failed build)
        reference/<lab>-<time>/        the good end's run (--worse-than-good)
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import labctl.bisect.oracle as orc
import labctl.bisect.search as search  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.bisect.state import NEW, OLD, State, Step
from labctl.bundle import load_run
from labctl.errors import LabctlError
from labctl.paths import atomic_write
from labctl.report import compare_blocks, compare_runs, to_html

SUMMARY = "summary.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
FIRST_BAD = "first-bad.txt"
COMPARE_HTML = "compare.html"
COLUMNS = ("#", "commit", "subject", "build s", "prepare s", "boot s", "steps s", "labctl s", "verdict", "figure",
           "why")


def _fig(step: Step) -> str:
    f = step.figure
    if not f:
        return ""
    sp = f.get("spread") or {}
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
                    state.term(s.verdict) if s.verdict else "(running)", _fig(s), s.reason])
    return out


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def last_old_and_first_new(state: State) -> tuple[Step | None, Step | None]:
    """The run of the latest old commit before the answer, and the answer's run (None when not run)."""
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


def summary(state: State) -> dict[str, Any]:
    return {"lab": state.lab_file, "tree": state.tree, "oracle": state.oracle,
            "oracle_text": orc.describe(orc.Oracle.from_dict(state.oracle)), "terms": [state.term_old, state.term_new],
            "good": state.good, "bad": state.bad, "done": state.done, "result": state.result,
            "steps": [{"n": s.n, "commit": s.commit, "subject": s.subject,
                       "verdict": state.term(s.verdict) if s.verdict else None, "outcome": s.outcome,
                       "reason": s.reason, "figure": s.figure, "run": s.run, "attempts": s.attempts,
                       "cached_build": s.cached_build, "times": s.times} for s in state.steps]}


def answer_text(state: State) -> str:
    r = state.result
    if r.get("first"):
        return f"first {state.term_new} commit: {r['first']} {r.get('subject', '')}"
    if r.get("candidates"):
        return (f"the first {state.term_new} commit is one of {len(r['candidates'])} (the others were skipped): "
                + " ".join(c[:12] for c in r["candidates"]))
    return "not known yet"


def write(bundle: Path, state: State) -> None:
    """Every page of the bisect bundle, from the state (the compare page once the answer is known)."""
    tree = Path(state.tree)
    extra: list[str] = []
    if state.done and state.result.get("first"):
        first = state.result["first"]
        try:
            stat = search.diffstat(tree, first)
        except LabctlError as exc:
            stat = exc.message
        atomic_write(bundle / FIRST_BAD, stat)
        extra.append(f"`git show --stat` of {first[:12]} ({FIRST_BAD}):\n\n```\n{stat.rstrip()}\n```")
        old, new = last_old_and_first_new(state)
        if old is not None and new is not None and new.run:
            try:
                result = compare_runs(load_run(bundle / old.run), load_run(bundle / new.run))
                atomic_write(bundle / COMPARE_HTML, to_html(compare_blocks(result),
                                                            f"labctl compare: {old.commit[:12]} vs {new.commit[:12]}"))
                extra.append(f"[{COMPARE_HTML}]({COMPARE_HTML}): labctl compare of step {old.n} "
                             f"({state.term_old}, {old.commit[:12]}) and step {new.n} ({state.term_new}, "
                             f"{new.commit[:12]}), {result.get('flagged', 0)} figures changed beyond noise")
            except LabctlError as exc:
                extra.append(f"no comparison: {exc.message}")
        else:
            extra.append(f"no comparison: no run of a {state.term_old} commit"
                         if new is not None else f"no comparison: {first[:12]} was never run (the {state.term_new} end)")
    head = [f"# labctl bisect: {state.lab_file}", "",
            (f"tree {state.tree}, {state.term_old} {state.good[:12]}, {state.term_new} {state.bad[:12]}; "
             f"oracle: {orc.describe(orc.Oracle.from_dict(state.oracle))}"), "", f"**{answer_text(state)}**", ""]
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
            f"<table><tr>{cells}</tr>{body}</table>{extra_html}</body></html>\n")
    atomic_write(bundle / REPORT_HTML, page)
    atomic_write(bundle / SUMMARY, json.dumps(summary(state), indent=2) + "\n")
