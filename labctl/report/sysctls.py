"""The sysctls section, for a step of the ``sysctls`` kind (:mod:`labctl.lab.stepsysctl`): a table of
each guest's sysctls, the value before the step, the value it ran with, and whether it was put back
(from summary.json's ``sysctls`` record, which the step's kind wrote, :mod:`labctl.steps.sysctl_kind`)."""

from __future__ import annotations

from typing import cast

from labctl.bundle import Run, StepSummary, kind_record
from labctl.lab.stepsysctl import SysctlRecord
from labctl.report.document import Block, Heading, Row, Table, txt
from labctl.report.sections import ReportSection


def sysctl_rows(record: SysctlRecord) -> list[Row]:
    """One row per guest and sysctl: guest, name, before, during, put back."""
    rows = []
    for guest, values in record["guests"].items():
        for name, v in values.items():
            back = "yes" if v["restored"] else ("–" if v["before"] is None else "no")
            rows.append(Row((txt(guest), txt(name, "code"), txt(v["before"] or "–", "code"), txt(v["set"], "code"),
                             txt(back, "bad" if back == "no" else "")), "failed" if back == "no" else ""))
    return rows


class SysctlSection(ReportSection):
    """A step's sysctls (see the module docstring)."""

    name = "sysctls"
    kinds = ("sysctls",)

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        record = kind_record(step, self.name)
        if not isinstance(record, dict) or not isinstance(record.get("guests"), dict):
            return []
        rows = sysctl_rows(cast(SysctlRecord, record))
        if not rows:
            return []
        return [Heading(4, "Sysctls during the step"), Table(("guest", "sysctl", "before", "during", "put back"),
                                                             tuple(rows))]
