"""The gdb section, for a step of the ``gdb`` kind (:mod:`labctl.lab.stepgdb`): where the scripted
session broke, how often, whether it timed out, and its transcript's file (from summary.json's
``gdb`` record, which the step's kind wrote, :mod:`labctl.steps.gdbstep`)."""

from __future__ import annotations

from labctl.bundle import Run, StepSummary, as_dict
from labctl.report.document import Block, Heading, Inline, Meta, Span, txt
from labctl.report.sections import ReportSection


def _where(bp: dict[str, object]) -> str:
    """The breakpoint as gdb described it: its function and file:line when it says them."""
    func, file, line = bp.get("func"), bp.get("file") or bp.get("fullname"), bp.get("line")
    place = f"{file}:{line}" if file and line else ""
    return " ".join(str(p) for p in (func, place and f"({place})") if p) or str(bp.get("original-location") or "?")


class GdbSection(ReportSection):
    """A step's gdb session (see the module docstring)."""

    name = "gdb"
    kinds = ("gdb",)

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        record = step.get("gdb")
        if not isinstance(record, dict):
            return []
        hits = record.get("hits")
        rows: list[tuple[str, Inline]] = [
            ("breakpoint", txt(_where(as_dict(record.get("breakpoint"))), "code")),
            ("hits", txt(str(hits) + (" (timed out: " + (record.get("message") or "never hit") + ")"
                                      if record.get("timed_out") else ""), "bad" if record.get("timed_out") else "")),
        ]
        transcript = record.get("transcript")
        if transcript:
            rows.append(("transcript", (Span(str(transcript), "code"),)))
        return [Heading(4, "gdb session"), Meta(tuple(rows))]
