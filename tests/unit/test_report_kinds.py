"""A step's kinds decide its report: a lab whose only step runs selftests (the issue's case) gets its
selftest table and counts, and none of a transfer's figures, charts, per-GB cost or warnings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from labctl.report import render_run
from labctl.report.run_summary import summarize, write_summary
from tests.conftest import ROOT

HOSTCOST = ROOT / "tests" / "fixtures" / "hostcost"
STATS = ROOT / "tests" / "fixtures" / "report" / "nic-driver-cost-ok" / "steps" / "transfer" / "rtl8139" / "a" / "stats"
NETDEV = "Inter-|\n face |\n  eth1: {rx} 3 0 0 0 0 0 0 {tx} 2 0 0 0 0 0 0\n"


def _selftest_bundle(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A bundle as a selftests-only run leaves it: the guest's statistics (its NIC moved 210 bytes),
    its /proc/stat at the window's ends and its QEMU measured on the host, the selftests' record."""
    bundle = tmp_path / "run"
    gdir = bundle / "steps" / "net-selftests" / "e1000" / "a"
    for phase, (rx, tx) in (("before", (1000, 500)), ("after", (1100, 610))):
        shutil.copytree(STATS / phase, gdir / "stats" / phase)
        (gdir / "stats" / phase / "netdev.txt").write_text(NETDEV.format(rx=rx, tx=tx))
    for name in ("window-stat-start.txt", "window-stat-end.txt"):
        shutil.copy(HOSTCOST / "step" / "client" / name, gdir / name)
    (bundle / "steps" / "net-selftests" / "e1000" / "_host" / "a").mkdir(parents=True)
    shutil.copy(HOSTCOST / "step" / "_host" / "client" / "qemu-threads.json",
                bundle / "steps" / "net-selftests" / "e1000" / "_host" / "a" / "qemu-threads.json")
    (gdir / "kselftest.tap").write_text("TAP version 13\n1..2\nok 1 selftests: net: t1\nnot ok 2 selftests: net: t2\n")
    (bundle / "manifest.json").write_text(json.dumps({"lab": {"name": "ks"}, "status": "failed", "accel": "tcg"}))
    record = {"guest": "a", "tree": "/src/linux", "target": "net", "tests": [
        {"name": "t1", "collection": "net", "number": 1, "result": "pass", "directive": None, "reason": None,
         "time_s": 1.5, "log": "steps/net-selftests/e1000/a/kselftest/t1.log", "subtests": None, "failed_subtests": []},
        {"name": "t2", "collection": "net", "number": 2, "result": "fail", "directive": None, "reason": None,
         "time_s": 2.0, "log": "steps/net-selftests/e1000/a/kselftest/t2.log", "subtests": None, "failed_subtests": []}],
        "counts": {"pass": 1, "fail": 1, "skip": 0, "xfail": 0}, "missing": 0, "only_tests_failed": True,
        "build": {"key": "k", "seconds": 1.0, "cached": True, "make_status": 0, "not_built": [], "tests": 2}}
    step = {"name": "net-selftests", "variant": "e1000", "status": "failed", "reason": "1 of 2 selftests failed: t2",
            "duration_s": 12.0, "dir": "steps/net-selftests/e1000", "window_s": 5.6, "guests": ["a"],
            "kinds": ["network", "stats", "kselftest"], "warnings": [], "captures": [],
            "nic": {"guest": "a", "name": "eth1", "model": "e1000", "driver": "e1000", "modules": ["e1000"]},
            "kselftest": record, "network": {"impair": {}, "links": {}}}
    header = {"lab": "ks", "status": "failed", "reason": "step net-selftests (e1000): 1 of 2 selftests failed: t2",
              "accel": "tcg"}
    summary = summarize(bundle, header, [step])
    write_summary(bundle, summary)
    return bundle, dict(summary)


def test_a_selftests_only_lab_gets_its_tests_and_nothing_of_a_transfer(tmp_path: Path) -> None:
    bundle, summary = _selftest_bundle(tmp_path)
    (entry,) = summary["steps"]
    # the whole cost is measured (host and guest CPU), but never per GB: nothing was moved
    assert entry["cost"]["guests"]["a"]["host_cpu_s"] is not None
    assert entry["cost"]["bytes"] is None and entry["figures"]["host_cpu_s_per_gb"] is None
    assert entry["guests"]["a"]["warnings"] == []  # no iperf3, mpstat or perf it never asked for
    md_path, html_path = render_run(bundle)
    md, html = md_path.read_text(), html_path.read_text()
    assert "Kernel selftests (net, on a)" in md and "| `t2` | **fail** |" in md
    assert "| step | variant / NIC model | driver | status | selftests |" in md
    assert "1 pass, 1 fail" in md
    for absent in ("Throughput", "CPU load", "Driver share", "Whole cost", "per GB", "iperf3", "mpstat",
                   "perf-report", "Top symbols", "Trace loss"):
        assert absent not in md, absent
    assert "<svg" not in html.split('id="step-1"')[0].split("Results")[1]  # no chart marked failed


def test_a_transfer_of_the_nic_still_gets_its_cost_per_gb(tmp_path: Path) -> None:
    """The same step as a transfer (commands over the NIC under test): the NIC's counters are what moved."""
    bundle, _ = _selftest_bundle(tmp_path)
    summary = json.loads((bundle / "summary.json").read_text())
    (step,) = summary["steps"]
    step["kinds"] = ["network", "stats", "commands"]
    step.pop("kselftest")
    header = {k: v for k, v in summary.items() if k not in ("steps", "spreads", "comparison")}
    (entry,) = summarize(bundle, header, [step])["steps"]
    assert entry["cost"]["bytes"] == 210 and entry["cost"]["host_cpu_s_per_gb"] is not None
    assert any("no iperf3 JSON" in w for w in entry["guests"]["a"]["warnings"])  # a transfer was expected
