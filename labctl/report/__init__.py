"""Reports of a run: summary.json, ``report.md`` and ``report.html`` from a bundle, and ``labctl compare``.

The report is made of sections (:mod:`.sections` says what one is; :mod:`.registry` lists them in
order), each owning one concern from its piece of summary.json to its part of the page and its
figures for ``labctl compare``: the topology and a step's network (:mod:`.network`), the transfer's
throughput, CPU and driver share (:mod:`.throughput`), the whole cost (:mod:`.cost`), tracepoint
counts (:mod:`.tracepoints`), flame graphs (:mod:`.flames`, drawn by :mod:`.flamegraph`),
per-packet latency (:mod:`.latency`), the kernel's selftests (:mod:`.selftestresults`), a step's gdb
session (:mod:`.gdbsession`), a guest's
crash with drgn's view of its vmcore (:mod:`.crashes`), the packets a step followed (:mod:`.journeys`),
every drop (:mod:`.droptable`), bpftrace's maps (:mod:`.bpftrace`), and a
step's top symbols, softnet, trace loss and timeline (:mod:`.guest_parts`), and the sections of
the step kinds :mod:`.registry` names. summary.json is
computed one way for ``run`` and ``report`` (:mod:`.run_summary`); one document model
(:mod:`.document`) is built by the frame (:mod:`.content`: the header, :mod:`.header`; the
results table, :mod:`.results`; each step's section, the commands and the run's files, :mod:`.stepblocks`) and rendered as Markdown
(:mod:`.markdown`) and as one self-contained HTML page (:mod:`.html`, charts from
:mod:`.charts`); two runs side by side are :mod:`.comparison`. Reads bundles through
:mod:`labctl.bundle`; must not import the steps runner, the backends or the CLI.

Imports never: labctl.steps, labctl.backends, labctl.cli
"""

from __future__ import annotations

from pathlib import Path

from labctl.bundle import REPORT_HTML, REPORT_MD, load_run
from labctl.errors import LabctlError
from labctl.paths import atomic_write
from labctl.report.comparison import (
    GROUPS,
    Comparison,
    Difference,
    compare_blocks,
    compare_runs,
    fmt_change,
    fmt_side,
    group_of,
    judgement,
)
from labctl.report.content import build_document
from labctl.report.header import lab_name
from labctl.report.html import to_html
from labctl.report.markdown import to_markdown
from labctl.report.registry import step_metrics
from labctl.report.run_summary import resummarize, summarize, write_summary

__all__ = [
    "GROUPS",
    "Comparison",
    "Difference",
    "compare_blocks",
    "compare_runs",
    "fmt_change",
    "fmt_side",
    "group_of",
    "judgement",
    "render_run",
    "resummarize",
    "step_metrics",
    "summarize",
    "to_html",
    "write_comparison",
    "write_summary",
]


def _write(path: Path, text: str) -> None:
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise LabctlError(f"cannot write {path}: {exc.strerror or exc}") from exc


def render_run(run_dir: Path) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into the bundle ``run_dir``; return their paths.

    :raise UsageError: when ``run_dir`` is not a bundle. :raise LabctlError: when it cannot be read or written.
    """
    run = load_run(run_dir)
    blocks = build_document(run)
    md_path, html_path = run.dir / REPORT_MD, run.dir / REPORT_HTML
    _write(md_path, to_markdown(blocks))
    _write(html_path, to_html(blocks, f"labctl report: {lab_name(run)}"))
    return md_path, html_path


def write_comparison(path: Path, result: Comparison, title: str) -> None:
    """Write ``result`` (two runs compared) to ``path`` as one HTML page titled ``title``.

    :raise LabctlError: when it cannot be written.
    """
    _write(path, to_html(compare_blocks(result), title))
