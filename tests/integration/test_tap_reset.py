"""Guests on tap networks (queues > 1) are reset, checkpointed and warm-started like any other:
their taps are opened again in the lab's namespace for each new QEMU (root only: taps need it)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.integration.conftest import qemu_pids_under, reset_while_pinging

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tap networks need root")

LAB = """\
name: mqreset
networks:
  multi: {}
  lan: {}
guests:
  a:
    memory: 256
    nics:
      - {name: eth1, model: virtio-net-pci, network: multi, ip: 10.63.0.1/24, queues: 2}
  b:
    memory: 256
    nics:
      - {name: eth1, model: virtio-net-pci, network: multi, ip: 10.63.0.2/24, queues: 2}
      - {name: eth2, model: e1000, network: lan, ip: 10.64.0.2/24}
  c:
    memory: 256
    nics:
      - {name: eth1, model: e1000, network: lan, ip: 10.64.0.3/24}
"""


def _status(cli: Cli) -> dict:
    (data,) = json.loads(cli("status", "mqreset", "--json", check=True).stdout)["labs"]
    return data


def _two_queues_and_the_tap_link(cli: Cli) -> None:
    """a's eth1 has two queue pairs (one CPU uses one of them), and a and b reach each other
    over the tap network."""
    ethtool = cli("exec", "mqreset", "a", "--", "ethtool", "-l", "eth1", check=True).stdout
    assert re.search(r"Pre-set maximums:.*?Combined:\s+2", ethtool, re.DOTALL), ethtool
    for src, dst in (("a", "10.63.0.2"), ("b", "10.63.0.1")):
        ping = cli("exec", "mqreset", src, "--", "ping", "-c", "2", "-W", "3", dst)
        assert ping.returncode == 0, f"{src} -> {dst}: {ping.stdout}{ping.stderr}"


def test_a_multiqueue_guest_is_reset_and_warm_started(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "mqreset.yaml"
    lab.write_text(LAB)
    up = cli("up", str(lab), "--accel", "tcg", "--cold")
    assert up.returncode == 0, up.stderr
    try:
        _two_queues_and_the_tap_link(cli)
        cli("exec", "mqreset", "a", "--", "touch /root/before-reset && ip link set eth1 mtu 1400", check=True)
        # b and c ping each other over their dgram link all through a's reset.
        back = reset_while_pinging(cli, "mqreset", "a", "b", "10.64.0.3")
        assert back["guest"] == "a" and back["from"] == "snapshot", back
        # a is back at its post-boot state, on two queues of a fresh tap, on the same bridge as b's
        assert cli("exec", "mqreset", "a", "--", "test", "-e", "/root/before-reset").returncode == 1
        assert "mtu 1500" in cli("exec", "mqreset", "a", "--", "ip", "link", "show", "eth1", check=True).stdout
        _two_queues_and_the_tap_link(cli)
        # a checkpoint of the whole lab (taps on a and b) restores the same way
        assert cli("exec", "mqreset", "b", "--", "touch", "/root/step1").returncode == 0
        assert cli("checkpoint", "save", "mqreset", "step1").returncode == 0
        cli("exec", "mqreset", "b", "--", "rm", "/root/step1", check=True)
        restored = cli("checkpoint", "restore", "mqreset", "step1")
        assert restored.returncode == 0, restored.stdout + restored.stderr
        assert cli("exec", "mqreset", "b", "--", "test", "-e", "/root/step1").returncode == 0
        _two_queues_and_the_tap_link(cli)
    finally:
        assert cli("down", "mqreset").returncode == 0
    assert not [n for n in os.listdir("/run/netns") if n.startswith("labctl-mqreset-")]

    # The next up restores every guest, the tap ones too, from the snapshots the cold up took.
    up = cli("up", str(lab), "--accel", "tcg")
    assert up.returncode == 0, up.stderr
    try:
        assert {g["name"]: g["started_from"] for g in _status(cli)["guests"]} == {
            "a": "snapshot", "b": "snapshot", "c": "snapshot"}
        _two_queues_and_the_tap_link(cli)
    finally:
        assert cli("down", "mqreset").returncode == 0
    assert qemu_pids_under(cli.state_dir) == []
