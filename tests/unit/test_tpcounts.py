"""Tracepoint counts: real perf and ftrace recordings of net:/napi: tracepoints, never shown as CPU samples."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from labctl.trace.analyze import guest_figures
from labctl.trace.parsers import is_tracepoint, parse_perf_report
from labctl.trace.tpcounts import (
    MAX_COMMS,
    OTHER,
    ftrace_counts,
    guest_tracepoints,
    parse_perf_event_counts,
    tabulate,
)

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "trace" / "tracepoints"


@pytest.mark.parametrize(("event", "tracepoint"), [
    ("net:net_dev_queue", True), ("probe:tcp_v4_rcv", True), ("napi:napi_poll", True), ("sched:sched_switch", True),
    ("net:xdp_exception", True), ("cpu-clock", False), ("cpu-clock:pppH", False), ("cycles:u", False),
    ("cpu/event=0x3c/", False), ("task-clock", False), ("irq:softirq_entry", True),
])
def test_which_events_are_tracepoints(event: str, tracepoint: bool) -> None:
    assert is_tracepoint(event) is tracepoint


def test_perf_counts_are_every_hit_by_command_and_cpu() -> None:
    text = (FIX / "perf-event-counts.txt").read_text()
    counts = parse_perf_event_counts(text)
    # every uniq -c line is read: the per-event totals are the sums of the lines' counts
    by_line: Counter[str] = Counter()
    for line in text.splitlines():
        n, *_rest, event = line.split()
        by_line[event.rstrip(":")] += int(n)
    total: Counter[str] = Counter()
    for (event, _comm, _cpu), n in counts.items():
        total[event] += n
    assert total == by_line
    assert total["net:net_dev_queue"] == 810 and total["net:netif_receive_skb"] == 757
    assert counts[("net:net_dev_xmit", "iperf3", 0)] == 6084
    assert counts[("net:net_dev_queue", "ping", 0)] == 20  # 20 pings, each queued by ping itself


def test_the_report_header_counts_agree_with_the_counted_hits() -> None:
    """perf report's '# Samples: 810 of event net:net_dev_queue' is the same count (a hit is a sample)."""
    counts = parse_perf_event_counts((FIX / "perf-event-counts.txt").read_text())
    report = parse_perf_report((FIX / "perf-report.txt").read_text())
    assert report.event == "net:net_dev_queue" and report.samples == 810
    assert sum(n for (e, _, _), n in counts.items() if e == report.event) == report.samples


def test_a_tracepoint_recording_has_no_top_symbols_and_no_driver_share(tmp_path: Path) -> None:
    """The issue's bug: "Top symbols" of a tracepoint recording read 100% __traceiter_net_dev_queue."""
    for name in ("perf-event-counts.txt", "perf-report.txt", "perf-report-dso.txt"):
        shutil.copy(FIX / name, tmp_path / name)
    assert parse_perf_report((FIX / "perf-report.txt").read_text(), sampling=True).rows == ()
    figures = guest_figures(tmp_path, ["virtio_net"], 5.81)
    assert figures["top_symbols"] == []
    assert figures["driver_share_pct"] is None and figures["driver_share_all_pct"] is None
    assert figures["perf_events"]["sampling"] == [] and "net:net_dev_queue" in figures["perf_events"]["tracepoints"]
    assert not any("perf-report" in w for w in figures["warnings"]), figures["warnings"]
    (perf,) = figures["tracepoints"]
    assert perf["source"] == "perf record"
    assert perf["events"]["net:net_dev_queue"]["total"] == 810
    assert perf["events"]["net:net_dev_queue"]["rate_per_s"] == round(810 / 5.81, 2)
    assert perf["events"]["net:net_dev_queue"]["by_cpu"] == {"0": 810}


def test_a_mixed_recording_reads_symbols_of_its_sampling_event_only() -> None:
    text = ("# Samples: 3  of event 'net:net_dev_queue'\n# Overhead  Symbol\n# ........  ......\n"
            "   100.00%  [k] __traceiter_net_dev_queue\n\n"
            "# Samples: 2  of event 'cpu-clock:pppH'\n# Overhead  Symbol\n# ........  ......\n"
            "    60.00%  [k] e1000_clean\n    40.00%  [k] native_safe_halt\n")
    report = parse_perf_report(text, sampling=True)
    assert report.event == "cpu-clock:pppH" and [r.symbol for r in report.rows] == ["e1000_clean", "native_safe_halt"]
    assert parse_perf_report(text).event == "net:net_dev_queue"  # without the filter: the first section


def test_ftrace_counts_read_the_trace_cmd_report() -> None:
    counts = ftrace_counts((FIX / "trace-report-head.txt").read_text())
    assert sum(counts.values()) == 399  # 400 lines, the first is cpus=1
    assert counts[("net_dev_queue", "sshd", 0)] > 0


def test_tabulate_keeps_the_busiest_commands_and_sums_the_rest() -> None:
    counts = Counter({("e", f"c{i:02d}", i % 2): 100 - i for i in range(MAX_COMMS + 3)})
    table = tabulate(counts, 2.0)["e"]
    assert list(table["by_comm"])[:2] == ["c00", "c01"] and len(table["by_comm"]) == MAX_COMMS + 1
    assert table["by_comm"][OTHER] == sum(100 - i for i in range(MAX_COMMS, MAX_COMMS + 3))
    assert table["total"] == sum(counts.values()) and table["rate_per_s"] == table["total"] / 2
    assert set(table["by_cpu"]) == {"0", "1"}
    assert tabulate(counts, None)["e"]["rate_per_s"] is None


def test_guest_tracepoints_finds_every_source(tmp_path: Path) -> None:
    assert guest_tracepoints(tmp_path, 1.0) == []
    shutil.copy(FIX / "perf-event-counts.txt", tmp_path / "perf-event-counts.txt")
    shutil.copy(FIX / "trace-report-head.txt", tmp_path / "trace-report.txt")
    (tmp_path / "perf-stat.txt").write_text("2235,,irq:softirq_entry,5051234,100.00,,\n1500.2,msec,cpu-clock,1,100,,\n")
    sources = {s["source"]: s for s in guest_tracepoints(tmp_path, 2.0)}
    assert set(sources) == {"perf record", "ftrace", "perf stat"}
    assert sources["perf stat"]["events"] == {"irq:softirq_entry": {"total": 2235, "rate_per_s": 1117.5,
                                                                     "by_comm": {}, "by_cpu": {}}}
    assert "lost" not in sources["ftrace"]
    # ftrace's ring buffer overflowed: what it lost is said, and the report says its counts are lower bounds
    (tmp_path / "trace-stat.txt").write_text("cpus=2\n\nCPU: 0\nentries: 0\noverrun: 3136\ndropped events: 4\n"
                                             "read events: 35235\n\nCPU: 1\nentries: 0\noverrun: 10\n")
    ftrace = next(s for s in guest_tracepoints(tmp_path, 2.0) if s["source"] == "ftrace")
    assert ftrace["lost"] == 3150
    from labctl.report.document import Para
    from labctl.report.tracepoints import _recording_blocks
    notes = [b for b in _recording_blocks("step · a", ftrace) if isinstance(b, Para)]
    assert any("ftrace lost 3150 events" in "".join(sp.text for sp in n.spans) for n in notes)


def test_a_recording_mixing_tracepoints_and_cpu_clock_reads_symbols_of_cpu_clock_only(tmp_path: Path) -> None:
    for name in ("perf-report.txt", "perf-report-dso.txt"):
        shutil.copy(FIX / "mixed" / name, tmp_path / name)
    figures = guest_figures(tmp_path, ["virtio_net"])
    assert figures["perf_events"]["sampling"] == ["cpu-clock"]
    assert figures["top_symbols"][0] == {"symbol": "native_safe_halt", "dso": "[kernel.kallsyms]", "pct": 44.15}
    assert not any(s["symbol"].startswith("__traceiter") for s in figures["top_symbols"])
    assert figures["idle_pct"] is not None and figures["idle_pct"] >= 44.15


def test_the_reports_table_gives_each_events_commands_total_and_rate() -> None:
    from labctl.bundle.figures import fmt_num
    from labctl.report.tracepoints import events_table

    events = tabulate(parse_perf_event_counts((FIX / "perf-event-counts.txt").read_text()), 3.0)
    table = events_table(events)
    assert table.headers[0] == "event" and table.headers[-2:] == ("total", "per second")
    comms = list(table.headers[1:-2])
    for row, (event, e) in zip(table.rows, events.items(), strict=True):
        cells = ["".join(s.text for s in cell) for cell in row.cells]
        assert cells[0] == event
        assert cells[-2:] == [str(e["total"]), fmt_num(e["rate_per_s"])]
        assert e["rate_per_s"] == round(e["total"] / 3.0, 2)
        # the commands' columns (and "other commands", if any) add up to the total
        assert sum(int(c) for c in cells[1:-2]) == e["total"], (event, dict(zip(comms, cells[1:-2], strict=True)))
