"""Reports of a run: ``report.md`` and ``report.html`` from a bundle.

One document model (:mod:`.document`) built from the bundle's figures
(:mod:`.content`, :mod:`.skb`), rendered as Markdown (:mod:`.markdown`) and
as one self-contained HTML page (:mod:`.html`, charts from :mod:`.charts`).
Reads bundles through :mod:`labctl.bundle`; must not import the steps
runner, the backends or the CLI.

Imports never: labctl.steps, labctl.backends, labctl.cli
"""

from __future__ import annotations

from pathlib import Path

from labctl.bundle.layout import REPORT_HTML, REPORT_MD
from labctl.bundle.read import load_run
from labctl.errors import LabctlError
from labctl.paths import atomic_write
from labctl.report.content import build_document, lab_name
from labctl.report.html import to_html
from labctl.report.markdown import to_markdown

__all__ = ["render_run"]


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
