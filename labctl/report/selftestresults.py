"""The selftests section, for a step of the ``kselftest`` kind: a table per test (result, time, why it
skipped) and the log of each failure (from summary.json's ``kselftest`` record, which the step's
kind wrote, :mod:`labctl.steps.selftests`, and the per-test log files); the counts in the results
table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from labctl.bundle import BuildRecord, Run, StepSummary, as_dict
from labctl.report.document import Block, Heading, Inline, Para, Row, Span, Table, txt
from labctl.report.sections import Column, ReportSection, kinds_of

MAX_LOG_LINES = 60
_STYLE = {"pass": "good", "xfail": "good", "skip": "muted", "fail": "bad"}


def _log_tail(root: Path, rel: str) -> str:
    p = (root / rel).resolve()
    if not p.is_relative_to(root.resolve()) or not p.is_file():
        return ""
    lines = p.read_text(errors="replace").splitlines()
    return "\n".join((["[...]"] if len(lines) > MAX_LOG_LINES else []) + lines[-MAX_LOG_LINES:])


def kselftest_blocks(root: Path, step: StepSummary) -> list[Block]:
    record = step.get("kselftest")
    if not isinstance(record, Mapping) or not record.get("tests"):
        return []
    counts = record.get("counts") or {}
    build: BuildRecord | dict[str, None] = record.get("build") or {}
    blocks: list[Block] = [
        Heading(4, f"Kernel selftests ({record.get('target')}, on {record.get('guest')})"),
        Para(txt(", ".join(f"{v} {k}" for k, v in counts.items()) + f"; built from {record.get('tree')}"
                 + (" (cached build)" if build.get("cached") else f" in {build.get('seconds')} s")
                 + (f"; not built: {', '.join(build.get('not_built') or [])}" if build.get("not_built") else ""))),
    ]
    rows = []
    for t in record["tests"]:
        result = str(t.get("result"))
        sub = t.get("subtests") or {}
        reason = str(t.get("reason") or "")
        if sub:
            reason = (reason + "; " if reason else "") + "subtests " + ", ".join(f"{v} {k}" for k, v in sub.items() if v)
        rows.append(Row((txt(t.get("name"), "code"), txt(result, _STYLE.get(result, "")),
                         txt("" if t.get("time_s") is None else f"{t['time_s']:.1f} s"), txt(reason),
                         (Span("log", "", str(t.get("log"))),) if t.get("log") else txt("")),
                        "failed" if result == "fail" else ""))
    blocks.append(Table(("test", "result", "time", "reason", "log"), tuple(rows), frozenset({2})))
    for t in record["tests"]:
        if t.get("result") == "fail" and t.get("log"):
            blocks += [Heading(5, f"{t.get('name')}: log"), Para(txt(_log_tail(root, str(t["log"])), "code"))]
    return blocks


def _counts(step: StepSummary) -> Inline:
    counts = as_dict(as_dict(step.get("kselftest")).get("counts"))
    text = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    return txt(text or "–", "bad" if counts.get("fail") else "")


class SelftestSection(ReportSection):
    """The kernel's selftests of a step (see the module docstring)."""

    name = "kselftest"
    kinds = ("kselftest",)

    def columns(self, steps: Sequence[StepSummary]) -> list[Column]:
        if not any("kselftest" in kinds_of(s) for s in steps):
            return []
        return [Column("selftests", lambda s: _counts(s) if "kselftest" in kinds_of(s) else txt("–"), numeric=False)]

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return kselftest_blocks(run.dir, step)
