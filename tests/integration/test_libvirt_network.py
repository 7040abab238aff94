"""Capture, impairment and link state on the libvirt backend (QEMU as libvirt's unprivileged user).

A ping step with capture and a step's impairment: tshark reads the bundle's
pcapng of both ends and finds the echo requests and replies with the right
addresses; QEMU wrote its capture file in the guest's directory on the host
(libvirt's QEMU user's), reached through libvirt's monitor passthrough. A
link entry of the step takes a NIC down through QMP set_link and the guest
sees it. Nothing of the lab is left in libvirt afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import Cli
from tests.integration.conftest import pids_matching, require_libvirtd, virsh, wait_for

#: One worker for libvirt's tests: they share libvirtd's pool and its kernel volumes
#: (an up on one worker lost its kernel volume to the other worker's libvirt test once).
pytestmark = pytest.mark.xdist_group("libvirt")

TAG = f"lvn{harness.RUN_ID}"  # lab names are global on a libvirt host: this run's own


def test_capture_impair_and_link_on_libvirt(cli: Cli, image: object, tmp_path: Path) -> None:
    require_libvirtd()
    if shutil.which("tshark") is None:
        pytest.fail("tshark is missing: run setup.sh")
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"""
name: {TAG}
backend: libvirt
networks:
  link: {{capture: true}}
guests:
  a: {{nics: [{{name: eth1, model: e1000, network: link, ip: 10.73.0.1/24}}]}}
  b: {{nics: [{{name: eth1, model: virtio-net-pci, network: link, ip: 10.73.0.2/24}}]}}
steps:
  - name: ping
    impair: {{a.eth1: {{delay: 30ms}}}}
    run:
      - {{guest: a, command: "ping -c 3 -i 0.3 {{{{b.eth1.ip}}}}"}}
  - name: cut
    run:
      - {{link: b.eth1, state: down}}
      - {{guest: b, command: "for i in $(seq 50); do ip link show eth1 | grep -q NO-CARRIER && exit 0; sleep 0.2; done; exit 1"}}
      - {{link: b.eth1, state: up}}
""")
    res = cli("run", str(lab), "--out", str(tmp_path / "runs"), "--accel", "tcg", "--json", timeout=1200)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        bundle = Path(json.loads(res.stdout)["bundle"])
        summary = json.loads((bundle / "summary.json").read_text())
        ping, cut = summary["steps"]
        assert ping["status"] == "ok" and cut["status"] == "ok", summary["steps"]
        for guest in ("a", "b"):
            path = bundle / ping["dir"] / guest / "eth1.pcapng"
            out = subprocess.run(["tshark", "-r", str(path), "-Y", "icmp", "-T", "fields", "-e", "ip.src",
                                  "-e", "ip.dst", "-e", "icmp.type", "-e", "frame.interface_name"],
                                 capture_output=True, text=True, timeout=120, check=True).stdout.split("\n")
            frames = [line.split("\t") for line in out if line]
            assert frames == [["10.73.0.1", "10.73.0.2", "8", f"{guest}.eth1"],
                              ["10.73.0.2", "10.73.0.1", "0", f"{guest}.eth1"]] * 3, frames
        assert all(c["calibrated"] and c["missing"] == 0 for c in ping["captures"]), ping["captures"]
        rtt = (bundle / ping["dir"] / "a" / "cmd-0.out").read_text()
        assert float(rtt.rsplit("=", 1)[1].split("/")[1]) >= 30, rtt
        assert cut["network"]["links"] == {"b.eth1": "up"}
        assert next(c["command"] for c in json.loads((bundle / "manifest.json").read_text())["commands"]
                    if c["step"] == "cut") == f"labctl link {TAG} b eth1 down"
    finally:
        names = virsh("list", "--all", "--name").stdout.split()
        for dom in (n for n in names if n.startswith(f"labctl-{TAG}-")):
            virsh("destroy", dom)
    assert not [n for n in virsh("list", "--all", "--name").stdout.split() if n.startswith(f"labctl-{TAG}-")]
    wait_for(lambda: not pids_matching(f"qemu-system.*guest=labctl-{TAG}-"), 30, "QEMU processes to go")
    assert not [p for p in Path("/var/lib/libvirt/labctl-run").glob(f"labctl-{TAG}-*")]
