"""A guest whose SSH port is taken while its QEMU restarts comes back on a new port, and the
files that name its port follow (labctl.training.sshport); the real squat is in
tests/integration/test_port_squat.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.backends.base import GuestRecord
from labctl.errors import MachineError, PortTaken
from labctl.training import sshport

ARGV = ["qemu-system-x86_64", "-netdev", "user,id=mgmt,restrict=on,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:40779-:22",
        "-device", "virtio-net-pci,netdev=mgmt"]


def rec() -> GuestRecord:
    return GuestRecord(name="b", backend="qemu", pid=0, dir="/x", console="/x/console.log", qmp="/x/qmp.sock",
                       ssh_port=40779, accel="tcg", argv=list(ARGV))


class Backend:
    """Restarts fail with PortTaken while their port is in ``taken``."""

    def __init__(self, taken: set[int]) -> None:
        self.taken = taken
        self.started: list[int] = []

    def restart(self, r: GuestRecord, incoming: bool, taps: object = None) -> GuestRecord:
        self.started.append(r.ssh_port)
        assert any(f"hostfwd=tcp:127.0.0.1:{r.ssh_port}-:22" in a for a in r.argv)
        if r.ssh_port in self.taken:
            raise PortTaken(f"QEMU for guest {r.name} exited at start: could not set up host forwarding rule")
        return r


def test_a_free_port_is_kept() -> None:
    b = Backend(set())
    started, old = sshport.restart(b, rec(), True, pick=lambda: 1)  # type: ignore[arg-type]
    assert (started.ssh_port, old, b.started) == (40779, None, [40779])


def test_a_taken_port_moves_the_guest_and_its_command_line() -> None:
    ports = iter([41234, 41235])
    b = Backend({40779, 41234})
    started, old = sshport.restart(b, rec(), True, pick=lambda: next(ports))  # type: ignore[arg-type]
    assert (started.ssh_port, old, b.started) == (41235, 40779, [40779, 41234, 41235])
    assert started.argv[2].endswith("hostfwd=tcp:127.0.0.1:41235-:22") and started.argv[:2] == ARGV[:2]


def test_three_taken_ports_fail_and_other_failures_are_not_retried() -> None:
    ports = iter([2, 3])
    with pytest.raises(PortTaken):
        sshport.restart(Backend({40779, 2, 3}), rec(), True, pick=lambda: next(ports))  # type: ignore[arg-type]

    class Broken(Backend):
        def restart(self, r: GuestRecord, incoming: bool, taps: object = None) -> GuestRecord:
            self.started.append(r.ssh_port)
            raise MachineError("bad option")

    b = Broken(set())
    with pytest.raises(MachineError):
        sshport.restart(b, rec(), True, pick=lambda: 9)  # type: ignore[arg-type]
    assert b.started == [40779]


def test_known_hosts_names_the_new_port_and_the_message_says_it_all(tmp_path: Path) -> None:
    (tmp_path / "known_hosts").write_text("[127.0.0.1]:40778 ssh-ed25519 AAAAa\n[127.0.0.1]:40779 ssh-ed25519 AAAAb\n")
    moved = sshport.repin(tmp_path, "b", 40779, 41234)
    assert (tmp_path / "known_hosts").read_text() == ("[127.0.0.1]:40778 ssh-ed25519 AAAAa\n"
                                                      "[127.0.0.1]:41234 ssh-ed25519 AAAAb\n")
    assert moved.updated == (str(tmp_path / "known_hosts"),) and not moved.failed
    text = sshport.message("lab@alice", moved)
    assert "127.0.0.1:40779 was taken" in text and "now listens on 127.0.0.1:41234" in text
    assert "labctl ssh-config lab@alice" in text


def test_a_record_without_the_rule_is_refused() -> None:
    r = rec()
    r.argv = ["qemu-system-x86_64"]
    with pytest.raises(Exception, match="no hostfwd"):
        sshport.with_port(r, 1)
