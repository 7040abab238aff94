"""Reports of a lab run: ``report.md`` and ``report.html`` from a run directory, and its archive.

Public API::

    render_run(run_dir) -> (report.md, report.html)
    comparison_sentence(steps) -> str | None
    bar_chart_svg(title, labels, values, unit) -> str
    pack(run_dir, out=None) -> archive path (.tar.gz)
"""

from __future__ import annotations

from labctl.report.bundle import pack
from labctl.report.charts import bar_chart_svg
from labctl.report.render import comparison_sentence, render_run

__all__ = ["bar_chart_svg", "comparison_sentence", "pack", "render_run"]
