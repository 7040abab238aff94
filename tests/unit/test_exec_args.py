"""``labctl exec LAB GUEST [--timeout S] [--] COMMAND``: what reaches the guest (issue 19, item 10); ``labctl ssh``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from labctl import mux
from labctl.cli import main
from labctl.cli.exec_cmd import DEFAULT_TIMEOUT, split_exec
from labctl.errors import UsageError
from labctl.state import runstate

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Sent:
    """What cmd_exec asked a (fake) SSH session to run."""

    runs: list[tuple[str, float]] = field(default_factory=list)
    endpoint: tuple[str, str] | None = None
    console: Path = Path("/nonexistent/console.log")
    abort: Callable[[], str | None] | None = None


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Sent:
    record = Sent(console=tmp_path / "console.log")

    class Guest:
        console = str(record.console)
        dir = str(tmp_path)

    class State:
        def __init__(self, lab: str) -> None:
            self.lab = lab
            self.guests = {"g": Guest(), "a": Guest()}

        def endpoint(self, guest: str) -> tuple[str, str]:
            record.endpoint = (self.lab, guest)
            return record.endpoint

    class MuxSession:  # the kept connection (labctl.mux): the command's input and output are the user's
        def __init__(self, ep: Any, guest_dir: Path) -> None:
            pass

        def call(self, command: str, timeout: float, abort: Callable[[], str | None]) -> int:
            record.runs.append((command, timeout))
            record.abort = abort
            return 0

    # exec_cmd imports them when it runs (its command line is read before them: exec_cmd.started)
    monkeypatch.setattr(runstate.LabState, "load", staticmethod(State))
    monkeypatch.setattr(mux, "MuxSession", MuxSession)
    return record


def labctl_exec(*words: str) -> int:
    return main(["exec", *words])


def test_timeout_then_double_dash_sends_only_the_command(sent: Sent) -> None:
    """The reproduction: the guest got `--timeout 5 -- echo hi` (bash: --: invalid option)."""
    assert labctl_exec("lab", "a", "--timeout", "5", "--", "echo", "hi") == 0
    assert sent.runs == [("echo hi", 5.0)] and sent.endpoint == ("lab", "a")


@pytest.mark.parametrize(("words", "command", "timeout"), [
    (["--", "echo", "hi"], "echo hi", DEFAULT_TIMEOUT),
    (["echo", "hi"], "echo hi", DEFAULT_TIMEOUT),
    (["--timeout=7", "--", "echo"], "echo", 7.0),
    (["--timeout", "5", "echo", "hi"], "echo hi", 5.0),
    (["ip -br a; echo done"], "ip -br a; echo done", DEFAULT_TIMEOUT),  # one word: a shell command line
    (["--", "grep", "--", "-x", "file"], "grep -- -x file", DEFAULT_TIMEOUT),  # the command's own --
    (["--timeout", "5", "--", "grep", "--", "-x", "f"], "grep -- -x f", 5.0),
    (["--", "--timeout", "5", "x"], "--timeout 5 x", DEFAULT_TIMEOUT),  # after --, the command's words
    (["--", "--", "x"], "-- x", DEFAULT_TIMEOUT),
    (["echo", "--timeout", "3"], "echo --timeout 3", DEFAULT_TIMEOUT),  # after the command's first word too
    (["--", "ls", "-l", "--timeout"], "ls -l --timeout", DEFAULT_TIMEOUT),
    (["--timeoutx"], "--timeoutx", DEFAULT_TIMEOUT),
])
def test_command_forms(sent: Sent, words: list[str], command: str, timeout: float) -> None:
    assert labctl_exec("lab", "a", *words) == 0
    assert sent.runs == [(command, timeout)]


def test_timeout_before_lab_still_works(sent: Sent) -> None:
    assert labctl_exec("--timeout", "9", "lab", "a", "--", "true") == 0
    assert sent.runs == [("true", 9.0)] and sent.endpoint == ("lab", "a")


@pytest.mark.parametrize("words", [
    ["lab", "a"], ["lab", "a", "--"], ["lab", "a", "--timeout"], ["lab", "a", "--timeout", "x", "--", "true"],
    ["lab", "a", "--timeout", "0", "--", "true"], ["lab"], [], ["lab", "--", "true"],
])
def test_usage_errors_exit_2_and_run_nothing(sent: Sent, words: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert labctl_exec(*words) == 2
    assert sent.runs == []
    assert "labctl exec LAB GUEST" in capsys.readouterr().err


def test_split_exec_directly() -> None:
    assert split_exec(["l", "g", "--timeout", "2.5", "--", "a", "--", "b"], 60.0) == ("l", "g", 2.5, ["a", "--", "b"])
    with pytest.raises(UsageError):
        split_exec(["l", "g", "--timeout=", "--", "a"], 60.0)


def test_ssh_puts_openssh_in_labctls_place() -> None:
    """``labctl ssh`` becomes the endpoint's ssh command (labctl.proc.replace_with), same pid; a missing
    program is a HostError (exit 3), not a traceback. (In a child: it replaces the process.)"""
    code = ("import os, sys\n"
            "from labctl.cli import ssh_cmd\n"
            "class E:\n"
            "    def openssh_argv(self): return sys.argv[1:]\n"
            "class S:\n"
            "    def endpoint(self, guest): return E()\n"
            "ssh_cmd.LabState.load = staticmethod(lambda lab: S())\n"
            "from labctl.cli.main import main\n"
            "print(os.getpid(), flush=True)\n"
            "sys.exit(main(['ssh', 'lab', 'a']))\n")
    res = subprocess.run([sys.executable, "-c", code, "sh", "-c", "echo $$ replaced"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, check=False)
    pid, line = res.stdout.splitlines()
    assert res.returncode == 0 and line == f"{pid} replaced", res
    res = subprocess.run([sys.executable, "-c", code, "/nonexistent/ssh"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, check=False)
    assert res.returncode == 3 and "is not installed" in res.stderr and "Traceback" not in res.stderr


def test_exec_gives_up_when_its_guest_crashes(sent: Sent) -> None:
    """A panicked guest's QEMU stays paused (-action panic=pause): the session would wait for it
    forever, so exec watches the guest's console and ends with the reason once it shows a crash."""
    assert main(["exec", "lab", "g", "--", "echo c > /proc/sysrq-trigger"]) == 0
    assert sent.abort is not None and sent.abort() is None  # no console yet, no crash
    sent.console.write_text("[    5.1] eth1: link up\n")
    assert sent.abort() is None
    sent.console.write_text("[    9.8] sysrq: Trigger a crash\n[    9.8] Kernel panic - not syncing: sysrq triggered crash\n")
    why = sent.abort()
    assert why is not None and why.startswith("guest g crashed") and "labctl reset lab g" in why
