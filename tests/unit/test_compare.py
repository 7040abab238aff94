"""labctl compare: two runs of one lab, paired by step and variant, with noise from repeats."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from labctl.bundle.figures import BEYOND, NO_REPEATS, WITHIN, verdict
from labctl.bundle.read import load_run
from labctl.cli.main import main
from labctl.errors import UsageError
from labctl.report.comparison import compare_blocks, compare_runs, differences, fmt_change, fmt_side
from labctl.report.html import to_html
from labctl.report.markdown import to_markdown

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "report"


def _bundle(tmp_path: Path, name: str, edit: Any = None, manifest_edit: Any = None) -> Path:
    run = tmp_path / name
    shutil.copytree(FIXTURES / "nic-driver-cost-ok", run)
    if edit is not None:
        summary = json.loads((run / "summary.json").read_text())
        edit(summary)
        (run / "summary.json").write_text(json.dumps(summary))
    if manifest_edit is not None:
        manifest = json.loads((run / "manifest.json").read_text())
        manifest_edit(manifest)
        (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def _repeat(summary: dict[str, Any], variant: str, throughputs: list[float]) -> None:
    """Make ``variant`` a step run len(throughputs) times with these throughputs."""
    steps = summary["steps"]
    base = next(s for s in steps if s["variant"] == variant)
    runs = []
    for i, mbit in enumerate(throughputs, 1):
        s = copy.deepcopy(base)
        s["repeat"], s["repeats"] = i, len(throughputs)
        s["figures"]["throughput_mbit_s"] = mbit
        runs.append(s)
    at = steps.index(base)
    summary["steps"] = steps[:at] + runs + steps[at + 1:]


def test_verdicts() -> None:
    assert verdict([10, 11, 12], [13, 14, 15]) == BEYOND  # ranges apart
    assert verdict([10, 11, 13], [12, 14, 15]) == WITHIN  # overlapping ranges
    assert verdict([10, 12], [15]) == BEYOND  # outside 10..12 widened by 2 on each side (8..14)
    assert verdict([10, 12], [13.5]) == WITHIN
    assert verdict([15], [10, 12]) == BEYOND  # either side may have the repeats
    assert verdict([10], [20]) == NO_REPEATS


def test_a_run_against_itself_changes_nothing(tmp_path: Path) -> None:
    a = load_run(_bundle(tmp_path, "a"))
    result = compare_runs(a, a)
    assert result["differences"] == [] and result["flagged"] == 0
    assert [p["variant"] for p in result["pairs"]] == [s["variant"] for s in a.summary["steps"]]
    for pair in result["pairs"]:
        for m in pair["metrics"]:
            assert m["change"] == 0 and m["verdict"] == NO_REPEATS, m
    keys = {m["key"] for m in result["pairs"][0]["metrics"]}
    assert {"throughput_mbit_s", "cpu_load_pct", "driver_share_pct", "driver_cpu_pct"} <= keys


def test_repeats_flag_changes_beyond_the_noise(tmp_path: Path) -> None:
    a = load_run(_bundle(tmp_path, "a", lambda s: _repeat(s, "rtl8139", [300.0, 305.0, 310.0])))
    b = load_run(_bundle(tmp_path, "b", lambda s: _repeat(s, "rtl8139", [400.0, 404.0, 399.0])))
    result = compare_runs(a, b)
    pair = next(p for p in result["pairs"] if p["variant"] == "rtl8139")
    assert pair["runs"] == {"a": 3, "b": 3}
    tput = next(m for m in pair["metrics"] if m["key"] == "throughput_mbit_s")
    assert tput["a"]["n"] == 3 and tput["a"]["mean"] == 305.0 and tput["a"]["min"] == 300.0
    assert tput["change"] == pytest.approx(96.0) and tput["change_pct"] == pytest.approx(31.48, abs=0.01)
    assert tput["verdict"] == BEYOND and result["flagged"] >= 1
    load = next(m for m in pair["metrics"] if m["key"] == "cpu_load_pct")
    assert load["verdict"] == WITHIN  # the same value in every run: nothing moved
    # one side's range overlapping the other: within noise
    c = load_run(_bundle(tmp_path, "c", lambda s: _repeat(s, "rtl8139", [303.0, 320.0, 330.0])))
    tput = next(m for p in compare_runs(a, c)["pairs"] if p["variant"] == "rtl8139"
                for m in p["metrics"] if m["key"] == "throughput_mbit_s")
    assert tput["verdict"] == WITHIN


def test_failed_runs_are_left_out_and_unpaired_steps_listed(tmp_path: Path) -> None:
    def drop_and_fail(s: dict[str, Any]) -> None:
        s["steps"] = [x for x in s["steps"] if x["variant"] != "e1000"]
        s["steps"][0]["status"] = "failed"

    a = load_run(_bundle(tmp_path, "a"))
    b = load_run(_bundle(tmp_path, "b", drop_and_fail))
    result = compare_runs(a, b)
    assert result["only_in_a"] == [{"step": "transfer", "variant": "e1000"}] and result["only_in_b"] == []
    failed = next(p for p in result["pairs"] if p["variant"] == b.summary["steps"][0]["variant"])
    assert failed["runs"]["b"] == 0
    assert all(m["verdict"] == "only in A" for m in failed["metrics"])


def test_differences_name_kernel_nic_versions_and_accelerator(tmp_path: Path) -> None:
    def other(m: dict[str, Any]) -> None:
        m["labctl_version"] = "0.2.0"
        m["qemu"]["version"] = "QEMU emulator version 8.2.2"
        m["accel"] = "kvm"
        m["kernels"] = {"a": {"release": "6.1.0-53-amd64", "build_id": "ab" * 20}}
        m["lab"]["resolved"]["guests"]["a"]["nics"] = [{"name": "eth1", "model": "e1000e"}]

    def nics(m: dict[str, Any]) -> None:
        m["lab"]["resolved"]["guests"]["a"]["nics"] = [{"name": "eth1", "model": "rtl8139"}]

    a = load_run(_bundle(tmp_path, "a", manifest_edit=nics))
    b = load_run(_bundle(tmp_path, "b", lambda s: s.update(accel="kvm"), other))
    found = {d["what"]: (d["a"], d["b"]) for d in differences(a, b)}
    assert found["labctl"] == ("0.1.0", "0.2.0") and found["QEMU"][1] == "QEMU emulator version 8.2.2"
    assert found["accelerator"] == ("tcg", "kvm")
    assert found["kernel of a"] == ("unknown", "6.1.0-53-amd64 (build id abababababab)")
    assert found["NIC model of a.eth1"] == ("rtl8139", "e1000e")
    assert "host name" not in found and "lab file sha256" not in found


def test_runs_of_different_labs_are_refused(tmp_path: Path) -> None:
    a = load_run(_bundle(tmp_path, "a"))
    b = load_run(_bundle(tmp_path, "b", lambda s: s.update(lab="skb-latency"),
                         lambda m: m["lab"].update(name="skb-latency")))
    with pytest.raises(UsageError) as info:
        compare_runs(a, b)
    assert info.value.exit_code == 2
    assert "lab 'nic-driver-cost'" in info.value.message and "lab 'skb-latency'" in info.value.message


def test_cli_exit_codes_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _bundle(tmp_path, "a")
    b = _bundle(tmp_path, "b", lambda s: _repeat(s, "rtl8139", [1.0, 2.0]))
    html = tmp_path / "cmp.html"
    assert main(["compare", str(a), str(b), "--json", "--html", str(html)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["lab"] == "nic-driver-cost" and result["pairs"]
    page = html.read_text()
    assert "What differs between the runs" in page and "<script" not in page
    assert "http://" not in page and "https://" not in page
    other = _bundle(tmp_path, "c", lambda s: s.update(lab="other"), lambda m: m["lab"].update(name="other"))
    assert main(["compare", str(a), str(other)]) == 2
    err = capsys.readouterr().err
    assert "RUN_A is a run of lab 'nic-driver-cost' and RUN_B of lab 'other'" in " ".join(err.split())
    assert "Traceback" not in err
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2


def test_formatting() -> None:
    assert fmt_side({"n": 1, "mean": 12.0}) == "12" and fmt_side({"n": 3, "mean": 2.5, "sd": 0.25}) == "2.5 ± 0.25 (n=3)"
    assert fmt_side(None) == "–"
    assert fmt_change({"change": 3.0, "change_pct": 12.5}) == "+3 (+12.5%)"
    assert fmt_change({"change": -0.5, "change_pct": None}) == "-0.5"
    assert fmt_change({"change": 0.0}) == "0" and fmt_change({"change": None}) == "–"


def test_the_document_renders_both_ways(tmp_path: Path) -> None:
    a = load_run(_bundle(tmp_path, "a"))
    blocks = compare_blocks(compare_runs(a, a))
    md = to_markdown(blocks)
    assert "# labctl compare: nic\\-driver\\-cost" in md or "labctl compare: nic" in md
    assert "Nothing recorded differs" in md
    assert "<svg" in to_html(blocks, "x")  # the headline figures, A and B side by side
