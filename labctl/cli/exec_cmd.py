"""``labctl exec LAB GUEST [--timeout S] -- CMD`` (``labctl ssh`` is :mod:`.ssh_cmd`).

It passes the guest command's input and output through byte for byte, as ``ssh`` does:
it is the user's own command's output, not text labctl prints (which is
escaped, see :mod:`labctl.textsafe`). It goes over the guest's kept connection
(OpenSSH's ControlMaster, :mod:`labctl.mux`), and imports neither paramiko nor the
backends (tests/unit/test_cli_budget.py): a command of the quick loop.

When the guest's kept connection is up, ``labctl exec LAB GUEST [--timeout S] [--] CMD`` sends the
command before the rest of labctl is loaded (:func:`started`, which :mod:`.main` asks first, before
its parser): the lab's run directory checked, its ``state.json`` read, the command handed to the
guest's master. What watches the command (the lab's state, a crash on the console, the timeout) and
copies its output loads while the guest runs it. Any other shape of the command line, or no master
answering, goes the usual way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from labctl.errors import LabctlError, UsageError
from labctl.muxclient import Started, command_line, control_path, start_on_master
from labctl.state import STATE, run_dir  # labctl.state.rundir alone (the face loads names when used)

if TYPE_CHECKING:
    import argparse

    from labctl.state import LabState

USAGE = "labctl exec LAB GUEST [--timeout S] [--] COMMAND [ARG...]"
DEFAULT_TIMEOUT = 3600.0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    e = sub.add_parser("exec", help="run a command on a guest; exits with its status", usage=USAGE,
                       description="Runs COMMAND on GUEST over SSH and exits with its status. One word is a "
                                   "shell command line; several are quoted word by word. exec's own options "
                                   "come before COMMAND (or before LAB); after '--' every word is the "
                                   "command's, its own '--' and options included.")
    e.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds before the command is given up on (default {DEFAULT_TIMEOUT:.0f})")
    # LAB GUEST and the command as typed: argparse would drop a '--' that follows GUEST
    # (so that `exec L G -- --timeout 5` lost its meaning); split_exec reads them instead.
    e.add_argument("words", nargs="...", metavar="LAB GUEST [--timeout S] [--] COMMAND [ARG...]")
    e.set_defaults(func=cmd_exec)


def split_exec(words: list[str], timeout: float) -> tuple[str, str, float, list[str]]:
    """``(lab, guest, timeout, command)`` from the words that follow ``labctl exec``.

    The first two are LAB and GUEST. exec's own options (``--timeout S``,
    ``--timeout=S``) are read after them up to the first ``--`` or the first
    word that is not one of them; that ``--`` is dropped and everything after
    it is the command, word for word (its own ``--`` and options included).
    ``timeout`` is what argparse found before LAB (or the default).

    :raise UsageError: for a missing LAB, GUEST or command, or a bad ``--timeout``.
    """
    if len(words) < 2 or any(w.startswith("-") for w in words[:2]):
        raise UsageError("say which lab and guest", hint=USAGE)
    lab, guest, rest = words[0], words[1], words[2:]
    i = 0
    while i < len(rest) and rest[i] != "--" and rest[i].startswith("--timeout"):
        word = rest[i]
        if word == "--timeout":
            if i + 1 >= len(rest):
                raise UsageError("--timeout needs a number of seconds", hint=USAGE)
            value, i = rest[i + 1], i + 2
        elif word.startswith("--timeout="):
            value, i = word.split("=", 1)[1], i + 1
        else:
            break  # --timeoutX: not ours, the command's first word
        try:
            timeout = float(value)
        except ValueError:
            raise UsageError(f"--timeout {value!r}: not a number of seconds", hint=USAGE) from None
    cmd = rest[i:]
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command given", hint=USAGE)
    if not timeout > 0:
        raise UsageError(f"--timeout {timeout:g}: give a positive number of seconds", hint=USAGE)
    return lab, guest, timeout, cmd




def started(argv: Sequence[str]) -> Callable[[], int] | None:
    """``labctl exec LAB GUEST ...`` (``argv``: the words after ``labctl``) started on the guest's
    kept connection, and what finishes it (copies its output, returns its status); None when the
    words are not that (exec's options before LAB, a mistake), the lab or guest is not up, or no
    master answers: then the parser and :func:`cmd_exec` take it, and say what is wrong.

    Trusts what :class:`labctl.state.LabState` does: the run directory checked (this user's, nobody
    else's to write), the guest's directory and port from its ``state.json``.
    """
    if len(argv) < 4 or argv[0] != "exec" or argv[1].startswith("-"):
        return None
    try:
        lab, guest, timeout, cmd = split_exec(list(argv[1:]), DEFAULT_TIMEOUT)
        rec = json.loads((run_dir(lab) / STATE).read_text())["guests"][guest]
        control = control_path(Path(rec["dir"]), int(rec["ssh_port"]))
        begun = start_on_master(control, command_line(cmd)) if control is not None else None
    except (LabctlError, OSError, ValueError, KeyError, TypeError):
        return None
    if begun is None:
        return None
    return lambda: _finish(lab, guest, timeout, begun)


def _finish(lab: str, guest: str, timeout: float, begun: Started) -> int:
    from labctl.mux import MuxSession
    from labctl.state import LabState

    try:
        state = LabState.load(lab)
        session = MuxSession(state.endpoint(guest), Path(state.guests[guest].dir))
    except BaseException:
        begun.session.close()  # the master ends the command's channel, as when an ssh client dies
        raise
    return session.relay(begun, timeout, _crash_watch(state, lab, guest))


def _crash_watch(state: LabState, lab: str, guest: str) -> Callable[[], str | None]:
    from labctl.crashcheck import console_crashed

    console = Path(state.guests[guest].console)

    def crashed() -> str | None:
        # A kernel that panics pauses its QEMU (the vmcore's -action panic=pause): the SSH session
        # would wait forever for a paused guest, so its console decides.
        if not console_crashed(console):
            return None
        return (f"guest {guest} crashed (its console shows the crash): 'labctl status {lab}' says so, "
                f"'labctl dump {lab} {guest}' keeps its memory, 'labctl reset {lab} {guest}' brings it back")

    return crashed


def cmd_exec(args: argparse.Namespace) -> int:
    from labctl.mux import MuxSession
    from labctl.state import LabState

    lab, guest, timeout, cmd = split_exec(args.words, args.timeout)
    state = LabState.load(lab)
    ep = state.endpoint(guest)
    rec = state.guests[guest]
    # The command's own input and output, byte for byte, like ssh: the user asked for it (not escaped).
    return MuxSession(ep, Path(rec.dir)).call(command_line(cmd), timeout=timeout,
                                              abort=_crash_watch(state, lab, guest))
