"""What the report says: a bundle's manifest and summary turned into document blocks.

The frame is here, and only the frame: the header (:mod:`.header`), the sections placed before the
results, the results (:mod:`.results`), the other sections in their order (:mod:`.registry`), and
one section per step, the commands and the run's files (:mod:`.stepblocks`).
Numbers come straight from summary.json, formatted by
:func:`labctl.bundle.figures.fmt_num`: the report never recomputes a figure.
"""

from __future__ import annotations

from labctl.bundle import Run
from labctl.report.document import Block
from labctl.report.header import header_blocks
from labctl.report.registry import SECTIONS
from labctl.report.results import results_blocks
from labctl.report.stepblocks import commands_blocks, run_artifact_blocks, steps_blocks


def build_document(run: Run) -> list[Block]:
    """The whole report as blocks (writing the flame graph SVG files into the bundle on the way)."""
    lead = [b for section in SECTIONS if section.placement == "lead" for b in section.blocks(run)]
    body = [b for section in SECTIONS if section.placement != "lead" for b in section.blocks(run)]
    return (header_blocks(run) + lead + results_blocks(run) + body + steps_blocks(run) + commands_blocks(run)
            + run_artifact_blocks(run))
