"""``labctl report`` and ``labctl bundle`` through their argparse registration."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from labctl.cli.main import build_parser
from labctl.errors import UsageError
from labctl.trace.analyze import guest_figures
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "report" / "nic-driver-cost-ok"


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(argv)  # the CLI's own registration: a dropped command fails here


@pytest.fixture
def run(tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(FIXTURE, dest)
    return dest


def test_report_renders_and_prints_paths(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("report", str(run))
    assert args.func(args) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(run / "report.md"), str(run / "report.html")]
    assert (run / "report.html").is_file()


def test_report_recomputes_the_summary_from_the_raw_files(run: Path) -> None:
    """The real analysis runs through ``labctl report``: figures follow the raw files,
    what the run recorded (status, reason, NIC, warnings) is kept."""
    before = json.loads((run / "summary.json").read_text())
    raw = run / "steps" / "transfer" / "rtl8139" / "a" / "cmd-1.out"  # the client's iperf3 -J output
    raw.write_text(json.dumps({"start": {"test_start": {"reverse": 1, "protocol": "TCP"}},
                               "end": {"sum_received": {"bits_per_second": 123.0e6, "bytes": 46125000, "seconds": 3},
                                       "sum_sent": {"bits_per_second": 124.0e6}}}))
    args = parse("report", str(run))
    assert args.func(args) == 0
    after = json.loads((run / "summary.json").read_text())
    step_b, step_a = before["steps"][0], after["steps"][0]
    for key in ("name", "variant", "status", "reason", "dir", "nic"):
        assert step_a[key] == step_b[key], key
    guest = run / step_a["dir"] / "a"
    derived = {"flamegraph", "trace_json"}  # files the summary writes beside the raw ones
    figures = {k: v for k, v in step_a["guests"]["a"].items() if k not in derived}
    assert figures == json.loads(json.dumps(guest_figures(guest, step_a["nic"]["modules"], step_a["window_s"])))
    if (guest / "trace-report.txt").is_file():
        assert step_a["guests"]["a"]["trace_json"]["file"] == "trace.json.gz" and (guest / "trace.json.gz").is_file()
    assert step_a["guests"]["a"]["throughput_mbit_s"] == 123.0
    assert "comparison" in after and after["status"] == before["status"]
    assert (guest / "stats" / "delta.json").is_file()
    assert "| a | 123.0 |" in (run / "report.md").read_text()  # the guests table of the step


def test_report_refuses_a_non_bundle(tmp_path: Path) -> None:
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
