"""Bring your own kernel, for real: Debian kernels side by side, a full run on the RT kernel,
the cloud kernel refused before boot, and a kernel built from source (scripts/test-kernel.sh: a 6.1
tree and a 6.12 tree) with gdb, module symbols, tracing and oops decoding following it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.image import apt
from tests.conftest import ROOT, Cli
from tests.integration.conftest import another_abi, qemu_pids_under, with_abi

OVER_3_MIN = ("five kernels booted for real: a second Debian ABI and the RT kernel (each downloaded with its "
              "~1 GB -dbg and prepared on a new machine), a full nic-driver-cost run on RT, and the test trees' "
              "kernels (6.1 and 6.12) with gdb and oops decoding (313 s on a fresh machine with the 6.1 tree alone, "
              "2026-11-30)")

#: Files on the suite's kernel tree share one worker: on a new machine its build is waited for once.
pytestmark = pytest.mark.xdist_group("kernel-tree")

PREFLIGHT = ROOT / "tests" / "labs" / "preflight"


def _gdb(cli: Cli, lab: str, guest: str, *commands: str) -> str:
    res = subprocess.run([sys.executable, "-m", "labctl", "gdb", lab, guest, "--batch", *commands], cwd=ROOT,
                         env=cli.env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _status(cli: Cli, lab: str) -> dict[str, dict]:  # type: ignore[type-arg]
    data = json.loads(cli("status", lab, "--json", check=True).stdout)
    return {g["name"]: g for g in data["labs"][0]["guests"]}


def test_cloud_kernel_is_refused_before_anything_starts(cli: Cli, image: object, abi: str) -> None:
    # The lab pins 6.1.0-56's cloud kernel; on the day the archive drops it, the test takes today's ABI.
    lab = PREFLIGHT / "cloud-kernel.yaml"
    if abi != "6.1.0-56":
        lab = cli.state_dir / "cloud-kernel.yaml"
        lab.write_text(with_abi((PREFLIGHT / "cloud-kernel.yaml").read_text(), abi))
    res = cli("up", str(lab.relative_to(ROOT) if lab.is_relative_to(ROOT) else lab), "--accel", "tcg", timeout=600)
    assert res.returncode == 2, res.stdout + res.stderr
    expected = with_abi((PREFLIGHT / "cloud-kernel.expected").read_text(), abi)
    assert res.stderr == (expected if lab.is_relative_to(ROOT) else
                          expected.replace("tests/labs/preflight/cloud-kernel.yaml", str(lab)))
    assert "Traceback" not in res.stderr
    assert not (cli.state_dir / "labs" / "cloud-kernel").exists()  # nothing started, no state
    assert qemu_pids_under(cli.state_dir) == []
    # The same lab on the generic flavour passes preflight (the refusal is about the kernel).
    res = cli("up", str(lab), "--kernel", f"debian:{abi}-amd64", "--accel", "tcg", "--json", timeout=900)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        drivers = {(g, n["name"]): n["driver"] for g, s in _status(cli, "cloud-kernel").items() for n in s["nics"]}
        assert drivers[("a", "eth1")] == "e1000" and drivers[("b", "eth1")] in ("8139cp", "8139too")
    finally:
        cli("down", "cloud-kernel")


SIDE_BY_SIDE = """\
name: two-kernels
networks: {lan: {}}
guests:
  old:
    kernel: debian:OTHER-amd64
    nics: [{name: eth1, model: e1000, network: lan, ip: 10.71.0.1/24}]
  new:
    nics: [{name: eth1, model: rtl8139, network: lan, ip: 10.71.0.2/24}]
"""


@pytest.mark.timeout(3600)  # a fresh machine downloads (or builds) the kernel first
def test_a_debian_kernel_next_to_the_images_kernel(cli: Cli, image: object, tmp_path: Path, abi: str) -> None:
    other = another_abi(abi)  # another ABI of the line, as the archive carries them today (6.1.0-53 once)
    lab = tmp_path / "two.yaml"
    lab.write_text(SIDE_BY_SIDE.replace("OTHER", other))
    res = cli("up", str(lab), "--accel", "tcg", timeout=1800)  # its first use downloads it (~1 GB with -dbg)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"{other}-amd64" in res.stdout  # the table has a kernel column when guests differ
        release = {g: cli("exec", "two-kernels", g, "--", "uname -r", check=True).stdout.strip()
                   for g in ("old", "new")}
        assert release == {"old": f"{other}-amd64", "new": f"{abi}-amd64"}
        status = _status(cli, "two-kernels")
        assert {g: s["kernel"]["release"] for g, s in status.items()} == release
        assert status["old"]["nics"][0]["driver"] == "e1000"
        assert status["new"]["nics"][0]["driver"] in ("8139cp", "8139too")
        cli("exec", "two-kernels", "old", "--", "ping -c 2 -W 5 10.71.0.2", check=True)
        # gdb reads each guest's own vmlinux: the release string at init_uts_ns's address.
        xmit = {"e1000": "e1000_xmit_frame", "8139cp": "cp_start_xmit", "8139too": "rtl8139_start_xmit"}
        for g in ("old", "new"):
            driver = status[g]["nics"][0]["driver"]
            out = _gdb(cli, "two-kernels", g, "p init_uts_ns.name.release", f"info symbol {xmit[driver]}")
            assert f'"{release[g]}"' in out, out
            # the driver module's symbols, from that kernel's own debug files
            assert re.search(rf"/kernels/{status[g]['kernel']['dir'].rsplit('/', 1)[-1]}/debug-modules/.*"
                             rf"{driver}\.ko", out), out
        listed = json.loads(cli("kernel", "list", "--json", check=True).stdout)["kernels"]
        users = {k["release"]: k["used_by"] for k in listed}
        assert users[f"{other}-amd64"] == ["two-kernels"] and users[f"{abi}-amd64"] == ["two-kernels"]
    finally:
        down = cli("down", "two-kernels")
    assert down.returncode == 0, down.stderr
    assert qemu_pids_under(cli.state_dir) == []


@pytest.mark.timeout(3600)  # a fresh machine downloads (or builds) the kernel first
def test_nic_driver_cost_runs_on_the_rt_kernel(cli: Cli, image: object, tmp_path: Path, abi: str) -> None:
    rt = abi if f"{abi}" in apt.abis(abi.rsplit("-", 1)[0], "rt-amd64") else another_abi(abi, "rt-amd64")
    text = re.sub(r" -t \d+", " -t 2", (ROOT / "labs" / "nic-driver-cost.yaml").read_text())
    # One row of the matrix: the run on the RT kernel is the point; the three NIC models' runs are
    # test_run_labs.py's (on the image's kernel).
    for row in ("      - {label: rtl8139, nic: eth1, server: 10.11.0.2}\n",
                "      - {label: virtio-net-pci, nic: eth3, server: 10.13.0.2}\n"):
        assert row in text
        text = text.replace(row, "")
    lab = tmp_path / "nic-driver-cost.yaml"
    lab.write_text(text)
    res = cli("run", str(lab), "--kernel", f"debian:{rt}-rt-amd64", "--accel", "tcg",
              "--out", str(tmp_path / "runs"), "--json", timeout=2400)
    assert res.returncode == 0, res.stdout + res.stderr
    outcome = json.loads(res.stdout)
    assert outcome["status"] == "ok", outcome
    bundle = Path(outcome["bundle"])
    manifest = json.loads((bundle / "manifest.json").read_text())
    for guest in ("client", "server"):
        k = manifest["kernels"][guest]
        assert k["release"] == f"{rt}-rt-amd64" and k["source"]["kind"] == "debian"
        assert k["build_id"] and re.fullmatch(r"[0-9a-f]{64}", k["sha256"]["boot"])
        assert re.fullmatch(r"[0-9a-f]{64}", k["sha256"]["vmlinux.debug"])
        assert "PREEMPT_RT" in k["banner"]
    summary = json.loads((bundle / "summary.json").read_text())
    assert [s["variant"] for s in summary["steps"]] == ["e1000"]
    for step in summary["steps"]:
        assert step["status"] == "ok"
        client = bundle / step["dir"] / "client"
        assert (client / "perf.data").is_file() and (client / "perf-report-dso.txt").is_file()
        assert step["guests"]["client"]["throughput_mbit_s"] > 0
    for f in ("report.md", "report.html", "summary.json"):
        assert (bundle / f).is_file()
    assert f"{rt}-rt-amd64" in (bundle / "report.md").read_text()
    assert qemu_pids_under(cli.state_dir) == []


# -- a kernel built from source ---------------------------------------------------------------------

def _tree_lab(tmp_path: Path, tree: Path) -> Path:
    """tests/labs/valid/tree-kernel.yaml on the built tree (a path relative to the lab file), plus a crash."""
    text = (ROOT / "tests" / "labs" / "valid" / "tree-kernel.yaml").read_text()
    rel = os.path.relpath(tree, tmp_path)
    text = text.replace("name: tree-kernel\n", f"name: tree-kernel\nkernel: {{tree: {rel}}}\n")
    text += ("  - name: crash\n"
             "    run:\n"
             "      - {guest: b, command: \"echo c > /proc/sysrq-trigger\", timeout: 120}\n")
    lab = tmp_path / "tree.yaml"
    lab.write_text(text)
    return lab


@pytest.mark.timeout(3 * 3600)  # a fresh machine downloads (or builds) the kernel first
@pytest.mark.alone("its ftrace recording on the quiet tree kernel came back empty once beside another worker's guests")
@pytest.mark.parametrize("series", ["6.1", "6.12"])
def test_a_kernel_built_from_source(cli: Cli, image: object, series: str, tmp_path: Path,
                                    request: pytest.FixtureRequest) -> None:
    """The suite's tree of each line (linux-source-6.1 and -6.12, scripts/test-kernel.sh) as a lab's kernel."""
    tree_kernel: Path = request.getfixturevalue("tree_kernel" if series == "6.1" else "tree_kernel_612")
    release = (tree_kernel / "include" / "config" / "kernel.release").read_text().strip()
    assert release.startswith(f"{series}.") and release.endswith("-labctl-test"), release
    # `labctl kernel config`'s fragment for the lab (scripts/test-kernel.sh merged it) holds on each line
    # of the tree's own Kconfig: nothing it asks for was dropped on 6.1 or on 6.12
    config = dict(line.split("=", 1) for line in (tree_kernel / ".config").read_text().splitlines()
                  if line.startswith("CONFIG_"))
    fragment = (tree_kernel / "labctl.config").read_text().splitlines()
    assert any(line.startswith("CONFIG_E1000=") for line in fragment), fragment
    for line in fragment:
        if line.startswith("CONFIG_"):
            option, value = line.split("=", 1)
            assert config.get(option) == value, (series, line, config.get(option))
        elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
            assert line.split()[1] not in config, (series, line)
    lab = _tree_lab(tmp_path, tree_kernel)
    res = cli("up", str(lab), "--accel", "tcg", "--out", str(tmp_path / "runs"), "--json", timeout=1800)
    try:
        assert res.returncode == 6, res.stdout + res.stderr  # the crash step fails: that is the lab
        outcome = json.loads(res.stdout)
        assert [s["status"] for s in outcome["steps"]] == ["ok", "failed"]
        bundle = Path(outcome["bundle"])
        manifest = json.loads((bundle / "manifest.json").read_text())
        k = manifest["kernels"]["a"]
        assert k["release"] == release and k["source"] == {"kind": "tree", "tree": str(tree_kernel)}
        # Every guest runs the build, and the lab's NIC drivers bind (e1000 from the tree's module).
        for g in ("a", "c"):
            assert cli("exec", "tree-kernel", g, "--", "uname -r", check=True).stdout.strip() == release
        status = _status(cli, "tree-kernel")
        assert status["a"]["nics"][0]["driver"] == "e1000" and status["c"]["nics"][0]["driver"] == "virtio_net"
        assert status["b"]["nics"][0]["driver"] == "8139cp" and status["b"]["state"] == "crashed"
        lsmod = cli("exec", "tree-kernel", "a", "--", "cat /proc/modules", check=True).stdout
        assert lsmod.startswith("e1000 ") or "\ne1000 " in lsmod
        # The step's gdb breakpoint in the tree's e1000 module was hit; perf and ftrace recorded.
        ping = json.loads((bundle / "summary.json").read_text())["steps"][0]
        a = bundle / ping["dir"] / "a"
        transcript = (a / "gdb-transcript.txt").read_text()
        assert "e1000_xmit_frame" in transcript and "e1000_main.c" in transcript
        assert "net_dev_queue" in (a / "trace-report.txt").read_text()
        assert (a / "perf.data").is_file()
        # labctl gdb resolves the build's symbols and reads its memory.
        # (e1000_clean is the e1000 module's alone: the built-in e1000e has its own e1000_xmit_frame)
        out = _gdb(cli, "tree-kernel", "a", "bt 3", "p init_uts_ns.name.release", "info symbol e1000_clean")
        assert f'"{release}"' in out and "#0  " in out and " at " in out, out
        assert re.search(r"e1000_clean in section \.text of \S+/debug-modules/\S+/e1000\.ko", out), out
        # The oops decodes to the tree's own file:line.
        decoded = json.loads((bundle / "guests" / "b" / "oops.json").read_text())
        frames = [f for f in [decoded[0]["rip"], *decoded[0]["frames"]] if f]
        crash = next(f for f in frames if f["func"] == "sysrq_handle_crash")
        assert crash["file"].endswith("drivers/tty/sysrq.c") and crash["line"]
        source = (tree_kernel / "drivers" / "tty" / "sysrq.c").read_text().splitlines()
        start = next(i for i, line in enumerate(source) if line.startswith("static void sysrq_handle_crash("))
        assert start < crash["line"] <= start + 20  # a line of that function, in that tree
    finally:
        down = cli("down", "tree-kernel")
    assert down.returncode == 0, down.stderr
    assert qemu_pids_under(cli.state_dir) == []
