"""The KVM probe: a real probe boot decides, with one warning on fallback."""

from __future__ import annotations

import os

import pytest

from labctl.image.store import Image
from labctl.up.accel import choose_accel, probe_kvm
from tests.integration.conftest import pids_matching


def test_probe_gives_a_verdict_and_cleans_up(image: Image, tmp_path: object) -> None:
    usable, reason = probe_kvm(image.kernel, timeout=6)
    assert reason
    # the probe QEMU is gone (matched by its temporary directory: other labs' guests
    # booting the same kernel may be running meanwhile)
    assert pids_matching("qemu-system.*labctl-kvm-") == []
    choice = choose_accel("auto", image)
    if usable:
        assert choice.accel == "kvm" and choice.warning is None
    else:
        assert choice.accel == "tcg"
        assert choice.warning and "KVM is not usable" in choice.warning and "--accel tcg" in choice.warning


def test_forced_accelerators_skip_the_probe(image: Image) -> None:
    assert choose_accel("tcg", image).accel == "tcg"
    assert choose_accel("kvm", image).accel == "kvm"


@pytest.mark.skipif(not os.path.exists("/dev/kvm"), reason="no /dev/kvm on this host")
def test_auto_on_this_host_matches_the_probe(image: Image) -> None:
    usable, _ = probe_kvm(image.kernel, timeout=6)
    assert (choose_accel("auto", image).accel == "kvm") == usable
