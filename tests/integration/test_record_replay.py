"""Record/replay end to end (issue 53): one small guest recorded through a short run whose step
fails, its recording kept in the bundle; its replay alone prints the recorded console byte for
byte (the boot, and most times on through the run's SSH logins to the step's mark; a replay that
stops advancing is said to have diverged); gdb on the replay stops at the same instruction every time; reverse-stepi (xfail:
QEMU 7.2 hangs loading the replay's snapshot); what cannot be recorded is refused with exit status
2 and nothing started. One guest boots (under record) for the module."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import Cli, new_cli
from tests.integration.conftest import qemu_pids_under

OVER_3_MIN = ("one guest recorded through a run (under single-threaded TCG), its replay to the recording's end "
              "(about as long as the recording, a minute here) and two gdb sessions on replays")

NAME = "rr-int"
MARK = "labctl-rr-mark"
LAB = f"""\
name: {NAME}
drops: false
networks:
  lan: {{}}
guests:
  a:
    memory: 384
    cpus: 1
    nics:
      - {{name: eth1, model: e1000, network: lan, ip: 10.79.0.1/24}}
steps:
  - name: mark
    run:
      - {{guest: a, command: "echo '<2>{MARK}' > /dev/kmsg; false"}}
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, image: object) -> Iterator[tuple[Cli, Path]]:
    """The run, recorded; its bundle."""
    cli = new_cli(tmp_path_factory, "rr")
    assert cli.tracked is not None
    cli.tracked.test = "tests/integration/test_record_replay.py (the module's run)"
    d = tmp_path_factory.mktemp("rrlab")
    (d / "rr.yaml").write_text(LAB)
    try:
        res = cli("run", str(d / "rr.yaml"), "--record", "--out", str(d / "runs"), "--json", timeout=1200)
        assert res.returncode == 6, res.stdout + res.stderr  # the step fails: the guest's recording is kept
        bundle = Path(json.loads(res.stdout)["bundle"])
        assert qemu_pids_under(cli.state_dir) == []
        yield cli, bundle
    finally:
        harness.teardown(cli.tracked)


def test_a_failing_guest_keeps_its_recording(recorded: tuple[Cli, Path]) -> None:
    _, bundle = recorded
    rec = bundle / "guests" / "a" / "recording"
    manifest = json.loads((rec / "recording.json").read_text())
    assert manifest["recording"]["bytes"] == (rec / "replay.bin").stat().st_size > 0
    assert manifest["covers"]["instructions"] > 0 and "step mark" in manifest["covers"]["to"]
    assert "rr=record" in " ".join(manifest["argv"]) and "filter-replay,id=rr-mgmt,netdev=mgmt" in manifest["argv"]
    assert (rec / "replay.bin").stat().st_mode & 0o777 == 0o600
    assert MARK in (rec / "console.log").read_text()
    (entry,) = json.loads((bundle / "recordings.json").read_text())["recorded"]
    assert entry["guest"] == "a" and entry["kept"] is True


def test_the_replay_alone_prints_the_console_byte_for_byte(recorded: tuple[Cli, Path], tmp_path: Path) -> None:
    """The boot replays exactly, and most replays here go on through the run's SSH logins to the
    recording's end (the whole console, the step's mark in it); one that stops advancing (seen here
    once in four, on a loaded host: docs/record-replay.md) is said to have diverged (exit 4), never
    passed off as complete."""
    cli, bundle = recorded
    res = cli("replay", str(bundle), "a", "--stall", "60", "--console-out", str(tmp_path / "console"), timeout=2400)
    recorded_console = (bundle / "guests" / "a" / "recording" / "console.log").read_bytes()
    replayed = (tmp_path / "console").read_bytes()
    said = " ".join((res.stdout + res.stderr).split())
    assert b"LABCTL-READY a " in replayed, res.stdout + res.stderr
    assert recorded_console.startswith(replayed)  # byte for byte, as far as it went
    if res.returncode == 0:
        assert replayed == recorded_console and MARK.encode() in replayed
        assert "console identical to the recorded one" in said, said
    else:
        assert res.returncode == 4 and "diverged from its recording" in said, said
        assert replayed != recorded_console and "console DIFFERS" in said, said


def _pcs(text: str) -> list[str]:
    return re.findall(r"0x[0-9a-f]{6,}", text)


def test_gdb_on_the_replay_is_deterministic(recorded: tuple[Cli, Path]) -> None:
    cli, bundle = recorded
    batch = ["hbreak start_kernel", "continue", "stepi 1000", "p/x $pc", "stepi 1000", "p/x $pc"]
    runs = [cli("gdb", "--replay", str(bundle), "a", "--timeout", "600", "--batch", *batch, timeout=900)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "start_kernel" in r.stdout
    assert _pcs(runs[0].stdout) == _pcs(runs[1].stdout) and len(set(_pcs(runs[0].stdout))) >= 2


@pytest.mark.xfail(reason="QEMU 7.2: loading a replay snapshot hangs (QEMU issue 2634), so reverse-stepi "
                          "does not return; see docs/record-replay.md", strict=True)
def test_reverse_stepi_on_the_replay_returns_to_an_earlier_pc(recorded: tuple[Cli, Path]) -> None:
    cli, bundle = recorded
    batch = ["hbreak start_kernel", "continue", "p/x $pc", "stepi 3", "p/x $pc", "reverse-stepi 3", "p/x $pc"]
    r = cli("gdb", "--replay", str(bundle), "a", "--timeout", "60", "--batch", *batch, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    values = re.findall(r"\$\d+ = (0x[0-9a-f]+)", r.stdout)
    assert len(values) == 3 and values[2] == values[0] != values[1]


def test_what_cannot_be_recorded_is_refused_with_nothing_started(tmp_path: Path,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    cli = new_cli(tmp_path_factory, "rrno")
    (tmp_path / "two.yaml").write_text(LAB.replace("cpus: 1", "cpus: 2").replace(NAME, "rr-refused"))
    res = cli("run", str(tmp_path / "two.yaml"), "--record", "--out", str(tmp_path / "runs"), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "guest a cannot be recorded: 2 vCPUs" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists() and qemu_pids_under(cli.state_dir) == []
    kvm = cli("run", str(tmp_path / "two.yaml").replace("two", "two"), "--record", "--accel", "kvm", timeout=120)
    assert kvm.returncode == 2 and "KVM" in kvm.stderr


def test_a_run_without_a_recording_is_refused(recorded: tuple[Cli, Path], tmp_path: Path) -> None:
    cli, bundle = recorded
    res = cli("replay", str(bundle), "nosuch", timeout=60)
    assert res.returncode == 2 and "no recording of guest nosuch" in res.stderr


def test_until_fail_repeats_the_recorded_run_until_one_fails_and_keeps_that_one(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, image: object) -> None:
    """A step that fails one run in two (its guest's own random byte): ``--until-fail 12`` runs until one
    fails (all 12 pass one time in 4,096), keeps that run's bundle with its recording and removes the
    passing runs' (tests/unit/test_record_replay.py has the loop with a planned order)."""
    cli = new_cli(tmp_path_factory, "rruntil")
    flaky = ("b=$(od -An -N1 -tu1 /dev/urandom); echo \"<2>labctl-rr-byte $b\" > /dev/kmsg; "
             "[ $((b % 2)) = 0 ]")
    text = LAB.replace(NAME, "rr-until").replace(f"echo '<2>{MARK}' > /dev/kmsg; false", flaky.replace('"', '\\"'))
    (tmp_path / "until.yaml").write_text(text)
    res = cli("run", str(tmp_path / "until.yaml"), "--record", "--until-fail", "12", "--out", str(tmp_path / "runs"),
              timeout=1800)
    said = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 6, said
    tries = [int(n) for n in re.findall(r"run (\d+) of at most 12", said)]
    assert tries == list(range(1, len(tries) + 1)) and tries, said
    (bundle,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]  # the passing runs' are gone
    rec = bundle / "guests" / "a" / "recording"
    assert (rec / "replay.bin").stat().st_size > 0
    byte = re.findall(r"labctl-rr-byte +(\d+)", (rec / "console.log").read_text())
    assert byte and int(byte[-1]) % 2 == 1, byte  # the kept run is the one whose byte was odd
    assert qemu_pids_under(cli.state_dir) == []
