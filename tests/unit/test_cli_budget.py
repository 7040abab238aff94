"""What each quick command imports (its module budget): one eager import added later to the parser,
the command table or a light command's module fails here instead of slowing every command.

Each command runs in a fresh interpreter with ``-X importtime``; the modules it loaded are read from
that report (not timed: only the names count, so machine load cannot change the outcome)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("paramiko", "rich", "labctl.pipeline", "labctl.backends", "labctl.report", "labctl.web",
         "labctl.bisect", "labctl.bundle")


def imported(args: list[str], tmp_path: Path) -> set[str]:
    """The modules ``labctl ARGS`` imports, run from this checkout with a private, empty state directory."""
    env = {**os.environ, "LABCTL_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", *args], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}


def heavy(mods: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == b or m.startswith(b + ".") for b in banned))


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_import_nothing_of_labctls_machinery(args: list[str], tmp_path: Path) -> None:
    mods = imported(args, tmp_path)
    assert sorted(m for m in mods if m.startswith("labctl")) == ["labctl", "labctl.cli", "labctl.cli.examples",
                                                                   "labctl.cli.main"]
    assert heavy(mods, ("logging", "dataclasses", *HEAVY)) == []


def test_exec_loads_neither_the_pipeline_nor_the_report(tmp_path: Path) -> None:
    mods = imported(["exec", "--help"], tmp_path)
    assert "labctl.cli.exec_cmd" in mods
    assert heavy(mods, ("labctl.pipeline", "labctl.report", "labctl.web", "labctl.bisect", "rich.table")) == []


def test_status_loads_neither_the_pipeline_nor_a_pack_nor_the_report(tmp_path: Path) -> None:
    """``status`` reads the labs' state; what brings a lab up (the pipeline, packs) stays out. (The
    state package still loads the backends, paramiko and the image store: not yet pinned out.)"""
    mods = imported(["status", "--json"], tmp_path)
    assert "labctl.cli.status_cmd" in mods and "labctl.cli.lifecycle_cmds" not in mods
    assert heavy(mods, ("labctl.pipeline", "labctl.pack", "labctl.report", "labctl.web", "labctl.bisect",
                        "labctl.bundle", "labctl.cli.displays")) == []
