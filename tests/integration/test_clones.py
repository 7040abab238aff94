"""Clones, not copies (issue 52), on real guests: one lab of two small guests, two instances, every
restored guest mapping its post-boot snapshot's memory file privately.

* instance 1 boots cold (it saves the snapshots), its guest a is reset (now a clone too), instance 2 is
  up warm: a file written in one clone's tmpfs is in no other clone, nor in a clone restored after it
  (the write never reached the snapshot);
* each clone has its own VM generation ID (QMP says so; the guest's vmgenid driver is bound) and the
  first bytes of its /dev/urandom are its own;
* a reset guest answers and its lab network works; what a clone holds of its own is recorded for
  the capacity estimate;
* the snapshot's memory file truncated: the next restore refuses it with the reason (exit 4), and the
  guest it was to reset is left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.backends import qmp_execute
from labctl.up.snapshots import Snapshot, private_kib, recorded_clone_kib, snapshots_root
from tests import harness
from tests.conftest import Cli, new_cli

NAME = "clones"
LAB = """\
name: clones
networks:
  lan: {}
guests:
  a:
    memory: 192
    nics: [{name: eth1, model: virtio-net-pci, network: lan, ip: 10.152.0.1/24}]
  b:
    memory: 192
    nics: [{name: eth1, model: virtio-net-pci, network: lan, ip: 10.152.0.2/24}]
"""
ONE, TWO = f"{NAME}@1", f"{NAME}@2"


def _state(cli: Cli, lab: str) -> dict:  # type: ignore[type-arg]
    return json.loads((cli.state_dir / "labs" / lab / "state.json").read_text())


@pytest.fixture(scope="module")
def room(tmp_path_factory: pytest.TempPathFactory, image: object) -> Iterator[Cli]:
    """Instance 1 up (cold the first time: it saves the snapshots), its a reset, instance 2 up warm."""
    cli = new_cli(tmp_path_factory, "clones")
    assert cli.tracked is not None
    cli.tracked.test = "tests/integration/test_clones.py (the module's lab)"
    lab = Path(tmp_path_factory.mktemp("clones-lab")) / "clones.yaml"
    lab.write_text(LAB)
    try:
        for instance in ("1", "2"):
            up = cli("up", str(lab), "--instance", instance, timeout=600)
            assert up.returncode == 0, up.stdout + up.stderr
        reset = cli("reset", ONE, "a")
        assert reset.returncode == 0 and "from its post-boot snapshot" in reset.stdout, reset.stdout + reset.stderr
        yield cli
    finally:
        keys = set()
        for lab_name in (ONE, TWO):
            with_state = cli.state_dir / "labs" / lab_name / "state.json"
            if with_state.is_file():
                keys |= set(_state(cli, lab_name).get("snapshots", {}).values())
        harness.teardown(cli.tracked)
        for key in keys:  # the last test breaks them: the next run boots cold and saves new ones
            shutil.rmtree(snapshots_root() / key, ignore_errors=True)


def _sh(cli: Cli, lab: str, guest: str, command: str) -> str:
    res = cli("exec", lab, guest, "--", command, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_a_clones_writes_stay_its_own(room: Cli) -> None:
    cli = room
    for lab in (ONE, TWO):
        st = _state(cli, lab)
        assert "a" in st["warm"], st["warm"]
        link = Path(st["guests"]["a"]["dir"]) / "memory"
        key = st["snapshots"]["a"]
        assert link.is_symlink() and link.resolve() == (snapshots_root() / key / "memory").resolve()
        assert any("share=off" in arg for arg in st["guests"]["a"]["argv"])
    assert _state(cli, ONE)["snapshots"]["a"] == _state(cli, TWO)["snapshots"]["a"]  # one snapshot, two clones
    _sh(cli, ONE, "a", "echo mine > /dev/shm/clone-mark && sync")
    assert _sh(cli, ONE, "a", "cat /dev/shm/clone-mark").split() == ["mine"]
    absent = "test -e /dev/shm/clone-mark && echo present || echo absent"
    assert _sh(cli, TWO, "a", absent).split() == ["absent"]
    # a third clone, restored after the write: the write never reached the snapshot
    reset = cli("reset", TWO, "a")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert _sh(cli, TWO, "a", absent).split() == ["absent"]
    assert _sh(cli, ONE, "a", "cat /dev/shm/clone-mark").split() == ["mine"]


def test_each_clone_has_its_own_generation_id_and_entropy(room: Cli) -> None:
    cli = room
    ids, firsts = set(), set()
    for lab in (ONE, TWO):
        rec = _state(cli, lab)["guests"]["a"]
        ids.add(qmp_execute(rec["qmp"], "query-vm-generation-id")["guid"])
        assert rec["extra"]["vmgenid"] in ids
        out = _sh(cli, lab, "a", "ls /sys/bus/acpi/drivers/vmgenid/; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
        assert "QEMUVGID:00" in out.split(), out  # the guest's driver is bound: it reseeds on a new ID
        firsts.add(out.split()[-1])
    assert len(ids) == 2 and len(firsts) == 2, (ids, firsts)


def test_a_reset_clone_answers_and_its_network_works(room: Cli) -> None:
    cli = room
    reset = cli("reset", TWO, "b")
    assert reset.returncode == 0 and "from its post-boot snapshot" in reset.stdout, reset.stdout + reset.stderr
    assert "ok" in _sh(cli, TWO, "b", "ping -c 1 -W 3 10.152.0.1 >/dev/null && echo ok").split()
    assert "ok" in _sh(cli, TWO, "a", "ping -c 1 -W 3 10.152.0.2 >/dev/null && echo ok").split()
    snap = Snapshot(snapshots_root() / _state(cli, TWO)["snapshots"]["b"])
    assert recorded_clone_kib(snap) > 0  # what a clone holds, for the capacity estimate
    # a clone's own memory is far below its guest's: the snapshot's pages are the file's, shared
    pid = _state(cli, TWO)["guests"]["b"]["pid"]
    assert 0 < private_kib(pid) < 192 * 1024 + 64 * 1024


def test_a_truncated_snapshot_is_refused_at_the_next_restore(room: Cli) -> None:
    cli = room
    st = _state(cli, ONE)
    memory = snapshots_root() / st["snapshots"]["b"] / "memory"
    pid = st["guests"]["b"]["pid"]  # instance 1's b booted cold: it maps a RAM file of its own
    os.truncate(memory, 4096)
    reset = cli("reset", ONE, "b")
    assert reset.returncode == 4, reset.stdout + reset.stderr
    assert "cannot be restored: its memory file" in reset.stderr and "it was truncated" in reset.stderr, reset.stderr
    assert _state(cli, ONE)["guests"]["b"]["pid"] == pid  # refused before anything was stopped
    assert "ok" in _sh(cli, ONE, "b", "echo ok").split()
