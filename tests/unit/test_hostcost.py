"""The host side of a step: QEMU's threads read from /proc, their CPU per role, the host profile, per GB."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.base import GuestRecord
from labctl.steps.hostwatch import HostWatch
from labctl.trace.hostcost import (
    THREADS_FILE,
    GuestCost,
    guest_cost,
    guest_window_cpu,
    host_profile,
    parse_proc_net_dev,
    parse_stat_line,
    per_gb,
    qemu_threads,
    step_cost,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hostcost"

# A process with a busy thread (the "vCPU") and an idle main thread, like a TCG guest's QEMU. Told
# a number of seconds on stdin, the busy thread spins until it has had that much CPU (its own clock:
# however long a loaded host makes that take), says "done" and blocks, alive: what a watch around it
# measures is known whatever the machine's load.
SPIN_S = 0.6
BUSY = """
import sys, threading, time
go = threading.Event()
want = []
def spin():
    go.wait()
    start = time.thread_time()
    while time.thread_time() - start < want[0]:
        pass
    print("done", flush=True)
    threading.Event().wait()
t = threading.Thread(target=spin, name="spin", daemon=True)
t.start()
print(t.native_id, flush=True)
want.append(float(sys.stdin.readline()))
go.set()
time.sleep(600)
"""


def _spin(proc: Any, seconds: float) -> None:
    """Have the busy thread spin for ``seconds`` of its own CPU time, and wait until it has."""
    proc.stdin.write(f"{seconds}\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "done\n"


class FakeBackend:
    name = "qemu"

    def __init__(self, tid: int) -> None:
        self.tid = tid

    def qmp(self, rec: GuestRecord, command: str, args: Any = None) -> Any:
        assert command == "query-cpus-fast"
        return [{"cpu-index": 0, "thread-id": self.tid, "qom-path": "/machine/unattached/device[0]"}]


class FakeState:
    accel = "tcg"

    def __init__(self, guests: dict[str, GuestRecord]) -> None:
        self.guests = guests


def _record(name: str, pid: int, **extra: Any) -> GuestRecord:
    return GuestRecord(name=name, backend="qemu", pid=pid, dir="/nonexistent", console="", qmp="", ssh_port=0,
                       accel="tcg", extra=extra)


@pytest.fixture
def busy() -> Any:
    proc = subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        tid = int(proc.stdout.readline())
        yield proc, tid
    finally:
        proc.kill()
        proc.wait()


def test_parse_stat_line_takes_the_comm_up_to_the_last_parenthesis() -> None:
    line = "4242 (CPU 0/TCG) S 1 2 3 0 -1 4194368 100 0 0 0 1234 56 0 0 20 0 1 0 7 0 0"
    assert parse_stat_line(line) == ("CPU 0/TCG", 1234, 56)
    assert parse_stat_line("7 (a) b) c) R 1 2 3 0 -1 0 0 0 0 0 9 8 0 0") == ("a) b) c", 9, 8)
    assert parse_stat_line("garbage") is None
    assert parse_stat_line("1 (x) R 1 2") is None


def test_a_watch_measures_the_busy_thread_as_the_vcpu(busy: Any, tmp_path: Path) -> None:
    proc, tid = busy
    watch = HostWatch(FakeState({"a": _record("a", proc.pid)}), FakeBackend(tid), ["a"], tmp_path,  # type: ignore[arg-type]
                      profile=False)
    watch.start()
    _spin(proc, SPIN_S)  # SPIN_S of CPU had, however long the host took to give it
    seconds = watch.stop()
    assert seconds is not None and seconds > 0
    doc = json.loads((tmp_path / "a" / THREADS_FILE).read_text())
    assert doc["vcpu_threads"] == {str(tid): 0} and doc["pid"] == proc.pid
    t = qemu_threads(doc)
    assert t["measured"]
    # the window saw the busy thread's SPIN_S, to /proc's clock tick (10 ms) and the spin's last loop
    assert SPIN_S - 0.02 <= t["by_role"]["vCPU"] <= SPIN_S + 0.05, t
    assert t["by_role"]["vCPU"] <= t["cpu_s"] + 0.02
    assert t["by_role"]["main loop"] < 0.1, t
    vcpu = [th for th in t["threads"] if th["role"] == "vCPU"]
    assert [th["tid"] for th in vcpu] == [tid]  # the thread QMP named, whatever its comm
    assert watch.stop() == seconds  # a second stop changes nothing


def test_a_guest_on_another_host_or_gone_is_not_measured(tmp_path: Path) -> None:
    state = FakeState({"r": _record("r", 0, remote=True), "g": _record("g", 2**22 + 12345)})
    watch = HostWatch(state, FakeBackend(1), ["r", "g"], tmp_path)  # type: ignore[arg-type]
    watch.start()
    watch.stop()
    for g, words in (("r", "another host"), ("g", "cannot read /proc")):
        doc = json.loads((tmp_path / g / THREADS_FILE).read_text())
        t = qemu_threads(doc)
        assert not t["measured"] and words in (t.get("note") or "")


def _skip_if_forbidden(why: str) -> None:
    """Skip when the host forbids profiling (the bundle then says so, as it should)."""
    if "paranoid" in why or "ermission" in why:
        pytest.skip(why)


@pytest.mark.skipif(shutil.which("perf") is None, reason="the host has no perf (apt-get install linux-perf)")
@pytest.mark.alone("the busy thread's CPU seconds are measured: another worker's test would take its core")
def test_the_host_profile_records_the_window_and_names_the_busy_thread(busy: Any, tmp_path: Path) -> None:
    proc, tid = busy
    watch = HostWatch(FakeState({"a": _record("a", proc.pid)}), FakeBackend(tid), ["a"], tmp_path)  # type: ignore[arg-type]
    watch.start()
    _spin(proc, 1.5)
    watch.stop()
    d = tmp_path / "a"
    if (d / "profile-unavailable.txt").is_file():
        why = (d / "profile-unavailable.txt").read_text() + (d / "perf-record.log").read_text(errors="replace")
        _skip_if_forbidden(why)
        pytest.fail(why)
    assert not (d / "perf.ctl").exists() and not (d / "perf.ack").exists()
    with gzip.open(d / "perf-script.txt.gz", "rt") as f:
        profile = host_profile(f.read(), proc.pid, {str(tid): 0})
    assert profile["samples"] > 100
    # nearly every sample is the spinning thread's (the vCPU role), in the Python binary or libpython
    assert sum(profile["by_role"].get("vCPU", {}).values()) >= 0.9 * profile["samples"]


def _flaky_perf(bin_dir: Path, failures: int) -> Path:
    """A ``perf`` first on PATH that fails to attach ``failures`` times (as a perf does when the
    process changes under it), then runs the real one."""
    real = shutil.which("perf")
    count = bin_dir / "count"
    count.write_text("0")
    shim = bin_dir / "perf"
    shim.write_text(f"""#!/bin/sh
n=$(cat {count}); echo $((n + 1)) > {count}
if [ "$1" = record ] && [ "$n" -lt {failures} ]; then
  echo "Error: failed to attach to thread (attempt $n)" >&2; exit 255
fi
exec {real} "$@"
""")
    shim.chmod(0o755)
    return count


@pytest.mark.skipif(shutil.which("perf") is None, reason="the host has no perf (apt-get install linux-perf)")
@pytest.mark.parametrize("failures", [1, 2])
def test_a_perf_that_fails_to_attach_is_started_again_once_and_its_words_kept(
        busy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
    proc, tid = busy
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = _flaky_perf(bin_dir, failures)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    watch = HostWatch(FakeState({"a": _record("a", proc.pid)}), FakeBackend(tid), ["a"], tmp_path / "out")  # type: ignore[arg-type]
    watch.start()
    watch.stop()
    d = tmp_path / "out" / "a"
    why = d / "profile-unavailable.txt"
    if failures == 1:  # the second perf records: the bundle has the profile, no stale file beside it
        if why.is_file():
            _skip_if_forbidden(why.read_text())
        assert not why.exists(), why.read_text()
        assert (d / "perf-script.txt.gz").is_file() and not (d / "perf.data.old").exists()
    else:  # both failed: the bundle says so, in perf's own words
        assert "did not start recording" in why.read_text() and "failed to attach" in why.read_text()
        assert not (d / "perf-script.txt.gz").exists()
    assert count.read_text().strip() == str(2 + (failures == 1))  # two records (+ the script when it recorded)


def test_host_profile_sorts_code_into_kinds() -> None:
    text = (FIXTURES / "perf-script-tcg.txt").read_text()
    p = host_profile(text, 18318, {"18322": 0})
    assert p["samples"] == 16
    assert p["by_role"]["vCPU"] == {"QEMU": 4, "guest code (TCG)": 6, "host kernel": 1, "libraries": 1}
    assert p["by_role"]["main loop"] == {"QEMU": 1, "host kernel": 2, "libraries": 1}
    assert p["kinds"]["guest code (TCG)"] == 37.5
    assert p["unnamed_qemu_pct"] == 40.0  # 2 of QEMU's 5 samples have no name
    assert p["top"][0] == {"function": "qht_lookup_custom", "object": "qemu-system-x86_64", "kind": "QEMU",
                           "samples": 2, "pct": 12.5}
    assert all(f["kind"] != "guest code (TCG)" and f["function"] != "[unknown]" for f in p["top"])


def test_guest_window_cpu_counts_busy_time_only() -> None:
    start = "cpu  100 0 50 1000 10 5 20 0 0 0\ncpu0 100 0 50 1000 10 5 20 0 0 0\nintr 1\n"
    end = "cpu  250 0 120 1400 10 15 60 0 0 0\ncpu0 250 0 120 1400 10 15 60 0 0 0\nintr 9\n"
    w = guest_window_cpu(start, end)
    assert w is not None
    assert w["cpu_s"] == 2.7  # (150 + 70 + 10 + 40) / 100; idle and iowait left out
    assert w["cpus"] == 1 and w["by_mode"]["idle"] == 4.0
    assert w["busy_pct"] == round(100 * 2.7 / 6.7, 2)
    assert guest_window_cpu("nothing", end) is None


def test_proc_net_dev_and_per_gb() -> None:
    text = (FIXTURES / "netdev.txt").read_text()
    dev = parse_proc_net_dev(text)
    assert dev["eth2"] == (74110136, 46957) and dev["mgmt0"] == (295090, 7072588)
    assert set(dev) == {"lo", "eth1", "eth2", "eth3", "mgmt0"}
    assert per_gb(2.0, 500_000_000) == 4.0
    assert per_gb(2.0, 0) is None and per_gb(None, 10) is None


def test_step_cost_sums_the_guests_only_when_all_were_measured(tmp_path: Path) -> None:
    full: GuestCost = {"host": {"measured": True, "cpu_s": 3.0,
                                "by_role": {"vCPU": 2.5, "main loop": 0.4, "other threads": 0.1}},
                       "guest": {"cpu_s": 2.0, "cpus": 1, "busy_pct": 40.0, "by_mode": {}}, "notes": []}
    half: GuestCost = {"host": {"measured": False}, "guest": {"cpu_s": 1.0, "cpus": 1, "busy_pct": 20.0, "by_mode": {}},
                       "notes": ["host: its QEMU runs on another host"]}
    both = step_cost({"a": full, "b": full}, 2_000_000_000, "cmd-1.out (iperf3)", 5.0)
    assert both["host_cpu_s"] == 6.0 and both["host_cpu_s_per_gb"] == 3.0 and both["guest_cpu_s_per_gb"] == 2.0
    assert both["host_measured"] and both["guests"]["a"]["host_vcpu_s"] == 2.5
    one = step_cost({"a": full, "b": half}, 2_000_000_000, "x", 5.0)
    assert one["host_cpu_s"] is None and one["host_cpu_s_per_gb"] is None and not one["host_measured"]
    assert one["guests"]["a"]["host_cpu_s_per_gb"] == 1.5 and one["guest_cpu_s"] == 3.0
    assert step_cost({"a": full}, None, None, 5.0)["host_cpu_s_per_gb"] is None


def test_guest_cost_reads_the_recorded_files(tmp_path: Path) -> None:
    step = tmp_path / "steps" / "transfer" / "e1000"
    shutil.copytree(FIXTURES / "step", step)
    c = guest_cost(step / "client", step / "_host" / "client")
    assert c["host"]["measured"] and c["host"]["cpu_s"] > 0
    assert c["host"]["by_role"]["vCPU"] > c["host"]["by_role"]["main loop"] > 0
    assert c["guest"] is not None and c["guest"]["cpu_s"] > 0
    assert c["notes"] == []
    old = guest_cost(step / "server", step / "_host" / "nobody")
    assert not old["host"]["measured"] and "not measured" in old["notes"][0]
