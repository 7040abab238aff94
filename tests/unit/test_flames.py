"""Flame graphs in the bundle: folding a guest's call-graph recording, the SVG files, the report's inline graphs."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from labctl.report import render_run
from labctl.report.flamegraph import SCRIPT, script_csp_source
from labctl.report.run_summary import resummarize
from labctl.trace.flamefold import RECORDING, guest_flamegraph, read_folded

ROOT = Path(__file__).resolve().parents[2]
FLAME = ROOT / "tests" / "fixtures" / "flame"
REPORT = ROOT / "tests" / "fixtures" / "report" / "nic-driver-cost-ok"


def _recording(guest_dir: Path, name: str = "iperf3-e1000.perf-script.txt") -> None:
    guest_dir.mkdir(parents=True, exist_ok=True)
    with gzip.open(guest_dir / RECORDING, "wt") as f:
        f.write((FLAME / name).read_text())


def test_a_recording_folds_into_the_sampling_events_stacks(tmp_path: Path) -> None:
    _recording(tmp_path)
    got = guest_flamegraph(tmp_path, ["e1000"])
    assert got is not None
    info, text = got
    assert info["event"] == "cpu-clock:pppH" and info["samples"] == 41 and "folded" not in info
    # the fixture's README: 10 samples in iperf3's transmit path, 9 in e1000_clean taken in idle
    assert info["driver"]["samples"] == 19 and info["driver"]["pct"] == round(100 * 19 / 41, 2)
    assert [(f["function"], f["samples"]) for f in info["driver"]["functions"][:2]] == [
        ("e1000_xmit_frame", 10), ("e1000_clean", 9)]
    assert sum(read_folded(text).values()) == 41


def test_tracepoint_stacks_are_no_flame_graph_of_cpu_time(tmp_path: Path) -> None:
    _recording(tmp_path, "mixed-events.perf-script.txt")
    info, _ = guest_flamegraph(tmp_path, []) or ({}, "")
    assert info["event"] == "cpu-clock:pppH" and info["samples"] == 2
    assert info["other_events"] == {"net:net_dev_queue": 3}
    assert guest_flamegraph(tmp_path / "nothing", []) is None


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """The report fixture with call-graph recordings of the client for two variants."""
    run = tmp_path / "run"
    shutil.copytree(REPORT, run)
    summary = json.loads((run / "summary.json").read_text())
    for s in summary["steps"][:2]:
        _recording(run / s["dir"] / "a")
    resummarize(run)
    return run


def test_the_report_writes_svg_files_and_inlines_searchable_graphs(bundle: Path) -> None:
    _, html_path = render_run(bundle)
    summary = json.loads((bundle / "summary.json").read_text())
    steps = summary["steps"]
    for s in steps[:2]:
        svg = bundle / s["dir"] / "a" / "flamegraph.svg"
        root = ET.parse(svg).getroot()  # a standalone, well-formed SVG with its own script
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and SCRIPT in svg.read_text()
    first, second = steps[0]["variant"], steps[1]["variant"]
    diff = bundle / "steps" / steps[0]["name"] / f"flamegraph-diff-a-{first}-vs-{second}.svg"
    assert diff.is_file() and "Differential flame graph" in diff.read_text()
    html = html_path.read_text()
    assert html.count('<svg class="lfg"') == 3  # two variants and their difference, inline
    assert html.count("<script>") == 1 and SCRIPT in html
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html)
    assert csp is not None and f"script-src {script_csp_source()}" in csp.group(1)
    assert html.count('class="lfg-btn lfg-search"') == 3  # every inline graph can be searched
    assert 'data-f="e1000_xmit_frame"' in html
    md = (bundle / "report.md").read_text()
    assert "flamegraph.svg" in md and f"flamegraph-diff-a-{first}-vs-{second}.svg" in md
