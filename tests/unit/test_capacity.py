"""The capacity estimate: what each guest is counted at, and the refusal (figures are fakes;
tests/integration/test_warm_reset.py refuses a real lab, benchmarks/room.py fills a host)."""

from __future__ import annotations

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
    est = capacity.estimate(_copies(3), _mem(10_000), pages={})
    assert (est.guests, est.restored) == (6, 0)
    assert est.need_mib == 6 * (256 + capacity.QEMU_OVERHEAD_MIB)


def test_a_restored_guest_is_counted_at_its_snapshot_pages_plus_room_to_grow() -> None:
    est = capacity.estimate(_copies(3), _mem(10_000), pages={("room", "a"): 90})
    assert (est.guests, est.restored) == (6, 3)
    assert est.need_mib == 3 * (90 + 64 + 64) + 3 * (256 + 64)
    # never more than its whole memory
    assert capacity.guest_need_mib(256, 250) == 256 + 64


def test_what_cannot_fit_is_refused_with_the_figures() -> None:
    pages = {("room", "a"): 90, ("room", "b"): 90}
    fits = capacity.check_capacity(_copies(36), meminfo_kib=_mem(16_000), pages=pages)
    assert fits.fits and fits.need_mib == 72 * 218
    with pytest.raises(HostError) as err:
        capacity.check_capacity(_copies(37), meminfo_kib=_mem(16_000), pages=pages)
    assert "74 guests need up to" in str(err.value) and "74 of them restored from snapshots" in str(err.value)
    assert capacity.check_capacity(_copies(37), overcommit=True, meminfo_kib=_mem(16_000), pages=pages).fits is False
