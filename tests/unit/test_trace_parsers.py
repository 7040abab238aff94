"""perf, mpstat, iperf3, wget and trace-cmd parsers on outputs recorded in a real guest."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labctl.trace.parsers import (
    PerfRow,
    dso_shares,
    iperf3_error,
    parse_iperf3_json,
    parse_kprobe_profile,
    parse_mpstat_json,
    parse_perf_record_log,
    parse_perf_report,
    parse_perf_stat_csv,
    parse_trace_cmd_stat,
    parse_wget,
)
from tests.conftest import ROOT

FIX = ROOT / "tests" / "fixtures" / "trace"
GUEST = FIX / "step" / "a"


def read(path: Path) -> str:
    return path.read_text()


def pct_lines(text: str) -> list[str]:
    """Data rows of a perf report, found independently of the parser."""
    return [ln for ln in text.splitlines() if re.match(r"\s+\d+\.\d\d%\s", ln)]


# --------------------------------------------------------------------------- perf report

def test_perf_report_header_and_rows() -> None:
    text = read(GUEST / "perf-report.txt")
    rep = parse_perf_report(text)
    assert (rep.samples, rep.event, rep.event_count, rep.lost_samples) == (90000, "cpu-clock", 22686000000, 0)
    assert len(rep.rows) == len(pct_lines(text)) == 63
    assert rep.rows[0] == PerfRow(43.07, "[kernel.kallsyms]", "native_safe_halt", kernel=True)
    assert PerfRow(2.7, "python3.11", "_PyEval_EvalFrameDefault") in rep.rows
    assert PerfRow(0.16, "python3.11", "0x00000000000d48f3") in rep.rows
    assert PerfRow(0.34, "[virtio_pci]", "vp_notify", kernel=True) in rep.rows
    assert all(r.pct >= 0.1 for r in rep.rows)  # --percent-limit 0.1


def test_dso_report_and_driver_lines() -> None:
    text = read(GUEST / "perf-report-dso.txt")
    rep = parse_perf_report(text)
    shares = dso_shares(rep)
    assert len(shares) == len(pct_lines(text))
    assert all(r.symbol is None for r in rep.rows)
    # Recompute the driver share straight from the text.
    by_hand = sum(float(ln.split("%")[0]) for ln in pct_lines(text) if ln.split()[1] in ("[8139cp]", "[virtio_net]"))
    assert shares["[8139cp]"] + shares["[virtio_net]"] == pytest.approx(by_hand) == pytest.approx(0.24)
    assert shares["[kernel.kallsyms]"] == 75.30 and shares["_json.cpython-311-x86_64-linux-gnu.so"] == 0.05
    assert sum(shares.values()) == pytest.approx(100, abs=0.2)


def test_dso_shares_sum_symbols_of_a_dso() -> None:
    rep = parse_perf_report(read(GUEST / "perf-report.txt"))
    shares = dso_shares(rep)
    kernel = sum(r.pct for r in rep.rows if r.dso == "[kernel.kallsyms]")
    assert shares["[kernel.kallsyms]"] == pytest.approx(kernel)
    assert "[8139cp]" not in shares  # its symbols are all under --percent-limit 0.1


def test_kcore_report_folds_modules_into_the_kernel() -> None:
    shares = dso_shares(parse_perf_report(read(FIX / "kcore" / "perf-report-dso.txt")))
    assert not any(d.startswith("[") and d not in ("[kernel.kallsyms]", "[vdso]") for d in shares)
    rows = parse_perf_report(read(FIX / "kcore" / "perf-report.txt")).rows
    assert PerfRow(0.34, "[kernel.kallsyms]", "vp_notify", kernel=True) in rows


def test_lost_samples() -> None:
    rep = parse_perf_report(read(FIX / "lost" / "perf-report-dso.txt"))
    assert rep.lost_samples == 826 and rep.samples == 32000
    log = parse_perf_record_log(read(FIX / "lost" / "perf-record.log"))
    assert log == {"samples": 32484, "events": 34071, "lost_chunks": 25}
    assert parse_perf_record_log("") == {}


def test_perf_report_variants_and_junk() -> None:
    children = ("# Children      Self  Command  Shared Object      Symbol\n"
                "# ........  ........  .......  .................  ............\n"
                "#\n"
                "    12.50%     2.25%  ping     [kernel.kallsyms]  [k] icmp_rcv\n"
                "     1.00%     1.00%  my prog  lib with space.so  [.] operator new(unsigned long)\n")
    assert parse_perf_report(children).rows == (PerfRow(2.25, "[kernel.kallsyms]", "icmp_rcv", True, 12.5),
                                                 PerfRow(1.0, "lib with space.so", "operator new(unsigned long)",
                                                         False, 1.0))
    no_layout = "    12.50%     2.25%  [kernel.kallsyms]  [k] icmp_rcv\n"
    assert parse_perf_report(no_layout).rows == (PerfRow(2.25, "[kernel.kallsyms]", "icmp_rcv", True, 12.5),)
    sym_only = "     5.00%  [.] main\n"
    assert parse_perf_report(sym_only).rows == (PerfRow(5.0, None, "main"),)
    two = "# Samples: 1K of event 'a'\n  1.00%  x\n# Samples: 2K of event 'b'\n  2.00%  y\n"
    rep = parse_perf_report(two)
    assert (rep.samples, rep.event, [r.dso for r in rep.rows]) == (1000, "a", ["x"])
    empty = parse_perf_report("")
    assert empty.rows == () and empty.samples is None and empty.lost_samples is None
    assert parse_perf_report("perf: command not found\nError:\nfailed to open perf.data").rows == ()
    assert dso_shares(empty) == {}


# --------------------------------------------------------------------------- perf stat

def test_perf_stat_csv() -> None:
    stat = parse_perf_stat_csv(read(GUEST / "perf-stat.txt"))
    assert stat == {"cpu-clock": 2137.28, "context-switches": 46.0}


def test_perf_stat_csv_unsupported_and_per_cpu() -> None:
    text = "<not supported>,,cycles,0,100.00,,\nCPU0,5,,context-switches,1,100.00,,\nCPU1,7,,context-switches,1,100.00,,\n"
    assert parse_perf_stat_csv(text) == {"context-switches": 12.0}
    assert parse_perf_stat_csv("") == {}


# --------------------------------------------------------------------------- mpstat

def test_mpstat_average_load() -> None:
    text = read(GUEST / "mpstat.json")
    idles = [float(m) for m in re.findall(r'"cpu": "all".*"idle": ([\d.]+)', text)]
    assert len(idles) == 17
    assert parse_mpstat_json(text) == pytest.approx(100 - sum(idles) / 17, abs=1e-4)
    assert parse_mpstat_json(text) == pytest.approx(61.0371, abs=1e-4)


def test_mpstat_per_cpu_file_uses_all_only() -> None:
    text = read(FIX / "misc" / "mpstat-allcpus.json")
    doc = json.loads(text)
    (sample,) = doc["sysstat"]["hosts"][0]["statistics"]
    assert len(sample["cpu-load"]) == 3
    assert parse_mpstat_json(text) == pytest.approx(100 - sample["cpu-load"][0]["idle"])


def test_mpstat_truncated_and_junk() -> None:
    text = read(GUEST / "mpstat.json")
    cut = text[: text.index('"timestamp": "01:21:36"')]  # mpstat killed after a few samples
    idles = [float(m) for m in re.findall(r'"cpu": "all".*"idle": ([\d.]+)', cut)]
    assert parse_mpstat_json(cut) == pytest.approx(100 - sum(idles) / len(idles), abs=1e-4)
    assert parse_mpstat_json("") is None
    assert parse_mpstat_json('{"sysstat": {"hosts": []}}') is None
    assert parse_mpstat_json('{"sysstat": 3}') is None
    assert parse_mpstat_json("[1, 2]") is None


# --------------------------------------------------------------------------- iperf3 / wget

def test_iperf3_forward() -> None:
    text = read(GUEST / "cmd-0.out")
    end = json.loads(text)["end"]
    t = parse_iperf3_json(text)
    assert t is not None and t.tool == "iperf3" and not t.reverse and t.protocol == "TCP"
    assert t.receiver_bps == end["sum_received"]["bits_per_second"] == pytest.approx(283127617.27)
    assert t.sender_bps == end["sum_sent"]["bits_per_second"]
    assert t.bytes == 72089600 and t.seconds == pytest.approx(2.03695)
    assert t.bps == t.receiver_bps


def test_iperf3_reverse() -> None:
    t = parse_iperf3_json(read(FIX / "misc" / "iperf3-R.json"))
    assert t is not None and t.reverse
    assert t.receiver_bps == pytest.approx(661045750.25) and t.sender_bps == pytest.approx(659520300.80)
    assert t.bytes == 165805974  # what the client (the receiver with -R) got


def test_iperf3_udp() -> None:
    t = parse_iperf3_json(read(FIX / "misc" / "iperf3-udp.json"))
    assert t is not None and t.protocol == "UDP"
    assert t.receiver_bps == pytest.approx(49459675.49) and t.sender_bps == pytest.approx(50023607.34)


def test_iperf3_failures() -> None:
    assert parse_iperf3_json(read(FIX / "misc" / "iperf3-refused.json")) is None
    assert parse_iperf3_json("") is None
    assert parse_iperf3_json("iperf3: error - unable to connect") is None
    assert parse_iperf3_json('{"end": {"sum_sent": {"bits_per_second": "x"}}}') is None
    sender_only = parse_iperf3_json('noise {"end": {"sum": {"bits_per_second": 8e6, "bytes": 1000000}}}')
    assert sender_only is not None and sender_only.receiver_bps is None and sender_only.bps == 8e6


def test_iperf3_error_is_what_the_run_ended_with() -> None:
    # Recorded in a guest: iperf3 3.12 exited 0 after the lossy link dropped its UDP set-up datagram.
    lost = read(FIX / "misc" / "iperf3-udp-setup-lost.json")
    assert parse_iperf3_json(lost) is None
    assert iperf3_error(lost) == "unable to read from stream socket: Resource temporarily unavailable"
    assert iperf3_error(read(FIX / "misc" / "iperf3-refused.json")) == "unable to connect to server: Connection refused"
    assert iperf3_error(read(GUEST / "cmd-0.out")) is None
    assert iperf3_error("") is None and iperf3_error('{"error": "not iperf3"}') is None


def test_wget() -> None:
    text = read(GUEST / "cmd-3.err")
    t = parse_wget(text)
    assert "(18.5 MB/s) - '/dev/null' saved [20971520/20971520]" in text
    assert t is not None and t.tool == "wget" and t.bytes == 20971520
    assert t.receiver_bps == 18.5 * 1024 * 1024 * 8 and t.sender_bps is None
    assert t.seconds == pytest.approx(20971520 / (18.5 * 1024 * 1024))


def test_wget_units_and_failures() -> None:
    bits = parse_wget("2026-01-01 00:00:00 (94.2 Mb/s) - 'x' saved [100]\n")
    assert bits is not None and bits.receiver_bps == 94.2e6 and bits.bytes == 100
    kb = parse_wget("2026-01-01 00:00:00 (512 KB/s) - ‘f’ saved [1024/1024]\n")
    assert kb is not None and kb.receiver_bps == 512 * 1024 * 8
    assert parse_wget(read(FIX / "misc" / "wget-refused.err")) is None
    assert parse_wget("") is None


# --------------------------------------------------------------------------- ftrace

def test_trace_cmd_stat() -> None:
    stat = parse_trace_cmd_stat(read(GUEST / "trace-stat.txt"))
    assert stat["cpus"] == 2 and set(stat["per_cpu"]) == {"0", "1"}
    assert stat["per_cpu"]["1"] == {"entries": 0, "overrun": 0, "commit_overrun": 0, "bytes": 0,
                                    "dropped_events": 0, "read_events": 20}
    assert (stat["overrun"], stat["dropped_events"], stat["read_events"]) == (0, 0, 20)
    # trace-report.txt holds the same 20 events.
    assert len([ln for ln in read(GUEST / "trace-report.txt").splitlines() if "skbaddr=" in ln]) == 20


def test_trace_cmd_stat_overrun() -> None:
    stat = parse_trace_cmd_stat(read(FIX / "overrun" / "trace-stat.txt"))
    assert stat["per_cpu"]["1"]["overrun"] == 17414 and stat["overrun"] == 17414
    assert stat["read_events"] == 2995 + 47114


def test_trace_cmd_stat_record_log_and_junk() -> None:
    # trace-cmd 3.1 prints no buffer statistics when recording: nothing to read there.
    assert parse_trace_cmd_stat(read(FIX / "overrun" / "trace-record.log"))["per_cpu"] == {}
    assert parse_trace_cmd_stat("") == {"per_cpu": {}, "commit_overrun": 0, "dropped_events": 0,
                                        "entries": 0, "overrun": 0, "read_events": 0}


def test_kprobe_profile() -> None:
    prof = parse_kprobe_profile(read(FIX / "misc" / "kprobe_profile.txt"))
    assert prof == {"cpxmit": {"hits": 7300, "misses": 0}, "vnxmit": {"hits": 4100, "misses": 0},
                    "pollret": {"hits": 0, "misses": 0}, "nsret": {"hits": 1, "misses": 2}}
    assert parse_kprobe_profile("") == {} and parse_kprobe_profile("cat: kprobe_profile: No such file") == {}
