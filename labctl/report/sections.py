"""What a section of the report is: an object that owns one concern of a run from summary.json to the page.

A :class:`ReportSection` may (every method has a default that does nothing):

* add its piece to each step's entry of summary.json (:meth:`~ReportSection.summarize`, with the
  step's raw files at hand; ``labctl run`` and ``labctl report`` both call it);
* give its columns of the results table and its charts under it (:meth:`~ReportSection.columns`,
  :meth:`~ReportSection.charts`), filled only for the steps it is about;
* give its part of the report (:meth:`~ReportSection.blocks`, before the results when its
  ``placement`` is ``lead``) and its part of each step's section (:meth:`~ReportSection.step_blocks`);
* give its figures of a step, flat, for ``labctl compare``, the run-to-run spread and bisect's
  figure oracle (:meth:`~ReportSection.metrics`).

:mod:`.registry` lists the sections in the report's order. A step's *kinds* (what it ran:
``commands``, ``kselftest``, ``trace``...; declared in :mod:`labctl.lab.stepkinds`) are in its
summary entry, so that a section shows only what the step asked for; a section names the kinds it
shows (``kinds``), and every declared kind is shown by one (``tests/unit/test_step_kinds.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from labctl.bundle import Run, StepSummary, as_dict, as_list, figure, usable
from labctl.report.document import Block, Inline

Metric = tuple[float, str, str, int]
"""(value, label, unit, which way is better: +1 higher, -1 lower, 0 neither)."""

HeadlineFigure = tuple[str, str, str, int]
"""(summary key, label, unit, which way is better) of a figure the run's spread and charts show."""

CompareGroup = tuple[int, str, str]
"""(rank, key prefix, title) of a table of ``labctl compare``: the metrics whose keys start with the
prefix (the longest prefix wins), tables in rank order."""


@dataclass(frozen=True)
class Column:
    """One column of the results table: its header, the cell of a step, whether it holds numbers."""

    header: str
    cell: Callable[[StepSummary], Inline]
    numeric: bool = True


@dataclass
class StepFiles:
    """One step entry being summarized, with where its raw files are."""

    bundle: Path
    entry: StepSummary  # the summary entry (recorded fields and guests' figures so far)

    @property
    def dir(self) -> Path:
        return self.bundle / str(self.entry.get("dir") or "")

    def guest_dirs(self) -> list[tuple[str, Path]]:
        """(guest, its directory) of every guest with figures."""
        return [(g, self.dir / g) for g in as_dict(self.entry.get("guests")) if (self.dir / g).is_dir()]


def kinds_of(step: StepSummary) -> list[str]:
    """What the step ran (its result's ``kinds``); for a bundle of an older labctl, which did not
    record them: its selftests and statistics when it has the selftests' record, else commands,
    statistics and tracers (what its report showed then)."""
    kinds = [str(k) for k in as_list(step.get("kinds"))]
    if kinds or "kinds" in step:
        return kinds
    return ["stats", "kselftest"] if isinstance(step.get("kselftest"), Mapping) else ["stats", "trace", "commands"]


def expects_transfer(step: StepSummary) -> bool:
    """Whether the step is a transfer to measure: it runs commands and names the NIC under test."""
    return "commands" in kinds_of(step) and bool(as_dict(step.get("nic")).get("name"))


class ReportSection:
    """One section of the report (see the module docstring)."""

    name: ClassVar[str] = ""
    placement: ClassVar[str] = "body"  # "lead": before the results
    headline: ClassVar[tuple[HeadlineFigure, ...]] = ()
    compare_groups: ClassVar[tuple[CompareGroup, ...]] = ()
    zero_when_absent: ClassVar[tuple[str, ...]] = ()  # metric key prefixes: absent = 0 where the section ran
    kinds: ClassVar[tuple[str, ...]] = ()  # the step kinds (labctl.lab.stepkinds) whose records or files it shows

    def summarize(self, step: StepFiles) -> None:
        """Add this section's keys to the step's summary entry."""

    def columns(self, steps: Sequence[StepSummary]) -> list[Column]:
        """This section's columns of the results table (none when no step is about it)."""
        return []

    def charts(self, steps: Sequence[StepSummary]) -> list[str]:
        """Its charts under the results table (SVG)."""
        return []

    def blocks(self, run: Run) -> list[Block]:
        """Its part of the report."""
        return []

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        """Its part of one step's section."""
        return []

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        """Its figures of one step entry worth comparing, flat: key -> metric (unmeasured ones left out);
        by default its ``headline`` figures that the step measured."""
        out: dict[str, Metric] = {}
        for key, label, unit, better in self.headline:
            value = usable(figure(step, key))
            if value is not None:
                out[key] = (value, label, unit, better)
        return out
