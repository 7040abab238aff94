"""``labctl report RUN_DIR`` and ``labctl bundle RUN_DIR [-o FILE]``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

from labctl.cli.ui import console, out, warn
from labctl.errors import LabctlError
from labctl.report.bundle import pack
from labctl.report.render import SUMMARY, check_run_dir, render_run

ANALYZER = "labctl.trace.analyze"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("report", help="(re)write report.md and report.html of a run directory")
    r.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory (holds manifest.json)")
    r.set_defaults(func=report)
    b = sub.add_parser("bundle", help="pack a run directory into one .tar.gz")
    b.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory (holds manifest.json)")
    b.add_argument("-o", "--output", metavar="FILE", type=Path, default=None,
                   help="archive to write (default: RUN_DIR.tar.gz next to RUN_DIR)")
    b.add_argument("--force", action="store_true", help="replace the -o file if it exists")
    b.set_defaults(func=bundle)


def _analyzer() -> Any | None:
    """``recompute_summary`` of labctl.trace.analyze, or None while that module does not exist."""
    try:
        module = importlib.import_module(ANALYZER)
    except ModuleNotFoundError as exc:
        if exc.name not in (None, "labctl.trace", ANALYZER):
            warn(f"summary.json not refreshed: {ANALYZER} needs {exc.name}, which is missing")
        return None
    except ImportError as exc:
        warn(f"summary.json not refreshed: {ANALYZER} failed to import: {exc}")
        return None
    return getattr(module, "recompute_summary", None)


def refresh_summary(run_dir: Path) -> bool:
    """Recompute summary.json from the raw artifacts when labctl can; True if it did."""
    recompute = _analyzer()
    if recompute is None:
        return False
    summary = recompute(run_dir)
    if isinstance(summary, dict):
        tmp = run_dir / f".{SUMMARY}.tmp"
        try:
            tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, run_dir / SUMMARY)
        except OSError as exc:
            raise LabctlError(f"cannot write {run_dir / SUMMARY}: {exc.strerror or exc}") from exc
    return True


def report(args: argparse.Namespace) -> int:
    run_dir = check_run_dir(args.run_dir)
    if refresh_summary(run_dir):
        console.print(f"refreshed {SUMMARY} from the raw artifacts", markup=False, highlight=False)
    for path in render_run(run_dir):
        out.print(str(path), markup=False, highlight=False, soft_wrap=True)
    return 0


def bundle(args: argparse.Namespace) -> int:
    archive = pack(args.run_dir, args.output, args.force)
    out.print(str(archive), markup=False, highlight=False, soft_wrap=True)
    return 0
