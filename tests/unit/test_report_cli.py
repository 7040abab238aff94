"""``labctl report`` and ``labctl bundle`` through their argparse registration."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from labctl.cli import report_cmds
from labctl.errors import UsageError
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "report" / "nic-driver-cost-ok"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="labctl")
    report_cmds.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(FIXTURE, dest)
    return dest


@pytest.fixture
def no_analyzer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, report_cmds.ANALYZER, None)  # importing it raises ImportError


def test_report_renders_and_prints_paths(run: Path, no_analyzer: None, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("report", str(run))
    assert args.func(args) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(run / "report.md"), str(run / "report.html")]
    assert (run / "report.html").is_file()


def test_report_refreshes_the_summary_first(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def recompute_summary(run_dir: Path) -> dict[str, Any]:
        calls.append(run_dir)
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
        summary["steps"][0]["figures"]["throughput_mbit_s"] = 999.25
        summary["comparison"] = "recomputed"
        return summary

    fake = types.ModuleType(report_cmds.ANALYZER)
    fake.recompute_summary = recompute_summary  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, report_cmds.ANALYZER, fake)
    args = parse("report", str(run))
    assert args.func(args) == 0
    assert calls == [run.resolve()]
    assert json.loads((run / "summary.json").read_text())["comparison"] == "recomputed"
    md = (run / "report.md").read_text()
    assert "| 999.25 |" in md and "recomputed" in md


def test_analyzer_without_recompute_is_skipped(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, report_cmds.ANALYZER, types.ModuleType(report_cmds.ANALYZER))
    before = (run / "summary.json").read_bytes()
    args = parse("report", str(run))
    assert args.func(args) == 0
    assert (run / "summary.json").read_bytes() == before


def test_report_refuses_a_non_bundle(tmp_path: Path, no_analyzer: None) -> None:
    args = parse("report", str(tmp_path))
    with pytest.raises(UsageError) as exc:
        args.func(args)
    assert exc.value.exit_code == 2 and exc.value.hint


def test_bundle_prints_the_archive(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("bundle", str(run), "-o", str(tmp_path / "x.tar.gz"))
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "x.tar.gz")
    args = parse("bundle", str(run))
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(run.with_name("run.tar.gz"))
