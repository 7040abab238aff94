"""Post-boot snapshots are pruned without losing one that is in use.

A snapshot's disk is the backing file of every guest restored from it: the
check that a process holds it open runs against a real QEMU here (QEMU's own
image locks), not a stand-in.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.up.snapshots import (
    DISK,
    MEMORY,
    META,
    STATE,
    Snapshot,
    held_open,
    in_use,
    list_all,
    prune,
    prune_older,
    remove_lab,
    snapshots_root,
)
from tests import harness


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path / "state"))
    return snapshots_root()


def fake(root: Path, key: str, lab: str, guest: str, created: str, qcow2: bool = False) -> Snapshot:
    d = root / key
    d.mkdir(parents=True)
    (d / STATE).write_bytes(b"state")
    (d / MEMORY).write_bytes(b"memory")
    if qcow2:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(d / DISK), "16M"], check=True)
    else:
        (d / DISK).write_bytes(b"disk")
    (d / META).write_text(json.dumps({"lab": lab, "guest": guest, "created_at": created}))
    return Snapshot(d)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    """Start a QEMU (no machine, no guest) whose drive is an overlay on a snapshot's disk."""
    procs: list[subprocess.Popen[bytes]] = []

    def hold(snap: Snapshot) -> None:
        overlay = tmp_path / f"overlay-{snap.key}.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(snap.disk), "-F", "qcow2",
                        str(overlay)], check=True)
        p = harness.popen(["qemu-system-x86_64", "-machine", "none", "-nodefaults", "-display", "none",
                           "-drive", f"file={overlay},if=none,id=d0"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # it gets SIGTERM
        procs.append(p)
        deadline = time.monotonic() + 20
        while not held_open(snap):
            assert p.poll() is None and time.monotonic() < deadline, "QEMU did not open the overlay"
            time.sleep(0.05)

    yield hold
    for p in procs:
        p.terminate()
        p.wait(timeout=20)


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_a_snapshot_a_qemu_sits_on_is_held_and_survives_prune(root: Path, holder) -> None:  # type: ignore[no-untyped-def]
    used = fake(root, "a" * 20, "lab", "g", "2026-01-01T00:00:00+00:00", qcow2=True)
    free = fake(root, "b" * 20, "lab", "g", "2026-01-02T00:00:00+00:00", qcow2=True)
    assert not held_open(used)
    holder(used)
    assert held_open(used) and not held_open(free)
    assert in_use(set()) == {used.key}
    assert [s.key for s in prune(set())] == [free.key]
    assert used.complete() and not free.dir.exists()


def test_prune_older_keeps_the_guests_newest_two(root: Path) -> None:
    old = [fake(root, f"{i:020d}", "lab", "g", f"2026-01-0{i}T00:00:00+00:00") for i in range(1, 5)]
    other_guest = fake(root, "c" * 20, "lab", "h", "2026-01-01T00:00:00+00:00")
    other_lab = fake(root, "d" * 20, "other", "g", "2026-01-01T00:00:00+00:00")
    recorded = old[0]  # a lab that is up restored from it
    taken = fake(root, "e" * 20, "lab", "g", "2026-01-09T00:00:00+00:00")
    gone = prune_older(taken, {recorded.key})
    # taken and the newest older one stay; the two in between go; the recorded one stays.
    assert sorted(s.key for s in gone) == sorted([old[1].key, old[2].key])
    left = {s.key for s in list_all()}
    assert left == {taken.key, old[3].key, recorded.key, other_guest.key, other_lab.key}


def test_prune_older_keeps_the_one_just_taken_whatever_its_date(root: Path) -> None:
    newer = [fake(root, f"{i:020d}", "lab", "g", f"2026-02-0{i}T00:00:00+00:00") for i in range(1, 4)]
    taken = fake(root, "e" * 20, "lab", "g", "2026-01-01T00:00:00+00:00")  # a clock set back
    prune_older(taken, set())
    assert {s.key for s in list_all()} == {taken.key, newer[2].key}


def test_prune_older_leaves_snapshots_without_a_lab_alone(root: Path) -> None:
    taken = fake(root, "e" * 20, "", "g", "2026-01-01T00:00:00+00:00")
    fake(root, "f" * 20, "", "g", "2025-01-01T00:00:00+00:00")
    fake(root, "0" * 20, "", "g", "2024-01-01T00:00:00+00:00")
    assert prune_older(taken, set()) == []
    assert len(list_all()) == 3


def test_remove_lab_takes_only_that_labs_snapshots(root: Path) -> None:
    mine = [fake(root, f"{i:020d}", "bench", g, "2026-01-01T00:00:00+00:00") for i, g in enumerate("gh")]
    other = fake(root, "f" * 20, "benchmark", "g", "2026-01-01T00:00:00+00:00")
    assert sorted(s.key for s in remove_lab("bench")) == sorted(s.key for s in mine)
    assert [s.key for s in list_all()] == [other.key]


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_prune_older_never_removes_one_a_qemu_sits_on(root: Path, holder) -> None:  # type: ignore[no-untyped-def]
    """Three older snapshots of the guest: the oldest is held by a running QEMU and survives
    the prune that removes the other one beyond the newest two."""
    taken = fake(root, "a" * 20, "lab", "g", "2026-01-04T00:00:00+00:00", qcow2=True)
    fake(root, "b" * 20, "lab", "g", "2026-01-03T00:00:00+00:00", qcow2=True)
    free = fake(root, "c" * 20, "lab", "g", "2026-01-02T00:00:00+00:00", qcow2=True)
    used = fake(root, "d" * 20, "lab", "g", "2026-01-01T00:00:00+00:00", qcow2=True)
    holder(used)
    gone = prune_older(taken, set())
    assert [s.key for s in gone] == [free.key]
    assert used.dir.is_dir() and not free.dir.exists()


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_remove_lab_never_removes_one_a_qemu_sits_on(root: Path, holder) -> None:  # type: ignore[no-untyped-def]
    used = fake(root, "a" * 20, "bench", "g", "2026-01-01T00:00:00+00:00", qcow2=True)
    free = fake(root, "b" * 20, "bench", "h", "2026-01-01T00:00:00+00:00", qcow2=True)
    holder(used)
    assert [s.key for s in remove_lab("bench")] == [free.key]
    assert used.dir.is_dir() and not free.dir.exists()
