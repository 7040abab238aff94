"""Reading a bundle back: its manifest and summary, as the report and ``labctl compare`` need them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.bundle.layout import MANIFEST, SUMMARY, check_bundle_dir
from labctl.errors import LabctlError


@dataclass(frozen=True)
class Run:
    """A run directory's manifest and summary, plus notes about what was missing."""

    dir: Path
    manifest: dict[str, Any]
    summary: dict[str, Any]
    notes: tuple[str, ...] = ()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabctlError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise LabctlError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def load_run(run_dir: Path) -> Run:
    """Read a run directory; a missing summary.json is noted, not fatal."""
    root = check_bundle_dir(run_dir)
    manifest = _read_json(root / MANIFEST)
    if not (root / SUMMARY).is_file():
        note = f"{SUMMARY} is missing: the run ended before it was written, so there are no figures."
        return Run(root, manifest, {}, (note,))
    return Run(root, manifest, _read_json(root / SUMMARY))


