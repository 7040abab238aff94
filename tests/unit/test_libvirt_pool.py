"""The labctl pool's refresh waits while libvirt refuses it for a running upload (guests started
side by side on one libvirtd: each uploads its fw_cfg volumes while the other refreshes)."""

from __future__ import annotations

import pytest

from labctl.backends.libvirt import storage

libvirt = pytest.importorskip("libvirt")
BUSY = "internal error: pool 'labctl' has asynchronous jobs running."


class Pool:
    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.calls = 0

    def refresh(self, flags: int) -> None:
        self.calls += 1
        if self.failures:
            # libvirtError takes this thread's last libvirt error over its argument: a real call
            # that failed earlier in this process (another test) would put its words in ours
            libvirt.virResetLastError()
            raise libvirt.libvirtError(self.failures.pop(0))


def test_a_refresh_refused_for_an_upload_is_tried_again() -> None:
    pool = Pool([BUSY, BUSY])
    storage.refresh(pool)
    assert pool.calls == 3


def test_any_other_refusal_is_raised_at_once() -> None:
    pool = Pool(["internal error: cannot open directory"])
    with pytest.raises(libvirt.libvirtError, match="cannot open directory"):
        storage.refresh(pool)
    assert pool.calls == 1


def test_an_upload_that_never_ends_is_waited_for_only_so_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "REFRESH_WAIT", 0.2)
    pool = Pool([BUSY] * 1000)
    with pytest.raises(libvirt.libvirtError, match="asynchronous jobs"):
        storage.refresh(pool)
    assert 1 < pool.calls < 1000
