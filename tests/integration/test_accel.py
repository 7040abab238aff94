"""The KVM probe: a real probe boot decides, with one warning on fallback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labctl.backends import accel
from labctl.backends.accel import choose_accel, probe_kvm
from labctl.kernel.cached import Kernel
from tests.integration.conftest import pids_matching


def test_probe_gives_a_verdict_and_cleans_up(kernel: Kernel, tmp_path: object) -> None:
    usable, reason = probe_kvm(kernel.boot, timeout=6)
    assert reason
    # the probe QEMU is gone (matched by its temporary directory: other labs' guests
    # booting the same kernel may be running meanwhile)
    assert pids_matching("qemu-system.*labctl-kvm-") == []
    choice = choose_accel("auto", kernel.boot)
    if usable:
        assert choice.accel == "kvm" and choice.warning is None
    else:
        assert choice.accel == "tcg"
        assert choice.warning and "KVM is not usable" in choice.warning and "--accel tcg" in choice.warning


def test_forced_accelerators_skip_the_probe(kernel: Kernel, monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    """--accel tcg/kvm is taken as asked: no probe QEMU is started, and no cached verdict is read."""
    started: list[object] = []
    monkeypatch.setattr(accel, "spawn_tied", lambda *a, **kw: started.append(a) or pytest.fail("probe started"))
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path))  # an empty cache: no verdict to fall back on
    assert choose_accel("tcg", kernel.boot) == accel.AccelChoice("tcg", None)
    assert choose_accel("kvm", kernel.boot) == accel.AccelChoice("kvm", None)
    assert started == [] and not (tmp_path / "accel-probe.json").exists()
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return  # auto decides without a probe here
    # ... while auto does probe (and caches its verdict), through the very function patched above
    monkeypatch.setattr(accel, "spawn_tied", lambda *a, **kw: started.append(a) or _exited())
    choose_accel("auto", kernel.boot)
    assert len(started) == 1 and (tmp_path / "accel-probe.json").exists()


def _exited() -> object:
    class Exited:
        returncode = 1
        pid = 1 << 30  # no such process: stopping it is a no-op

        def poll(self) -> int:
            return 1

        def wait(self, timeout: float | None = None) -> int:
            return 1

    return Exited()


@pytest.mark.skipif(not os.path.exists("/dev/kvm"), reason="no /dev/kvm on this host")
def test_auto_on_this_host_matches_the_probe(kernel: Kernel) -> None:
    usable, _ = probe_kvm(kernel.boot, timeout=6)
    assert (choose_accel("auto", kernel.boot).accel == "kvm") == usable


def test_doctor_probes_kvm_with_the_images_kernel(cli, image: object, kernel: Kernel) -> None:  # type: ignore[no-untyped-def]
    """``labctl doctor`` gives KVM's verdict from the real probe of the image's default kernel
    (kernels left the image: doctor once asked the image for one and crashed wherever /dev/kvm
    was accessible)."""
    import json

    res = cli("doctor", "--json")
    assert "Traceback" not in res.stderr, res.stderr
    checks = {c["check"]: c for c in json.loads(res.stdout)}
    detail = checks["KVM"]["detail"]
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        assert detail.startswith(("usable", "not usable")), detail
    else:
        assert detail.startswith("no usable /dev/kvm"), detail
