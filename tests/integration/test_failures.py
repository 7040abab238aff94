"""Failures during up stop cleanly: nothing left running, clear messages."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from labctl.image import Image
from labctl.lab import load_lab
from labctl.pipeline import prepare_kernels
from labctl.ssh import Session
from labctl.up import lifecycle, teardown
from tests.conftest import ROOT, Cli, interrupt
from tests.integration.conftest import pids_matching, qemu_pids_under, wait_for

LAB = ROOT / "labs" / "quickstart.yaml"


def _nothing_left(cli: Cli, lab: str) -> None:
    wait_for(lambda: not qemu_pids_under(cli.state_dir), 15, "QEMU processes to go")
    assert not (cli.state_dir / "labs" / lab).exists()
    assert not list(cli.state_dir.rglob("*.sock"))
    assert pids_matching(f"labctl.net.switch.*{cli.state_dir}") == []


def test_sigint_while_booting_leaves_nothing_behind(cli: Cli, image: object) -> None:
    guests = cli.state_dir / "labs" / "quickstart" / "guests"
    with cli.running("up", str(LAB), "--accel", "tcg") as proc:
        # Wait until all three QEMUs run and the kernels are booting.
        wait_for(lambda: len(qemu_pids_under(cli.state_dir)) == 3, 60, "three QEMU processes")
        wait_for(lambda: all((guests / g / "console.log").exists() and (guests / g / "console.log").stat().st_size
                             for g in "abc"), 60, "console output")
        _out, err = interrupt(proc, 60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "Traceback" not in err
    _nothing_left(cli, "quickstart")


def test_guest_that_never_gets_ready_is_reported_with_its_console(cli: Cli, image: object, tmp_path: Path) -> None:
    # init=/bin/false: the kernel panics when init exits, never says READY.
    lab = tmp_path / "broken.yaml"
    lab.write_text("name: broken\nnetworks: {}\nguests:\n  x:\n    kernel_args: init=/bin/false\n")
    res = cli("up", str(lab), "--accel", "tcg", "--boot-timeout", "120")
    if res.returncode == 0:
        cli("down", "broken")
    assert res.returncode == 4, res.stderr
    assert "guest x failed to boot" in res.stderr or "died while booting" in res.stderr
    assert "Kernel panic" in res.stderr  # the console's last lines are shown
    assert "Traceback" not in res.stderr
    _nothing_left(cli, "broken")


def test_boot_timeout_is_reported(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "slow.yaml"
    lab.write_text("name: slow\nnetworks: {}\nguests:\n  s: {}\n")
    res = cli("up", str(lab), "--accel", "tcg", "--boot-timeout", "1", timeout=300)
    assert res.returncode == 4, res.stderr
    assert "was not ready after 1 s" in res.stderr
    _nothing_left(cli, "slow")


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_qemu_dying_while_booting_is_reported(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "dies.yaml"
    lab.write_text("name: dies\nnetworks: {}\nguests:\n  d: {}\n")
    # --cold: a warm start (a post-boot snapshot of this guest from another test) prints no boot
    proc = cli.popen("up", str(lab), "--accel", "tcg", "--cold")
    qmp = cli.state_dir / "labs" / "dies" / "guests" / "d" / "qmp.sock"
    wait_for(lambda: qmp.exists(), 60, "QEMU's monitor socket")
    pids = wait_for(lambda: qemu_pids_under(cli.state_dir), 60, "QEMU to start")
    # Past the start check (QEMU answered its monitor): its vCPU has run for 2 CPU-seconds (firmware,
    # then the kernel, which boots quiet: nothing on the console yet). A fixed 0.5 s after the socket
    # appeared was too short on a loaded host.
    wait_for(lambda: _cpu_seconds(pids[0]) >= 2.0, 120, "QEMU's guest to run")
    os.kill(pids[0], signal.SIGKILL)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err
    assert "QEMU of guest d died while booting" in err
    _nothing_left(cli, "dies")


def test_a_port_taken_before_qemu_binds_it_is_retried_on_new_ports(
        cli: Cli, image: Image, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another program takes the SSH port labctl picked before QEMU binds it
    # (its hostfwd): QEMU dies at start, and up must start the guest on a new
    # port (and pin its host key under that port) instead of failing.
    monkeypatch.setenv("LABCTL_STATE_DIR", str(cli.state_dir))
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    real_free_port = lifecycle.free_port
    calls = iter(range(1000))

    def free_port() -> int:
        return taken_port if next(calls) == 0 else real_free_port()  # call 0: the guest's SSH port

    monkeypatch.setattr(lifecycle, "free_port", free_port)
    lab_file = tmp_path / "race.yaml"
    lab_file.write_text("name: race\nnetworks: {}\nguests:\n  r: {}\n")
    try:
        lab = load_lab(lab_file)
        state = lifecycle.up(lab, image, prepare_kernels(lab, image), lifecycle.UpOptions(accel="tcg"))
        rec = state.guests["r"]
        assert rec.ssh_port != taken_port
        with Session(state.endpoint("r")) as s:  # SSH with the pinned host key on the new port
            assert s.run("echo up").stdout.strip() == b"up"
    finally:
        taken.close()
        if (cli.state_dir / "labs" / "race").exists():
            teardown.down("race")
    _nothing_left(cli, "race")
