"""gdb against real guests: a breakpoint in a module (e1000_xmit_frame) hit
while pinging, a breakpoint never hit, and ``labctl gdb --batch``. After each,
the guest must still run."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.backends.monitor import qmp_execute
from labctl.debug.gdb import GdbSpec, gdb_target, guest_module_commands, run_breakpoint_session
from labctl.state.runstate import LabState
from tests.conftest import ROOT, Cli

LAB = "gdblab"
LAB_YAML = (f"name: {LAB}\nnetworks: {{lan: {{}}}}\nguests:\n"
            "  a: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.66.0.1/24}]}\n"
            "  b: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.66.0.2/24}]}\n")
E1000_SOURCE = "drivers/net/ethernet/intel/e1000/e1000_main.c"


@contextlib.contextmanager
def lab_up(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LabState]:
    """The two-guest e1000 lab, up for the duration; always taken down."""
    monkeypatch.setenv("LABCTL_STATE_DIR", str(cli.state_dir))  # LabState.load in this process
    lab_file = tmp_path / "lab.yaml"
    lab_file.write_text(LAB_YAML)
    up = cli("up", str(lab_file))
    assert up.returncode == 0, up.stderr  # a failed up leaves nothing to take down
    try:
        yield LabState.load(LAB)
    finally:
        down = cli("down", LAB)
        assert down.returncode == 0, down.stderr


def assert_guest_runs(cli: Cli, state: LabState, guest: str = "a") -> None:
    """QEMU says running, SSH works, and the lab network still carries pings."""
    status = qmp_execute(state.guests[guest].qmp, "query-status")
    assert status["running"], status
    assert cli("exec", LAB, guest, "--", "true", timeout=60).returncode == 0
    ping = cli("exec", LAB, guest, "--", "ping", "-c", "2", "-W", "3", "10.66.0.2", timeout=60)
    assert ping.returncode == 0, ping.stdout + ping.stderr


def test_breakpoint_in_the_e1000_module_while_pinging(cli: Cli, image: object, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with lab_up(cli, tmp_path, monkeypatch) as state:
        target = gdb_target(state, "a")
        module_cmds = guest_module_commands(state, "a", target.debug_modules)
        assert any("/e1000.ko " in c for c in module_cmds), module_cmds
        ping = cli("exec", LAB, "a", "--", "setsid ping -i 0.2 -c 300 10.66.0.2 </dev/null >/dev/null 2>&1 &",
                   timeout=60)
        assert ping.returncode == 0, ping.stderr

        spec = GdbSpec("e1000_xmit_frame", hits=2, step=3, timeout=120)
        out = tmp_path / "gdb"
        t = run_breakpoint_session(target.stub, target.vmlinux, module_cmds, spec, out,
                                   monitor=target.monitor)

        assert (t.hits, t.timed_out, t.error) == (2, False, None), t.to_text()
        assert t.guest_resumed
        for n, hit in enumerate(t.hit_stops, 1):
            assert hit.hit == n
            assert hit.reason == "breakpoint-hit"
            assert hit.frame.func == "e1000_xmit_frame"
            assert hit.frame.file == E1000_SOURCE and hit.frame.line
            assert [a.name for a in hit.args] == ["skb", "netdev"]
            assert all(a.value and a.value.startswith("0x") for a in hit.args)
            assert hit.registers["rip"] == t.breakpoint["addr"]
            assert hit.registers["rdi"] == hit.args[0].value  # x86-64: first argument in rdi
            funcs = [f.func for f in hit.backtrace]
            assert funcs[0] == "e1000_xmit_frame" and "dev_hard_start_xmit" in funcs, funcs
            steps = [s for s in t.stops if s.kind == "step" and s.hit == n]
            assert [s.step for s in steps] == [1, 2, 3]
            assert all(s.frame.func and s.frame.file and s.frame.line for s in steps)

        text = (out / "gdb-transcript.txt").read_text()
        assert f"hit 1 at e1000_xmit_frame ({E1000_SOURCE}:" in text
        assert "args: skb=0x" in text and "netdev=0x" in text
        assert "  step 3: " in text
        assert (out / "gdb-transcript.json").is_file()

        assert_guest_runs(cli, state)


def test_a_breakpoint_never_hit_times_out_and_the_guest_runs_on(cli: Cli, image: object, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with lab_up(cli, tmp_path, monkeypatch) as state:
        target = gdb_target(state, "a")
        t = run_breakpoint_session(target.stub, target.vmlinux, [], GdbSpec("sysrq_handle_crash", timeout=5),
                                   tmp_path / "gdb", monitor=target.monitor)
        assert t.timed_out and t.hits == 0
        assert t.message == "breakpoint sysrq_handle_crash was never hit within 5 s"
        assert t.breakpoint["func"] == "sysrq_handle_crash"
        assert "was never hit within 5 s" in (tmp_path / "gdb" / "gdb-transcript.txt").read_text()
        assert_guest_runs(cli, state)


def labctl_gdb(cli: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labctl", "gdb", *args], check=False, cwd=ROOT,
                          env=cli.env, capture_output=True, text=True, timeout=300)


def test_labctl_gdb_batch_prints_a_backtrace(cli: Cli, image: object, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with lab_up(cli, tmp_path, monkeypatch) as state:
        res = labctl_gdb(cli, LAB, "a", "--batch", "bt 2", "info symbol e1000_xmit_frame")
        assert res.returncode == 0, res.stderr
        assert "#0  " in res.stdout and "#1  " in res.stdout, res.stdout
        assert "e1000_xmit_frame in section .text of " in res.stdout  # module symbols were added
        assert "detached" in res.stdout
        script = Path(state.guests["a"].dir) / "gdb-init.gdb"
        assert script.stat().st_mode & 0o777 == 0o600
        assert f"target remote {state.guests['a'].gdb}" in script.read_text()  # its unix socket, no port
        assert_guest_runs(cli, state)

        bad = labctl_gdb(cli, LAB, "nope", "--batch", "bt 1")
        assert bad.returncode == 5 and "has no guest 'nope'" in bad.stderr

