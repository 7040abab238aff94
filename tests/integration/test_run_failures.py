"""A guest killed in the middle of a step: the bundle keeps what was collected and says why."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import Cli, interrupt
from tests.integration.conftest import pids_matching, qemu_pids_under, require_libvirtd, virsh, wait_for

LAB = """\
name: killed
networks: {lan: {}}
guests:
  a:
    nics: [{name: eth1, model: e1000, network: lan, ip: 10.40.0.1/24}]
  b:
    nics: [{name: eth1, model: virtio-net-pci, network: lan, ip: 10.40.0.2/24}]
steps:
  - name: first
    nic: a.eth1
    run:
      - {guest: a, command: "ping -c 3 -i 0.2 {{b.eth1.ip}}"}
    trace:
      a: {mpstat: true}
  - name: second
    run:
      - {guest: a, command: "ping -c 600 -i 0.1 {{b.eth1.ip}}", timeout: 120}
    trace:
      a: {perf_record: true}
"""


def test_killing_a_guest_mid_step_keeps_earlier_artifacts_and_the_reason(cli: Cli, image: object,
                                                                         tmp_path: Path) -> None:
    lab = tmp_path / "killed.yaml"
    lab.write_text(LAB)
    runs = tmp_path / "runs"
    proc = cli.popen("run", str(lab), "--out", str(runs), "--accel", "tcg")
    # Wait until the second step's ping runs on a, then kill b's QEMU.
    b_pid = cli.state_dir / "labs" / "killed" / "guests" / "b" / "qemu.pid"
    wait_for(lambda: b_pid.exists(), 120, "guest b to start")
    wait_for(lambda: any(runs.glob("*/")) and _second_step_running(cli), 240, "the second step")
    os.kill(int(b_pid.read_text()), signal.SIGKILL)
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 6, err
    assert "Traceback" not in err
    (bundle,) = list(runs.iterdir())
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "second" in manifest["reason"]
    summary = json.loads((bundle / "summary.json").read_text())
    first, second = summary["steps"]
    assert first["status"] == "ok"
    assert second["status"] == "failed" and "b" in second["reason"]
    # The first step's artifacts are all there.
    a1 = bundle / "steps" / "first" / "_" / "a"
    assert (a1 / "cmd-0.out").read_text().count("bytes from 10.40.0.2") == 3
    assert (a1 / "mpstat.json").stat().st_size > 0
    assert (a1 / "stats" / "before" / "softnet_stat.txt").exists()
    assert (bundle / "guests" / "b" / "console.log").exists()
    # And nothing is left running.
    wait_for(lambda: not qemu_pids_under(cli.state_dir), 30, "QEMU to go")
    assert not (cli.state_dir / "labs" / "killed").exists()


def _second_step_running(cli: Cli, lab: str = "killed") -> bool:
    res = cli("exec", lab, "a", "--", "pgrep -f 'ping -c 600'")
    return res.returncode == 0


@pytest.mark.parametrize("backend", ["qemu", "libvirt"])
def test_ctrl_c_during_a_step_writes_the_bundle_and_stops_everything(cli: Cli, image: object, tmp_path: Path,
                                                                      backend: str) -> None:
    if backend == "libvirt":
        require_libvirtd()
    # this run's own name (libvirt's are global on the host; the QEMU check below is by name on both)
    name = harness.lab_name("killed" if backend == "qemu" else "killedlv")
    lab = tmp_path / "killed.yaml"
    lab.write_text(LAB.replace("name: killed", f"name: {name}"))
    runs = tmp_path / "runs"
    with cli.running("run", str(lab), "--out", str(runs), "--accel", "tcg", "--backend", backend) as proc:
        wait_for(lambda: (cli.state_dir / "labs" / name / "state.json").exists(), 180, "the lab")
        wait_for(lambda: _second_step_running(cli, name), 240, "the second step")
        _out, err = interrupt(proc, 300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (bundle,) = list(runs.iterdir())
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "interrupted" in manifest["reason"]
    assert manifest["backend"] == backend
    assert (bundle / "report.md").exists()
    assert (bundle / "steps" / "first" / "_" / "a" / "cmd-0.out").exists()
    # Both backends' QEMUs carry labctl-<lab>-<guest> in their -name (libvirt's argv names no state directory).
    wait_for(lambda: not pids_matching(f"qemu-system.*labctl-{name}-"), 30, "QEMU to go")
    assert not (cli.state_dir / "labs" / name).exists()
    if backend == "libvirt":
        listed = virsh("list", "--all", "--name")
        assert listed.returncode == 0 and not [d for d in listed.stdout.split() if d.startswith(f"labctl-{name}-")]
