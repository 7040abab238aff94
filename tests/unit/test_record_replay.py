"""Record/replay's command lines and refusals are data: checked here (labctl.replay)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from labctl.backends import RRFILE, ReplayFiles, fw_cfg_files, read_only_files, replay_argv
from labctl.backends.qemu.argv import build_argv
from labctl.errors import UsageError
from labctl.lab import load_lab, record_refusals
from labctl.replay.keep import FW_CFG, MANIFEST, RECORDING, load, sha256
from labctl.replay.runrec import check, failed_guests, recorded_lab
from tests.unit.test_qemu_argv import ROOT, _pairs, _plans

LAB = """\
name: rr
networks:
  lan: {}
guests:
  a:
    cpus: 1
    record: true
    nics:
      - {name: eth1, model: e1000, network: lan, ip: 10.9.0.1/24}
  b:
    cpus: 2
    nics:
      - {name: eth1, model: virtio-net-pci, network: lan, ip: 10.9.0.2/24}
"""


def _lab(tmp_path: Path, text: str = LAB) -> Path:
    f = tmp_path / "rr.yaml"
    f.write_text(text)
    return f


def _recorded(tmp_path: Path) -> list[str]:
    plan = _plans(tmp_path, _lab(tmp_path))["a"]
    assert plan.guest.record
    return build_argv(plan)


def test_a_recorded_guest_runs_single_threaded_tcg_with_icount_record(tmp_path: Path) -> None:
    argv = _recorded(tmp_path)
    assert _pairs(argv, "-accel") == ["tcg,thread=single"]
    assert _pairs(argv, "-icount") == [f"shift=auto,rr=record,rrfile={tmp_path / 'a' / RRFILE}"]


def test_every_netdev_has_a_replay_filter_and_every_disk_a_blkreplay_node(tmp_path: Path) -> None:
    argv = _recorded(tmp_path)
    netdevs = [n.split("id=")[1].split(",")[0] for n in _pairs(argv, "-netdev")]
    assert netdevs == ["mgmt", "lab0"]
    assert [o for o in _pairs(argv, "-object") if o.startswith("filter-replay")] == [
        "filter-replay,id=rr-mgmt,netdev=mgmt", "filter-replay,id=rr-lab0,netdev=lab0"]
    drives = _pairs(argv, "-drive")
    assert not any("if=virtio" in d for d in drives)  # no drive reaches a device but through blkreplay
    layered = [d for d in drives if d.startswith("driver=blkreplay")]
    assert [d.split("image=")[1].split(",")[0] for d in layered] == ["rr-disk0", "rr-disk1"]
    assert layered[1].endswith(",readonly=on")  # the modules disk stays read-only
    assert "virtio-blk-pci,drive=rr-blk0" in _pairs(argv, "-device")
    assert "virtio-blk-pci,drive=rr-blk1" in _pairs(argv, "-device")


def test_an_unrecorded_guest_argv_is_unchanged(tmp_path: Path) -> None:
    plan = _plans(tmp_path, _lab(tmp_path))["b"]
    argv = build_argv(plan)
    assert not _pairs(argv, "-icount") and not any("blkreplay" in a or "filter-replay" in a for a in argv)
    assert argv == build_argv(dataclasses.replace(plan, guest=dataclasses.replace(plan.guest, record=False)))


def _files(tmp_path: Path, argv: list[str]) -> ReplayFiles:
    d = tmp_path / "replay"
    return ReplayFiles(d, d / "in" / RRFILE, d / "disk.qcow2", {n: d / "fw" / n for n in fw_cfg_files(argv)})


def test_the_replay_touches_nothing_of_the_recorded_lab(tmp_path: Path) -> None:
    argv = _recorded(tmp_path)
    files = _files(tmp_path, argv)
    rep = replay_argv(argv, files, ssh_port=41234)
    assert _pairs(rep, "-icount") == [f"shift=auto,rr=replay,rrfile={files.rrfile}"]
    lab_paths = [str(tmp_path / "a"), str(tmp_path / "net")]
    for a in rep:  # no socket, console, disk or file of the recorded guest or its links
        assert not any(p in a for p in lab_paths), a
    mgmt, lab0 = _pairs(rep, "-netdev")
    assert mgmt.startswith("user,id=mgmt,") and "hostfwd=tcp:127.0.0.1:41234-:22" in mgmt
    assert lab0.startswith("dgram,id=lab0,local.type=unix,") and str(files.dir) in lab0
    assert _pairs(rep, "-object") == _pairs(argv, "-object")  # the same filters, in the same order
    assert [d for d in _pairs(rep, "-device")] == [d for d in _pairs(argv, "-device")]  # the same machine
    assert f"file,id=serial0,path={files.console}" in _pairs(rep, "-chardev")
    assert "-S" not in rep and "-S" in replay_argv(argv, files, 41234, paused=True)


def test_a_replay_needs_a_recorded_argv(tmp_path: Path) -> None:
    plan = _plans(tmp_path, _lab(tmp_path))["b"]
    argv = build_argv(plan)
    with pytest.raises(ValueError, match="rr=record"):
        replay_argv(argv, _files(tmp_path, argv), 1)


def test_read_only_files_are_the_kernel_initrd_and_modules(tmp_path: Path) -> None:
    argv = _recorded(tmp_path)
    names = [p.name for p in read_only_files(argv)]
    assert names[:2] == ["boot", "initrd.img"]


def test_refusals_say_why_before_anything_starts(tmp_path: Path) -> None:
    lab = load_lab(_lab(tmp_path))
    assert record_refusals(lab, "a", "tcg", "qemu") == []
    assert record_refusals(lab, "a", "auto", "qemu") == []
    (kvm,) = record_refusals(lab, "a", "kvm", "qemu")
    assert kvm.startswith("guest a cannot be recorded: KVM")
    (smp,) = record_refusals(lab, "b", "tcg", "qemu")
    assert "2 vCPUs" in smp
    assert any("libvirt backend" in w for w in record_refusals(lab, "a", "tcg", "libvirt"))
    with pytest.raises(UsageError, match="2 vCPUs") as exc:
        check(recorded_lab(lab, True), "auto", None)
    assert exc.value.exit_code == 2
    assert check(lab, "auto", None) == "tcg"  # record: true on a: it runs on TCG


def test_a_multi_queue_nic_on_the_network_is_refused(tmp_path: Path) -> None:
    text = LAB.replace("model: virtio-net-pci,", "model: virtio-net-pci, queues: 2,").replace("cpus: 2", "cpus: 1")
    lab = load_lab(_lab(tmp_path, text))
    (why,) = record_refusals(lab, "a", "tcg", "qemu")
    assert "tap network" in why and "b.eth1" in why


def test_record_must_be_a_boolean(tmp_path: Path) -> None:
    from labctl.errors import LabFileError

    with pytest.raises(LabFileError, match="record: expected true or false"):
        load_lab(_lab(tmp_path, LAB.replace("record: true", "record: yes please")))


def test_failed_guests_are_those_of_failed_steps_else_every_recorded_one(tmp_path: Path) -> None:
    lab = recorded_lab(load_lab(_lab(tmp_path)), True)

    @dataclasses.dataclass
    class R:
        name: str
        status: str
        reason: str | None
        guests: list[str]

    assert failed_guests(lab, "ok", None, [R("s", "ok", None, ["a"])]) == {}
    assert failed_guests(lab, "failed", "x", [R("s", "failed", "boom", ["b"])]) == {"b": "step s: boom"}
    assert set(failed_guests(lab, "failed", "interrupted", [])) == {"a", "b"}


def _bundle(tmp_path: Path) -> Path:
    """A bundle with a recording of guest a whose files are all here."""
    argv = _recorded(tmp_path)
    b = tmp_path / "run"
    d = b / "guests" / "a" / RECORDING
    (d / FW_CFG).mkdir(parents=True)
    (d / RRFILE).write_bytes(b"recording" * 100)
    for name in fw_cfg_files(argv):
        (d / FW_CFG / name.rsplit("/", 1)[-1]).write_text("x")
    image = tmp_path / "rootfs.img"
    image.write_bytes(b"i")
    reads = []
    for p in [image, *read_only_files(argv)]:
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists():
            p.write_bytes(b"k")
        reads.append({"path": str(p), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns})
    (d / MANIFEST).write_text(json.dumps({
        "format": 1, "guest": "a", "qemu": "QEMU 7.2", "argv": argv, "image": reads[0], "reads": reads[1:],
        "recording": {"bytes": (d / RRFILE).stat().st_size, "sha256": sha256(d / RRFILE)}}))
    return b


def test_a_whole_recording_loads(tmp_path: Path) -> None:
    rec = load(_bundle(tmp_path), "a", "QEMU 7.2")
    assert rec.rrfile.name == RRFILE and set(rec.fw_cfg()) == set(fw_cfg_files(rec.argv))


def test_a_truncated_recording_is_refused(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    f = b / "guests" / "a" / RECORDING / RRFILE
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(UsageError, match="truncated"):
        load(b, "a", "QEMU 7.2")


def test_a_recording_of_another_kernel_or_qemu_is_refused(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    with pytest.raises(UsageError, match="made by QEMU 7.2"):
        load(b, "a", "QEMU 8.2")
    kernel = read_only_files(load(b, "a", "QEMU 7.2").argv)[0]
    kernel.write_bytes(b"another kernel")
    with pytest.raises(UsageError, match="another kernel or image"):
        load(b, "a", "QEMU 7.2")


def test_a_run_without_a_recording_says_so(tmp_path: Path) -> None:
    (tmp_path / "run" / "guests" / "a").mkdir(parents=True)
    with pytest.raises(UsageError, match="no recording of guest a") as exc:
        load(tmp_path / "run", "a", "QEMU 7.2")
    assert exc.value.exit_code == 2
    assert ROOT.is_dir()


def test_replay_of_a_missing_or_unrecorded_run_is_refused_before_anything_starts(tmp_path: Path) -> None:
    import subprocess
    import sys

    def replay(run: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "labctl", "replay", str(run), "a"], capture_output=True,
                              text=True, timeout=60, check=False, env={**os.environ, "COLUMNS": "200"})

    missing = replay(tmp_path / "nope")
    assert missing.returncode == 2 and f"{tmp_path / 'nope'}: no such run bundle" in missing.stderr, missing.stderr
    (tmp_path / "run").mkdir()
    unrecorded = replay(tmp_path / "run")
    assert unrecorded.returncode == 2 and "Traceback" not in unrecorded.stderr, unrecorded.stderr
    assert "no such run bundle" not in unrecorded.stderr


def test_a_recorded_guests_virtio_net_sends_on_its_timer_and_an_unrecorded_one_is_left_alone(tmp_path: Path) -> None:
    text = LAB.replace("model: e1000, network: lan, ip: 10.9.0.1", "model: virtio-net-pci, network: lan, ip: 10.9.0.1")
    plans = _plans(tmp_path, _lab(tmp_path, text))
    recorded = [d for d in _pairs(build_argv(plans["a"]), "-device") if d.startswith("virtio-net-pci")]
    assert recorded and all(d.split(",").count("tx=timer") == 1 for d in recorded), recorded
    files = _files(tmp_path, build_argv(plans["a"]))
    assert [d for d in _pairs(replay_argv(build_argv(plans["a"]), files, 41234), "-device")
            if d.startswith("virtio-net-pci")] == recorded  # the replay is the same machine
    assert not any("tx=" in d for d in _pairs(build_argv(plans["b"]), "-device"))


def test_a_step_that_sets_a_recorded_guests_link_is_refused(tmp_path: Path) -> None:
    # set_link is a monitor command: the recording does not hold it (its replay would keep the link up)
    steps = """steps:
  - name: flap
    matrix: [{label: one, who: a}]
    run:
      - {guest: a, command: "true"}
      - {link: "{{who}}.eth1", state: down}
"""
    lab = load_lab(_lab(tmp_path, LAB + steps))
    (why,) = record_refusals(lab, "a", "tcg", "qemu")
    assert why == ("guest a cannot be recorded: step flap sets the link of a.eth1 (QMP set_link): "
                   "the recording does not hold it")
    other = load_lab(_lab(tmp_path, LAB.replace("cpus: 2", "cpus: 1") + steps.replace("who: a", "who: b")))
    assert record_refusals(other, "a", "tcg", "qemu") == []  # the peer's link: a receives what it receives


def test_until_fail_repeats_until_a_run_fails_and_keeps_only_that_bundle(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``--until-fail N``: runs one after another, stopping at the first that fails; the passing runs'
    bundles removed, the failing one kept and reported; N passing runs keep the last one; N out of range
    or without a recording is a usage error before anything is prepared."""
    import argparse
    import itertools

    from labctl.cli import recording
    from labctl.pipeline import RunOutcome
    from labctl.up import UpOptions

    lab = load_lab(_lab(tmp_path))
    plan: list[str] = []
    made: list[Path] = []
    reported: list[RunOutcome] = []
    numbers = itertools.count(1)

    def one_run(args: object, lab: object, prepared: object, opts: object) -> RunOutcome:
        b = tmp_path / "runs" / f"run-{next(numbers)}"
        b.mkdir(parents=True)
        made.append(b)
        return RunOutcome(b, plan[len(made) - 1], None, [], [])

    prepared: list[object] = []
    monkeypatch.setattr(recording, "_one_run", one_run)
    monkeypatch.setattr(recording, "prepare", lambda *a, **k: prepared.append(a) or object())
    monkeypatch.setattr(recording, "check", lambda lab, accel, backend: "tcg")
    monkeypatch.setattr(recording, "up_options", lambda args: UpOptions())
    monkeypatch.setattr(recording, "report_outcome", lambda outcome, as_json: reported.append(outcome) or 6)

    def run(until: int | None, record: bool = True) -> int:
        args = argparse.Namespace(until_fail=until, record=record, overcommit=False, json=False)
        return recording.record_run(args, lab, None, None, "now")

    plan[:] = ["ok", "ok", "failed", "ok"]
    assert run(5) == 6
    assert len(made) == 3 and [b.exists() for b in made] == [False, False, True] and reported[-1].bundle == made[2]
    made.clear()
    plan[:] = ["ok"] * 3
    run(3)
    assert [b.exists() for b in made] == [False, False, True] and reported[-1].status == "ok"
    made.clear()
    prepared.clear()
    for bad in (0, 101):
        with pytest.raises(UsageError, match=f"--until-fail {bad}: give 1 to 100"):
            run(bad)
    bare = load_lab(_lab(tmp_path, LAB.replace("    record: true\n", "")))
    with pytest.raises(UsageError, match="add --record"):
        recording.record_run(argparse.Namespace(until_fail=3, record=False), bare, None, None, "now")
    assert made == [] and prepared == []
