"""The libvirt backend beyond ``up``: ``labctl run`` bundles, gdb, and clean teardown.

* ``labctl run`` of a shortened nic-driver-cost lab on libvirt gives a bundle
  of the same shape as the same lab on the qemu backend (both run here);
* a lab step's ``gdb:`` session and ``labctl gdb --batch`` work on a libvirt
  guest, and a gdb that dies holding the guest leaves it running (resumed
  through libvirt's QMP passthrough);
* after ``down`` and after Ctrl-C during ``up``, libvirt lists nothing of the
  lab and no QEMU of it runs.

Lab names carry this process's pid: libvirt domain names are global to
libvirtd, which other test runs on the same machine share.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.backends import get_backend
from labctl.state.runstate import LabState
from tests import harness
from tests.conftest import ROOT, Cli, interrupt
from tests.integration.conftest import LIBVIRT_URI, pids_matching, require_libvirtd, virsh, wait_for

#: One worker for libvirt's tests: they share libvirtd's pool and its kernel volumes
#: (an up on one worker lost its kernel volume to the other worker's libvirt test once).
pytestmark = pytest.mark.xdist_group("libvirt")

URI = LIBVIRT_URI
TAG = f"lv{harness.RUN_ID}"  # lab names are global on a libvirt host: this run's own


_virsh = virsh


@pytest.fixture
def libvirtd() -> Iterator[None]:
    """Skip unless libvirtd answers on the URI (scripts/libvirt-setup.sh sets it up).

    Afterwards, destroys any domain of this module's labs that a failed test left.
    """
    require_libvirtd()
    yield
    for dom in _domains(TAG):
        _virsh("destroy", dom)


def _domains(lab: str) -> list[str]:
    """Every libvirt domain (running or defined) of ``lab``."""
    names = _virsh("list", "--all", "--name")
    assert names.returncode == 0, names.stderr
    return sorted(n for n in names.stdout.split() if n.startswith(f"labctl-{lab}-"))


def _nothing_left(cli: Cli, lab: str) -> None:
    """libvirt knows no domain of the lab, no QEMU of it runs, its state is gone."""
    assert _domains(lab) == []
    wait_for(lambda: not pids_matching(f"qemu-system.*guest=labctl-{lab}-"), 30, "QEMU processes to go")
    assert not [p for p in Path("/var/lib/libvirt/labctl-run").glob("*")
                if p.name.startswith((f"labctl-{lab}-", f"{lab}."))]  # its directories on the host
    assert not (cli.state_dir / "labs" / lab).exists()


def _lab_copy(src: str, name: str, tmp_path: Path, edits: dict[str, str]) -> Path:
    """A copy of ``labs/src`` named ``name``, with regex ``edits`` applied (each must match)."""
    text = (ROOT / "labs" / src).read_text()
    text, n = re.subn(r"(?m)^name: .*$", f"name: {name}", text)
    assert n == 1
    for pattern, repl in edits.items():
        text, n = re.subn(pattern, repl, text)
        assert n, pattern
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


# -- labctl run: the bundle's shape ------------------------------------------------------

def bundle_files(bundle: Path) -> set[str]:
    """Every file of a bundle, relative to it. Only the bundle directory's own name
    (lab and time) is volatile; no name inside it is."""
    return {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}


# Maps keyed by what was measured (counters that moved, modules sampled, commands seen, kinds of
# code in a profile...): their keys differ from run to run, so only their presence is compared.
DATA_KEYED = frozenset({"snmp", "modules", "other_events", "by_comm", "by_cpu", "by_role", "kinds", "by_mode",
                        "vcpu_threads", "slices", "flows_not_drawn"})


def key_paths(data: Any, prefix: str = "") -> set[str]:
    """Paths of every dict key in ``data`` (lists are not descended: their lengths vary; nor are the
    maps keyed by what was measured)."""
    if not isinstance(data, dict):
        return set()
    out = set()
    for k, v in data.items():
        out.add(f"{prefix}/{k}")
        if k not in DATA_KEYED:
            out |= key_paths(v, f"{prefix}/{k}")
    return out


def _profile_reasons(*bundles: Path) -> str:
    """Why a host profile is missing from a bundle, in its own words and perf's (for a failure's message)."""
    out = []
    for b in bundles:
        for why in sorted(b.glob("steps/*/*/_host/*/profile-unavailable.txt")):
            log = why.with_name("perf-record.log")
            out.append(f"{why.relative_to(b.parent)}: {why.read_text().strip()}\n"
                       + (log.read_text(errors="replace")[-2000:] if log.is_file() else "(no perf-record.log)"))
    return "\n".join(out) or "no host profile is missing"


def step_results(summary: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What each step did, without its numbers (their keys are compared with the rest)."""
    return [(s["name"], s["variant"], s["status"], s["reason"], s["dir"], sorted(s["guests"]))
            for s in summary["steps"]]


def _run(cli: Cli, lab: Path, out: Path, backend: str) -> Path:
    res = cli("run", str(lab), "--backend", backend, "--out", str(out), "--accel", "tcg", "--json",
              timeout=1200)
    assert res.returncode == 0, res.stdout + res.stderr
    outcome = json.loads(res.stdout)
    assert outcome["status"] == "ok", outcome
    return Path(outcome["bundle"])


def test_run_on_libvirt_gives_the_qemu_backend_bundle(cli: Cli, image: object, libvirtd: None,
                                                      tmp_path: Path) -> None:
    name = f"{TAG}-ndc"
    # One matrix row (virtio-net-pci) and a 2 s transfer: the same steps, tracers and collectors.
    lab = _lab_copy("nic-driver-cost.yaml", name, tmp_path, {
        r" -t \d+": " -t 2",
        r"\n      - \{label: rtl8139,[^\n]*": "",
        r"\n      - \{label: e1000,[^\n]*": "",
    })
    bundles = {}
    for backend in ("libvirt", "qemu"):
        bundles[backend] = _run(cli, lab, tmp_path / backend, backend)
        _nothing_left(cli, name)
    lv, qm = bundles["libvirt"], bundles["qemu"]

    files = bundle_files(lv)
    assert files == bundle_files(qm), _profile_reasons(lv, qm)
    client = "steps/transfer/virtio-net-pci/client/"
    for f in ("perf.data", "perf-report-dso.txt", "mpstat.json", "stats/delta.json", "cmd-1.out"):
        assert client + f in files, f

    manifests = {b: json.loads((d / "manifest.json").read_text()) for b, d in bundles.items()}
    summaries = {b: json.loads((d / "summary.json").read_text()) for b, d in bundles.items()}
    assert key_paths(manifests["libvirt"]) == key_paths(manifests["qemu"])
    assert key_paths(summaries["libvirt"]) == key_paths(summaries["qemu"])
    assert step_results(summaries["libvirt"]) == step_results(summaries["qemu"])
    assert step_results(summaries["libvirt"])[0][2] == "ok"
    m = manifests["libvirt"]
    assert m["backend"] == "libvirt" and manifests["qemu"]["backend"] == "qemu"
    assert m["drivers"] == manifests["qemu"]["drivers"]
    assert [(c["guest"], c["index"], c["status"]) for c in m["commands"]] == \
        [(c["guest"], c["index"], c["status"]) for c in manifests["qemu"]["commands"]]
    # The QEMU that libvirt ran, as it ran: its version (asked over QMP) and real argv with the same NICs.
    assert m["qemu"]["guests"] == manifests["qemu"]["qemu"]["guests"]  # one libvirtd on this machine's QEMU
    assert set(m["qemu"]["guests"]) == {"client", "server"}
    assert re.match(r"QEMU emulator version \d+\.\d+\.\d+", m["qemu"]["version"]), m["qemu"]
    for guest, argv in m["qemu"]["argv"].items():
        assert argv[0].endswith("qemu-system-x86_64") and f"guest=labctl-{name}-{guest}" in " ".join(argv)
        assert sum("virtio-net-pci" in a for a in argv) == 2  # mgmt0 and eth3
    fig = summaries["libvirt"]["steps"][0]["figures"]
    assert fig["throughput_mbit_s"] > 0 and 0 < fig["cpu_load_pct"] <= 100
    assert fig["driver_share_pct"] > 0 and fig["driver_cpu_pct"] > 0
    # perf records from before the transfer starts (the runner waits for it),
    # so the driver module has samples even in a 2 s transfer (35-45 of 7K here;
    # none of 2K when perf started late, as CI once saw).
    assert "[virtio_net]" in (lv / client / "perf-report-dso.txt").read_text()


# -- gdb on libvirt guests, then down ----------------------------------------------------

def _qmp_status(state: LabState, guest: str) -> dict[str, Any]:
    """query-status through the guest's backend (libvirt's monitor passthrough)."""
    result: dict[str, Any] = get_backend(state.backend).qmp(state.guests[guest], "query-status")
    return result


def _assert_runs(cli: Cli, state: LabState, guest: str, peer_ip: str) -> None:
    assert _qmp_status(state, guest)["running"]
    assert _virsh("domstate", f"labctl-{state.lab}-{guest}").stdout.split()[0] == "running"
    ping = cli("exec", state.lab, guest, "--", "ping", "-c", "2", "-W", "5", peer_ip, timeout=120)
    assert ping.returncode == 0, ping.stdout + ping.stderr


def test_gdb_step_and_labctl_gdb_on_libvirt_then_down(cli: Cli, image: object, libvirtd: None,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"{TAG}-gdb"
    lab = _lab_copy("gdb-driver-step.yaml", name, tmp_path, {})
    monkeypatch.setenv("LABCTL_STATE_DIR", str(cli.state_dir))  # LabState.load in this process
    res = cli("up", str(lab), "--backend", "libvirt", "--accel", "tcg", "--out", str(tmp_path / "runs"),
              "--json", timeout=900)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        assert _domains(name) == [f"labctl-{name}-a", f"labctl-{name}-b"]
        state = LabState.load(name)
        assert state.backend == "libvirt" and not state.guests["a"].qmp  # no QMP socket of its own

        # The step's gdb: session broke in the driver, twice, and left the guest running.
        bundle = Path(json.loads(res.stdout)["bundle"])
        a = bundle / "steps" / "break-in-driver" / "_" / "a"
        transcript = json.loads((a / "gdb-transcript.json").read_text())
        assert (transcript["hits"], transcript["timed_out"], transcript["error"]) == (2, False, None)
        assert transcript["guest_resumed"]  # confirmed through libvirt's QMP
        hits = [s for s in transcript["stops"] if s["kind"] == "hit"]
        assert [h["frame"]["func"] for h in hits] == ["e1000_xmit_frame"] * 2
        assert "drivers/net/ethernet/intel/e1000/e1000_main.c" in (a / "gdb-transcript.txt").read_text()
        summary = json.loads((bundle / "summary.json").read_text())
        assert summary["steps"][0]["status"] == "ok" and summary["steps"][0]["gdb"]["hits"] == 2
        _assert_runs(cli, state, "a", "10.32.0.2")

        # labctl gdb --batch: module symbols, a backtrace, detached.
        gdb = cli("gdb", name, "a", "--batch", "bt 2", "info symbol e1000_xmit_frame", timeout=300)
        assert gdb.returncode == 0, gdb.stderr
        assert "#0  " in gdb.stdout and "#1  " in gdb.stdout, gdb.stdout
        assert "e1000_xmit_frame in section .text of " in gdb.stdout
        assert "detached" in gdb.stdout
        _assert_runs(cli, state, "a", "10.32.0.2")

        # A gdb killed while it holds the guest leaves it paused in QEMU: labctl resumes it.
        stuck = cli("gdb", name, "a", "--no-modules", "--timeout", "25", "--batch",
                    "python import time; time.sleep(120)", timeout=300)
        assert stuck.returncode == 4 and "gdb did not finish within 25 s" in stuck.stderr, stuck.stderr
        _assert_runs(cli, state, "a", "10.32.0.2")
    finally:
        down = cli("down", name, timeout=300)
    assert down.returncode == 0, down.stderr
    _nothing_left(cli, name)


# -- Ctrl-C during up --------------------------------------------------------------------

def test_sigint_while_booting_on_libvirt_leaves_nothing_behind(cli: Cli, image: object, libvirtd: None,
                                                               tmp_path: Path) -> None:
    name = f"{TAG}-int"
    lab = tmp_path / "int.yaml"
    lab.write_text(f"name: {name}\nnetworks: {{lan: {{}}}}\nguests:\n"
                   "  a: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.71.0.1/24}]}\n")
    console = cli.state_dir / "labs" / name / "guests" / "a" / "console.log"
    with cli.running("up", str(lab), "--backend", "libvirt", "--accel", "tcg") as proc:
        # The domain runs and its kernel is booting.
        wait_for(lambda: _domains(name) == [f"labctl-{name}-a"], 120, "the domain")
        wait_for(lambda: console.exists() and console.stat().st_size, 120, "console output")
        assert len(pids_matching(f"qemu-system.*guest=labctl-{name}-")) == 1
        _, err = interrupt(proc, 120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    _nothing_left(cli, name)
