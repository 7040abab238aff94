"""labs/oops-buggy-driver.yaml end to end: the crash is decoded to the module's source line, and the
victim's memory at its panic is in the bundle (QEMU paused it on the panic, labctl dumped it before
stopping it): a vmcore from which drgn prints the crashing frame's skb, the UDP packet the lab's
sender sent (33 bytes at the IP layer, 10.31.0.2 to 10.31.0.1:9999), which Debian's crash opens
too; the report shows drgn's view; ``labctl bundle`` packs the vmcore only when asked. And a guest
whose setup command crashes it while the lab comes up leaves its vmcore in the run's bundle."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

from labctl.kernel.cached import Kernel
from tests.conftest import ROOT, Cli
from tests.integration.conftest import qemu_pids_under

FLOW = "(skb len=33 data_len=0 protocol=0x0800 dev=eth1 10.31.0.2:"  # the sender's port is its own choice
TO = " > 10.31.0.1:9999 udp)"


def test_buggy_netfilter_module_oops_is_decoded_to_its_source(cli: Cli, image: object, tmp_path: Path) -> None:
    res = cli("run", str(ROOT / "labs" / "oops-buggy-driver.yaml"), "--out", str(tmp_path), "--accel", "tcg",
              "--json", timeout=900)
    assert res.returncode == 6, res.stdout + res.stderr  # the trigger step fails: that is the lab
    outcome = json.loads(res.stdout)
    assert [s["status"] for s in outcome["steps"]] == ["ok", "failed"]
    assert "guest victim crashed: BUG: kernel NULL pointer dereference in buggy_nf_count" in outcome["reason"]
    bundle = Path(outcome["bundle"])
    decoded = json.loads((bundle / "guests" / "victim" / "oops.json").read_text())
    rip = decoded[0]["rip"]
    assert rip["func"] == "buggy_nf_count" and rip["module"] == "buggy_nf"
    assert rip["file"] == "guest/modules/buggy_nf/buggy_nf.c"
    source = (ROOT / "guest" / "modules" / "buggy_nf" / "buggy_nf.c").read_text().splitlines()
    assert "st->packets++" in source[rip["line"] - 1]  # the faulting line itself
    frames = [f["func"] for f in decoded[0]["frames"]]
    assert "buggy_nf_hook" in frames and "nf_hook_slow" in frames
    assert qemu_pids_under(cli.state_dir) == []
    _the_vmcore_of_the_panic(cli, bundle, tmp_path)


def _the_vmcore_of_the_panic(cli: Cli, bundle: Path, tmp_path: Path) -> None:
    summary = json.loads((bundle / "summary.json").read_text())
    (rec,) = summary["vmcores"]
    assert (rec["guest"], rec["cause"], rec["when"], rec["error"]) == ("victim", "panic", "step trigger", None)
    assert rec["title"] == "BUG: kernel NULL pointer dereference in buggy_nf_count"
    core = bundle / "guests" / "victim" / "vmcore"
    assert rec["file"] == "guests/victim/vmcore" and core.stat().st_size == rec["size"]
    assert core.stat().st_mode & 0o777 == 0o600 and core.read_bytes()[:8] == b"KDUMP   "
    assert json.loads((bundle / "manifest.json").read_text())["vmcores"] == ["guests/victim/vmcore"]
    step = next(s for s in summary["steps"] if s["name"] == "trigger")
    assert "guest victim panicked: BUG: kernel NULL pointer dereference in buggy_nf_count; vmcore guests/victim/vmcore" \
        in step["warnings"]

    # drgn on the bundle's vmcore: the crashing task's stack, buggy_nf_count's locals, the packet sent
    res = cli("drgn", "--core", str(core), "--summary", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    (task,) = json.loads(res.stdout)["tasks"]
    names = [f["function"] for f in task["frames"]]
    count = task["frames"][names.index("buggy_nf_count")]
    assert task["crashed"] and count["source"] == "guest/modules/buggy_nf/buggy_nf.c:45"
    assert (count["locals"]["st"], count["locals"]["len"]) == ("(struct port_stats *)0x0", "(unsigned int)33")
    skbs = {v for f in task["frames"] for k, v in f["locals"].items() if k == "skb" and "skb len=" in v}
    assert skbs and all(FLOW in v and v.endswith(TO) for v in skbs), skbs
    # the report has drgn's view of it, as the bundle's vmcore.json holds it
    report = (bundle / "report.md").read_text()
    assert "### Guest victim panicked during step trigger" in report
    assert "buggy_nf_count at guest/modules/buggy_nf/buggy_nf.c:45" in report and FLOW in report
    assert "| `eth1` | 1500 | UP RUNNING carrier |" in report
    # Debian's crash opens the same vmcore
    kernel = Kernel.at(json.loads((bundle / "manifest.json").read_text())["kernels"]["victim"]["dir"])
    out = subprocess.run(["crash", "-s", str(kernel.vmlinux_debug), str(core)], input="sys\nbt\nquit\n",
                         capture_output=True, text=True, timeout=600, check=False)
    assert f"RELEASE: {kernel.release}" in out.stdout and "NODENAME: victim" in out.stdout, out.stdout + out.stderr
    assert "PANIC:" in out.stdout and "buggy_nf_count" in out.stdout, out.stdout

    # labctl bundle: the vmcore stays out unless asked
    packed = cli("bundle", str(bundle), "-o", str(tmp_path / "plain.tar.gz"))
    assert packed.returncode == 0 and "left out guests/victim/vmcore" in " ".join(packed.stderr.split())
    with tarfile.open(tmp_path / "plain.tar.gz") as tar:
        names = tar.getnames()
    assert f"{bundle.name}/guests/victim/vmcore.json" in names and f"{bundle.name}/guests/victim/vmcore" not in names
    assert cli("bundle", str(bundle), "-o", str(tmp_path / "full.tar.gz"), "--with-vmcores").returncode == 0
    with tarfile.open(tmp_path / "full.tar.gz") as tar:
        assert f"{bundle.name}/guests/victim/vmcore" in tar.getnames()


def test_a_guest_that_crashes_while_the_lab_comes_up_leaves_its_vmcore(cli: Cli, image: object,
                                                                         tmp_path: Path) -> None:
    """Its setup command panics it (sysrq's crash): up stops waiting at once, takes the vmcore
    while QEMU holds the guest paused, and the run's bundle is written though no step ran."""
    lab = tmp_path / "bootcrash.yaml"
    lab.write_text("name: bootcrash\nnetworks: {lan: {}}\nguests:\n  a:\n    memory: 512\n"
                   "    nics: [{name: eth1, model: e1000, network: lan, ip: 10.77.0.1/24}]\n"
                   "    setup: ['echo c > /proc/sysrq-trigger']\n"
                   "steps:\n  - {name: never, run: [{guest: a, command: 'true'}]}\n")
    res = cli("run", str(lab), "--out", str(tmp_path / "runs"), "--accel", "tcg", timeout=900)
    assert res.returncode != 0 and "guest a crashed during its setup" in res.stderr, res.stderr
    (bundle,) = (tmp_path / "runs").iterdir()
    assert f"itsvmcore:{bundle}/guests/a/vmcore" in "".join(res.stderr.split())
    summary = json.loads((bundle / "summary.json").read_text())
    (rec,) = summary["vmcores"]
    assert (rec["cause"], rec["when"], rec["title"]) == ("panic", "up", "Kernel panic - not syncing: sysrq triggered crash")
    assert (bundle / "guests" / "a" / "vmcore").stat().st_mode & 0o777 == 0o600
    digest = json.loads((bundle / "guests" / "a" / "vmcore.json").read_text())
    assert "sysrq_handle_crash" in [f["function"] for f in digest["tasks"][0]["frames"]]
    assert "### Guest a panicked during up" in (bundle / "report.md").read_text()
    assert qemu_pids_under(cli.state_dir) == []
