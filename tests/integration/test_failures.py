"""Failures during up stop cleanly: nothing left running, clear messages."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.conftest import ROOT, Cli
from tests.integration.conftest import pids_matching, qemu_pids_under, wait_for

LAB = ROOT / "labs" / "quickstart.yaml"


def _nothing_left(cli: Cli, lab: str) -> None:
    wait_for(lambda: not qemu_pids_under(cli.state_dir), 15, "QEMU processes to go")
    assert not (cli.state_dir / "labs" / lab).exists()
    assert not list(cli.state_dir.rglob("*.sock"))
    assert pids_matching(f"labctl.hub.*{cli.state_dir}") == []


def test_sigint_while_booting_leaves_nothing_behind(cli: Cli, image: object) -> None:
    proc = cli.popen("up", str(LAB), "--accel", "tcg")
    guests = cli.state_dir / "labs" / "quickstart" / "guests"
    # Wait until all three QEMUs run and the kernels are booting.
    wait_for(lambda: len(qemu_pids_under(cli.state_dir)) == 3, 60, "three QEMU processes")
    wait_for(lambda: all((guests / g / "console.log").exists() and (guests / g / "console.log").stat().st_size
                         for g in "abc"), 60, "console output")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
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
    t0 = time.monotonic()
    res = cli("up", str(lab), "--accel", "tcg", "--boot-timeout", "1")
    assert res.returncode == 4, res.stderr
    assert "was not ready after 1 s" in res.stderr
    assert time.monotonic() - t0 < 120
    _nothing_left(cli, "slow")


def test_qemu_dying_while_booting_is_reported(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "dies.yaml"
    lab.write_text("name: dies\nnetworks: {}\nguests:\n  d: {}\n")
    proc = cli.popen("up", str(lab), "--accel", "tcg")
    qmp = cli.state_dir / "labs" / "dies" / "guests" / "d" / "qmp.sock"
    wait_for(lambda: qmp.exists(), 60, "QEMU's monitor socket")
    time.sleep(0.5)  # past the start check: the kernel is booting
    pids = wait_for(lambda: qemu_pids_under(cli.state_dir), 60, "QEMU to start")
    os.kill(pids[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err
    assert "QEMU of guest d died while booting" in err
    _nothing_left(cli, "dies")
