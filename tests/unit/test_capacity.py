"""The capacity estimate: what each guest is counted at, and the refusal (figures are fakes;
tests/integration/test_warm_reset.py refuses a real lab, benchmarks/room.py fills a host)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labctl.errors import HostError
from labctl.lab import load_lab_text
from labctl.lab.model import Lab
from labctl.up import capacity

LAB = """\
name: room
networks:
  lan: {}
guests:
  a:
    memory: 256
    nics: [{name: eth1, model: e1000, network: lan, ip: 10.70.0.1/24}]
  b:
    memory: 256
    nics: [{name: eth1, model: e1000, network: lan, ip: 10.70.0.2/24}]
"""


@pytest.fixture(autouse=True)
def _no_labs_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path / "state"))


def _copies(n: int) -> list[Lab]:
    lab = load_lab_text(LAB, "room.yaml")
    return [lab.with_instance(str(i)) for i in range(1, n + 1)]


def _mem(mib: int) -> dict[str, int]:
    return {"MemAvailable": mib * 1024}


def test_a_guest_that_boots_is_counted_at_its_whole_memory() -> None:
    est = capacity.estimate(_copies(3), _mem(10_000), clones={})
    assert (est.guests, est.restored) == (6, 0)
    assert est.need_mib == 6 * (256 + capacity.QEMU_OVERHEAD_MIB)


def _clone(key: str, private: int, template: int = 80, measured: bool = True) -> capacity.CloneCost:
    return capacity.CloneCost(key, private, template, measured)


def test_a_clone_is_counted_at_its_measured_private_memory_and_its_template_once() -> None:
    est = capacity.estimate(_copies(3), _mem(10_000), clones={("room", "a"): _clone("ka", 90)})
    assert (est.guests, est.restored, est.templates_mib) == (6, 3, 80)
    # three clones of a: 90 MiB each plus an eighth of 256 to grow; its memory file once; b boots
    assert est.need_mib == 3 * (90 + 32) + 80 + 3 * (256 + 64)
    # two snapshots: two memory files
    both = capacity.estimate(_copies(2), _mem(10_000), clones={("room", "a"): _clone("ka", 90),
                                                              ("room", "b"): _clone("kb", 70, 60)})
    assert both.need_mib == 2 * (90 + 32) + 2 * (70 + 32) + 80 + 60 and both.templates_mib == 140
    # never more than a boot; an unmeasured clone gets a quarter of its memory to grow into
    assert capacity.guest_need_mib(256, _clone("k", 300)) == 256 + 64
    assert capacity.guest_need_mib(256, _clone("k", 65, measured=False)) == 65 + 64


def test_what_cannot_fit_is_refused_with_the_figures() -> None:
    clones = {("room", "a"): _clone("ka", 90), ("room", "b"): _clone("kb", 90)}
    each = 90 + 32
    fits = capacity.check_capacity(_copies(64), meminfo_kib=_mem(16_000), clones=clones)
    assert fits.fits and fits.need_mib == 128 * each + 160
    with pytest.raises(HostError) as err:
        capacity.check_capacity(_copies(65), meminfo_kib=_mem(16_000), clones=clones)
    assert "130 guests need up to" in str(err.value) and "130 of them restored from snapshots" in str(err.value)
    assert capacity.check_capacity(_copies(65), overcommit=True, meminfo_kib=_mem(16_000), clones=clones).fits is False


def test_a_guest_up_is_kept_room_to_grow_by_what_it_holds() -> None:
    assert capacity.reserve_mib(256, 100, capacity.CLONE_GROWTH) == 32
    assert capacity.reserve_mib(256, 100, capacity.GROWTH) == 64
    assert capacity.reserve_mib(256, 300, capacity.GROWTH) == 20  # what is left of memory + QEMU's
    assert capacity.reserve_mib(256, 400, capacity.GROWTH) == 0


def test_clone_costs_come_from_the_snapshot_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from labctl.up.snapshots import (
        CLONES,
        DISK,
        MEMORY,
        META,
        STATE,
        Snapshot,
        private_kib,
        record_clone,
        recorded_clone_kib,
        snapshots_root,
    )

    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    d = snapshots_root() / "k1"
    d.mkdir(parents=True)
    for name in (STATE, DISK):
        (d / name).write_bytes(b"x" * 3000)
    with open(d / MEMORY, "wb") as f:
        f.truncate(256 << 20)
        f.write(b"\1" * (3 << 20))  # 3 MiB of RAM not zero: 3 MiB to map
    (d / META).write_text(json.dumps({"lab": "room", "guest": "a", "state_bytes": 3000}))
    snap = Snapshot(d)
    guess = capacity.clone_costs(running={})[("room", "a")]
    assert guess == _clone("k1", capacity.QEMU_OVERHEAD_MIB + 1, 3, measured=False)
    (d / CLONES).write_text(json.dumps({"private_kib": 50 * 1024}))
    assert capacity.clone_costs(running={})[("room", "a")] == _clone("k1", 50, 3)
    assert capacity.clone_costs(running={"k1": 70})[("room", "a")] == _clone("k1", 70, 3)  # one up now
    (d / CLONES).write_text(json.dumps({"private_kib": 1024}))
    record_clone(snap, os.getpid())  # this process holds more than 1 MiB: recorded
    assert 1024 < recorded_clone_kib(snap) <= private_kib(os.getpid())
