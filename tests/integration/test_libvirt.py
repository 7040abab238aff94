"""The libvirt backend, end to end: the quickstart lab as transient libvirt domains."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import ROOT, Cli
from tests.integration.conftest import pids_matching, require_libvirtd, virsh

#: One worker for libvirt's tests: they share libvirtd's pool and its kernel volumes
#: (an up on one worker lost its kernel volume to the other worker's libvirt test once).
pytestmark = pytest.mark.xdist_group("libvirt")

LAB = ROOT / "labs" / "quickstart.yaml"
ADDRS = {"a": "10.10.0.1", "b": "10.10.0.2", "c": "10.10.0.3"}
DRIVERS = {"a": {"8139cp", "8139too"}, "b": {"e1000"}, "c": {"virtio_net"}}
_virsh = virsh
# Lab names are global on a libvirt host: this run's own, so that an earlier run's leftovers never meet it.
NAME = harness.lab_name("quickstart")


@pytest.fixture
def libvirtd() -> None:
    require_libvirtd()


def _lab_domains() -> list[str]:
    names = _virsh("list", "--all", "--name")
    assert names.returncode == 0, names.stderr
    return [n for n in names.stdout.split() if n.startswith(f"labctl-{NAME}-")]


def test_quickstart_on_libvirt(cli: Cli, image: object, libvirtd: None, tmp_path: Path) -> None:
    lab = tmp_path / "quickstart.yaml"
    lab.write_text(LAB.read_text().replace("name: quickstart\n", f"name: {NAME}\n", 1))
    assert _lab_domains() == []
    # --save-state: each guest's own post-boot state (its own keys: not a class's shared one), for reset
    up = cli("up", str(lab), "--backend", "libvirt", "--accel", "tcg", "--save-state")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert sorted(_lab_domains()) == [f"labctl-{NAME}-{g}" for g in "abc"]
        status = json.loads(cli("status", "--json", check=True).stdout)
        (lab,) = status["labs"]
        assert lab["backend"] == "libvirt"
        assert {g["name"]: g["state"] for g in lab["guests"]} == {g: "running" for g in "abc"}

        for name in ADDRS:
            drv = cli("exec", NAME, name, "--", "ethtool", "-i", "eth1", check=True).stdout
            driver = drv.splitlines()[0].split(": ", 1)[1]
            assert driver in DRIVERS[name], drv
            for other, ip in ADDRS.items():
                if other != name:
                    ping = cli("exec", NAME, name, "--", "ping", "-c", "2", "-W", "3", ip)
                    assert ping.returncode == 0, f"{name} -> {other}: {ping.stdout}{ping.stderr}"

        state = json.loads((cli.state_dir / "labs" / NAME / "state.json").read_text())
        assert {g: (r["extra"]["saved"], r["extra"].get("throwaway_state")) for g, r in state["guests"].items()} \
            == {g: (["postboot"], None) for g in "abc"}
        t0 = time.time()  # saved and restored at once during up: its clock set to the host's again
        guest_time = float(cli("exec", NAME, "c", "--", "date +%s.%N", check=True).stdout)
        assert abs(guest_time - (t0 + time.time()) / 2) < 2.5
        cli("exec", NAME, "c", "--", "touch /root/later", check=True)
        reset = cli("reset", NAME, "c", timeout=300)
        assert reset.returncode == 0, reset.stdout + reset.stderr
        assert cli("exec", NAME, "c", "--", "test -e /root/later").returncode == 1
        back = cli("exec", NAME, "c", "--", "ping", "-c", "2", "-W", "3", ADDRS["a"])
        assert back.returncode == 0, back.stdout + back.stderr
    finally:
        down = cli("down", NAME)
    assert down.returncode == 0, down.stderr
    assert _lab_domains() == []
    assert pids_matching(f"qemu-system.*guest=labctl-{NAME}-") == []
    assert not [p for p in Path("/var/lib/libvirt/labctl-run").glob("*") if p.name.startswith(
        (f"labctl-{NAME}-", f"{NAME}."))]  # the guests' and the lab's directories on the host
    assert not list(Path("/var/lib/libvirt/labctl").glob(f"labctl-{NAME}-*"))  # its volumes
    assert not (cli.state_dir / "labs" / NAME).exists()
