"""``guest_figures`` on a guest directory recorded in a real guest, and on broken ones."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from labctl.trace.analyze import guest_figures
from tests.conftest import ROOT

FIX = ROOT / "tests" / "fixtures" / "trace"
GUEST = FIX / "step" / "a"
DRIVERS = ["8139cp", "virtio_net"]


def rows(name: str, directory: Path = GUEST) -> list[tuple[float, list[str]]]:
    """(percent, other words) of each data row of a perf report, read without the parser."""
    out = []
    for line in (directory / name).read_text().splitlines():
        if re.match(r"\s+\d+\.\d\d%\s", line):
            pct, *words = line.split()
            out.append((float(pct.rstrip("%")), words))
    return out


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    return guest_figures(GUEST, DRIVERS)


def test_recorded_guest_has_every_figure_and_no_warning(figures: dict[str, Any]) -> None:
    assert figures["warnings"] == []
    assert all(figures[k] is not None for k in figures if k != "trace_loss")
    assert json.loads(json.dumps(figures)) == figures


def test_throughput_is_the_first_iperf3_receiver(figures: dict[str, Any]) -> None:
    end = json.loads((GUEST / "cmd-0.out").read_text())["end"]
    assert figures["throughput_mbit_s"] == round(end["sum_received"]["bits_per_second"] / 1e6, 3) == 283.128
    assert figures["throughput_source"] == "cmd-0.out (iperf3)"


def test_cpu_load(figures: dict[str, Any]) -> None:
    idles = [float(x) for x in re.findall(r'"cpu": "all".*"idle": ([\d.]+)', (GUEST / "mpstat.json").read_text())]
    assert figures["cpu_load_pct"] == pytest.approx(100 - sum(idles) / len(idles), abs=1e-4)


def test_driver_share_recomputed_from_the_text(figures: dict[str, Any]) -> None:
    share_all = sum(p for p, words in rows("perf-report-dso.txt") if words[0] in ("[8139cp]", "[virtio_net]"))
    idle = sum(p for p, words in rows("perf-report.txt") if words[1:] == ["[k]", "native_safe_halt"])
    assert (share_all, idle) == pytest.approx((0.05 + 0.19, 43.07))
    assert figures["driver_share_all_pct"] == pytest.approx(share_all)
    assert figures["idle_pct"] == pytest.approx(idle)
    assert figures["driver_share_pct"] == pytest.approx(share_all / (100 - idle) * 100, abs=1e-4)
    assert figures["driver_cpu_pct"] == pytest.approx(figures["driver_share_pct"] * figures["cpu_load_pct"] / 100,
                                                      abs=1e-4)


def test_driver_share_of_one_module_and_dash_names() -> None:
    assert guest_figures(GUEST, ["8139cp"])["driver_share_all_pct"] == 0.05
    assert guest_figures(GUEST, ["virtio-net"])["driver_share_all_pct"] == 0.19
    assert guest_figures(GUEST, ["e1000"])["driver_share_all_pct"] == 0.0


def test_samples_top_symbols_softnet(figures: dict[str, Any]) -> None:
    assert (figures["samples"], figures["lost_samples"]) == (90000, 0)
    top = figures["top_symbols"]
    expected = sorted(rows("perf-report.txt"), key=lambda r: -r[0])[:15]
    assert [(t["pct"], t["dso"], t["symbol"]) for t in top] == [(p, w[0], w[2]) for p, w in expected]
    assert top[0] == {"symbol": "native_safe_halt", "dso": "[kernel.kallsyms]", "pct": 43.07}
    assert figures["softnet"] == {"processed": 6608, "dropped": 0, "time_squeeze": 42}


def test_trace_loss(figures: dict[str, Any], tmp_path: Path) -> None:
    assert figures["trace_loss"] == {"perf_lost": 0, "ftrace_overruns": 0, "kprobe_misses": None}
    guest = tmp_path / "a"
    shutil.copytree(GUEST, guest)
    shutil.copy(FIX / "overrun" / "trace-stat.txt", guest / "trace-stat.txt")
    shutil.copy(FIX / "misc" / "kprobe_profile.txt", guest / "kprobe_profile.txt")
    for name in ("perf-report.txt", "perf-report-dso.txt", "perf-record.log"):
        shutil.copy(FIX / "lost" / name, guest / name)
    got = guest_figures(guest, DRIVERS)
    assert got["trace_loss"] == {"perf_lost": 826, "ftrace_overruns": 17414, "kprobe_misses": 2}
    assert got["samples"] == 32484  # exact, from perf-record.log


def test_kcore_folded_modules_give_none_and_a_warning(tmp_path: Path) -> None:
    guest = tmp_path / "a"
    shutil.copytree(GUEST, guest)
    for name in ("perf-report.txt", "perf-report-dso.txt"):
        shutil.copy(FIX / "kcore" / name, guest / name)
    got = guest_figures(guest, DRIVERS)
    assert got["driver_share_pct"] is None and got["driver_cpu_pct"] is None and got["driver_share_all_pct"] is None
    assert any("kcore" in w and "--kallsyms" in w for w in got["warnings"])
    assert got["cpu_load_pct"] is not None and got["top_symbols"]


def test_dso_report_missing_falls_back_to_the_symbol_report(tmp_path: Path) -> None:
    guest = tmp_path / "a"
    shutil.copytree(GUEST, guest)
    (guest / "perf-report-dso.txt").unlink()
    got = guest_figures(guest, DRIVERS)
    # The dso,sym report lists [virtio_pci] (a module) but no driver row above 0.1 %.
    assert got["driver_share_all_pct"] == 0.0
    assert "perf-report-dso.txt: missing" in got["warnings"]
    assert any("percent-limit" in w for w in got["warnings"])


def test_wget_when_no_iperf3(tmp_path: Path) -> None:
    guest = tmp_path / "a"
    guest.mkdir()
    shutil.copy(GUEST / "cmd-3.err", guest / "cmd-0.err")
    (guest / "cmd-0.out").write_text("")
    got = guest_figures(guest, DRIVERS)
    assert got["throughput_mbit_s"] == round(18.5 * 1024 * 1024 * 8 / 1e6, 3)
    assert got["throughput_source"] == "cmd-0.err (wget)"


def test_commands_are_searched_in_numeric_order(tmp_path: Path) -> None:
    guest = tmp_path / "a"
    guest.mkdir()
    shutil.copy(FIX / "misc" / "iperf3-R.json", guest / "cmd-10.out")
    shutil.copy(GUEST / "cmd-0.out", guest / "cmd-2.out")
    shutil.copy(FIX / "misc" / "iperf3-refused.json", guest / "cmd-1.out")
    assert guest_figures(guest, DRIVERS)["throughput_source"] == "cmd-2.out (iperf3)"


def test_empty_directory_gives_none_and_no_warning(tmp_path: Path) -> None:
    """Nothing asked, nothing ran (a step that only ran selftests): no figure, and no warning about
    files no tracer was asked to write, nor about a transfer nobody expected."""
    got = guest_figures(tmp_path, DRIVERS, expect_transfer=False)
    for key in ("throughput_mbit_s", "cpu_load_pct", "driver_share_pct", "driver_cpu_pct", "samples",
                "lost_samples", "softnet"):
        assert got[key] is None, key
    assert got["top_symbols"] == []
    assert got["trace_loss"] == {"perf_lost": None, "ftrace_overruns": None, "kprobe_misses": None}
    assert got["warnings"] == []


def test_tracers_that_ran_and_left_nothing_give_warnings(tmp_path: Path) -> None:
    """The tracers started (their pid files) and the statistics were taken, but their files are not
    there; a transfer was expected and none was found: each says so."""
    for name in ("mpstat.pid", "perf-record.pid"):
        (tmp_path / name).write_text("1\n")
    (tmp_path / "stats" / "before").mkdir(parents=True)
    got = guest_figures(tmp_path, DRIVERS)
    for key in ("throughput_mbit_s", "cpu_load_pct", "driver_share_pct", "samples", "softnet"):
        assert got[key] is None, key
    for name in ("mpstat.json", "perf-report.txt", "perf-report-dso.txt", "stats/before/softnet_stat.txt"):
        assert f"{name}: missing" in got["warnings"]
    # ftrace did not run here (no trace files at all): its report is not missed
    assert not any(w.startswith("trace-stat.txt") for w in got["warnings"])
    assert any(w.startswith("cmd-*") for w in got["warnings"])


def test_missing_directory(tmp_path: Path) -> None:
    got = guest_figures(tmp_path / "nope", DRIVERS)
    assert got["throughput_mbit_s"] is None and got["warnings"][0].endswith("not a directory")


def test_empty_and_garbage_files(tmp_path: Path) -> None:
    for name in ("mpstat.json", "perf-report.txt", "perf-report-dso.txt", "trace-stat.txt", "cmd-0.out",
                 "cmd-0.err", "kprobe_profile.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "stats" / "before").mkdir(parents=True)
    (tmp_path / "stats" / "after").mkdir(parents=True)
    (tmp_path / "stats" / "before" / "softnet_stat.txt").write_text("sh: 1: cat: Permission denied\n")
    (tmp_path / "stats" / "after" / "softnet_stat.txt").write_bytes(b"\xff\xfe garbage")
    got = guest_figures(tmp_path, DRIVERS)
    assert got["cpu_load_pct"] is None and got["driver_share_pct"] is None and got["softnet"] is None
    assert got["trace_loss"] == {"perf_lost": None, "ftrace_overruns": None, "kprobe_misses": 0}
    warnings = "\n".join(got["warnings"])
    for expected in ("mpstat.json: no", "perf-report.txt: no perf report rows", "trace-stat.txt: no",
                     "softnet_stat.txt: no softnet rows"):
        assert expected in warnings


def test_an_iperf3_error_is_named_even_when_it_exited_0(tmp_path: Path) -> None:
    # iperf3 3.12 after a lost UDP set-up datagram: exit status 0, an empty "end" and an "error".
    guest = tmp_path / "a"
    guest.mkdir()
    shutil.copy(FIX / "misc" / "iperf3-refused.json", guest / "cmd-1.out")
    got = guest_figures(guest, DRIVERS)
    assert got["throughput_mbit_s"] is None
    assert "cmd-1.out: iperf3 failed: unable to connect to server: Connection refused" in got["warnings"]
    # A later run that worked still gives the figure, and the failed one stays named.
    shutil.copy(GUEST / "cmd-0.out", guest / "cmd-2.out")
    got = guest_figures(guest, DRIVERS)
    assert got["throughput_source"] == "cmd-2.out (iperf3)"
    assert "cmd-1.out: iperf3 failed: unable to connect to server: Connection refused" in got["warnings"]
