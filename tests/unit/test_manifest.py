"""manifest.json written from what the run recorded (labctl.bundle.write): the QEMU versions ``up`` asked
each guest's QEMU once it was up (labctl.backends.running_version), never asked again by the bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from labctl.backends import GuestRecord, running_version
from labctl.bundle.write import write_manifest
from labctl.errors import MachineError
from labctl.lab import load_lab_text
from labctl.state.runstate import LabState

LAB = "name: m\nnetworks: {}\nguests:\n  a: {}\n  b: {}\n"
V8 = "QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0ubuntu1)"


def _state(tmp_path: Path, **recorded: Any) -> LabState:
    recs = {g: GuestRecord(g, "qemu", 0, str(tmp_path / g), "", str(tmp_path / g / "qmp.sock"), 22, "tcg",
                           argv=["qemu-system-x86_64", "-name", g]) for g in "ab"}
    return LabState(lab="m", source=str(tmp_path / "m.yaml"), dir=str(tmp_path), backend="qemu", accel="tcg",
                    image={"name": "debian-12", "key": "k", "dir": str(tmp_path / "img")}, started_at="",
                    guests=recs, **recorded)


@pytest.mark.parametrize("recorded, version, guests", [
    ({"emulators": {"a": V8, "b": V8}, "emulator": "QEMU emulator version 9.0.0"}, V8, {"a": V8, "b": V8}),
    ({"emulators": {"a": V8, "b": "QEMU emulator version 9.0.0"}}, "mixed",
     {"a": V8, "b": "QEMU emulator version 9.0.0"}),
    ({"emulators": {"a": "unknown", "b": "unknown"}, "emulator": V8}, V8, {"a": "unknown", "b": "unknown"}),
    ({}, "unknown", {"a": "unknown", "b": "unknown"}),  # a lab brought up by an older labctl
])
def test_the_manifest_says_the_qemu_versions_up_recorded(tmp_path: Path, recorded: dict[str, Any], version: str,
                                                         guests: dict[str, str]) -> None:
    lab = load_lab_text(LAB, str(tmp_path / "m.yaml"))
    write_manifest(tmp_path, lab, _state(tmp_path, **recorded), "s", "f", [], "ok", None)
    qemu = json.loads((tmp_path / "manifest.json").read_text())["qemu"]
    assert qemu == {"version": version, "guests": guests,
                    "argv": {g: ["qemu-system-x86_64", "-name", g] for g in "ab"}}


class _Backend:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def qmp(self, rec: GuestRecord, command: str) -> Any:
        assert command == "query-version"
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer, says", [
    ({"qemu": {"major": 8, "minor": 2, "micro": 2}, "package": "Debian 1:8.2.2+ds-0ubuntu1"}, V8),
    ({"qemu": {"major": 7, "minor": 2, "micro": 0}, "package": ""}, "QEMU emulator version 7.2.0"),
    (MachineError("the machine is gone"), "unknown"),
    ({"no": "qemu"}, "unknown"),
])
def test_a_running_qemu_says_its_version_as_its_binary_would(tmp_path: Path, answer: Any, says: str) -> None:
    rec = _state(tmp_path).guests["a"]
    assert running_version(_Backend(answer), rec) == says  # type: ignore[arg-type]
