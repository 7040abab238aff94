"""The accelerator of each guest, from its own kernel (labctl.backends.accel with the KVM probe stood
in for), through ``up``'s dry run: a lab whose guests boot two kernels, one of which KVM boots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labctl.backends import accel
from labctl.image.store import Image
from labctl.lab import load_lab_text
from labctl.up import UpOptions, dry_run
from tests.conftest import fake_kernel

LAB = """name: accels
networks: {lan: {}}
guests:
  a:
    nics: [{name: eth1, model: e1000, network: lan}]
  b:
    nics: [{name: eth1, model: e1000, network: lan}]
  c:
    nics: [{name: eth1, model: e1000, network: lan}]
"""


@pytest.fixture
def probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """KVM boots the kernels under ``kvm-*`` only; the kernels probed, in order."""
    seen: list[Path] = []

    def probe(kernel: Path, timeout: float = 0) -> tuple[bool, str]:
        seen.append(kernel)
        return (True, "booted") if kernel.parent.name.startswith("kvm-") else (False, "a probe guest printed nothing")

    monkeypatch.setattr(accel, "probe_kvm", probe)
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    return seen


def test_each_guest_has_the_accelerator_of_its_own_kernel(tmp_path: Path, probes: list[Path]) -> None:
    boots = {"a": tmp_path / "tcg-k" / "boot", "b": tmp_path / "kvm-k" / "boot", "c": tmp_path / "tcg-k" / "boot"}
    got, warnings = accel.choose_accels("auto", boots)
    assert got == {"a": "tcg", "b": "kvm", "c": "tcg"} and probes == [boots["a"], boots["b"]]  # each kernel once
    assert len(warnings) == 1 and "KVM is not usable here (a probe guest printed nothing)" in warnings[0]
    assert accel.lab_accel(got) == "tcg" and accel.lab_accel({"b": "kvm"}) == "kvm"
    assert accel.choose_accels("tcg", boots) == ({"a": "tcg", "b": "tcg", "c": "tcg"}, [])
    # the verdicts are cached per kernel: asking again probes nothing, whichever kernel was probed last
    assert accel.choose_accels("auto", boots)[0] == got and len(probes) == 2
    cached = json.loads((tmp_path / "cache" / "accel-probe.json").read_text())["probes"]
    assert sorted(k.rsplit(":", 1)[1] for k in cached) == sorted(str(b) for b in {boots["a"], boots["b"]})


def test_up_starts_each_guest_under_its_own_kernels_accelerator(tmp_path: Path, probes: list[Path]) -> None:
    lab = load_lab_text(LAB, str(tmp_path / "lab.yaml"))
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": [], "kernel": {"release": "6.1"}})
    img.dir.mkdir()
    img.initramfs_cpio.write_bytes(b"070701")  # the start of a cpio archive: its initrd is made of it
    kernels = {"a": fake_kernel(tmp_path / "tcg-a"), "b": fake_kernel(tmp_path / "kvm-b"),
               "c": fake_kernel(tmp_path / "tcg-a")}
    planned = dry_run(lab, img, kernels, UpOptions(accel="auto"))
    got = {p.name: p.command[p.command.index("-accel") + 1] for p in planned}
    assert got == {"a": "tcg", "b": "kvm", "c": "tcg"}  # not every guest as the first guest's kernel says
