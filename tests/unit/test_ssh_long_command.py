"""A command too long for one argument of execve (sshd hands it to ``sh -c``; Linux takes at most 128 KiB,
MAX_ARG_STRLEN) goes to the guest's shell on its standard input: such a command never ran, and printed
nothing (a follow of labs/vxlan-router.yaml's tunnels: tests/integration/test_tunnels.py, its v6 step)."""

from __future__ import annotations

from pathlib import Path

from labctl import ssh
from labctl.endpoint import Endpoint


class _Chan:
    closed = False

    def __init__(self) -> None:
        self.command = ""
        self.stdin = b""
        self.stdin_closed = False

    def settimeout(self, seconds: float) -> None:
        pass

    def exec_command(self, command: str) -> None:
        self.command = command

    def sendall(self, data: bytes) -> None:
        assert not self.stdin_closed
        self.stdin += data

    def shutdown_write(self) -> None:
        self.stdin_closed = True

    def recv(self, n: int) -> bytes:
        return b""

    def recv_stderr(self, n: int) -> bytes:
        return b""

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return 0

    def close(self) -> None:
        pass


class _Client:
    def __init__(self, chan: _Chan) -> None:
        self.chan = chan

    def get_transport(self) -> _Client:
        return self

    def open_session(self, timeout: float) -> _Chan:
        return self.chan


def _session(chan: _Chan) -> ssh.Session:
    s = ssh.Session.__new__(ssh.Session)  # no connection: the channel is a stand-in
    s.ep = Endpoint("g", 2222, Path("/nonexistent"), Path("/nonexistent"))
    s.client = _Client(chan)  # type: ignore[assignment]
    return s


def test_a_command_over_the_limit_goes_on_standard_input_and_a_short_one_as_the_command() -> None:
    long = "echo " + "x" * (ssh.LONG_COMMAND + 1)
    chan = _Chan()
    assert _session(chan).run(long, timeout=5).status == 0
    assert chan.command == 'eval "$(cat)"' and chan.stdin == long.encode() and chan.stdin_closed
    chan = _Chan()
    _session(chan).run("echo short", timeout=5)
    assert chan.command == "echo short" and chan.stdin == b"" and not chan.stdin_closed
    assert ssh.LONG_COMMAND < 128 * 1024  # under MAX_ARG_STRLEN, with room for what sshd adds
