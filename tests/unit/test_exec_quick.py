"""``labctl exec`` on a kept connection sends its command before it loads the rest of labctl
(labctl.cli.exec_cmd.started): the lab's state read from its checked run directory, the command
handed to the guest's master (a stand-in here: tests/unit/test_muxclient.py's), and only then the
parser, the lab state's classes, the logging and the relay. The real master is
tests/integration/test_exec_mux.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.cli import exec_cmd
from tests.unit.test_muxclient import Master

ROOT = Path(__file__).resolve().parents[2]
PORT = 48779  # the fixture's
# What the command waits for when it is sent first: none of these is loaded yet
LATER = ("argparse", "dataclasses", "logging", "labctl.state.runstate", "labctl.mux", "labctl.endpoint",
         "labctl.proc", "rich")


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory with a short path: the guest's socket path must fit a unix socket's (labctl.muxclient)."""
    d = Path(tempfile.mkdtemp(prefix="eq-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _state(base: Path) -> tuple[dict[str, str], Path]:
    """A private state directory with lab ``one`` (tests/fixtures/status/state.json), its guest ``a``'s
    directory and console; the environment that points labctl at it."""
    state = base / "s"
    run = state / "labs" / "one"
    gdir = run / "guests" / "a"
    gdir.mkdir(parents=True)
    for d in (state, state / "labs", run, run / "guests", gdir):
        d.chmod(0o700)
    text = (ROOT / "tests" / "fixtures" / "status" / "state.json").read_text()
    text = text.replace("@RUN@", str(run)).replace("@KERNEL@", str(base / "k")).replace("@IMAGE@", str(base / "i"))
    data = json.loads(text)
    data["owner_pid"] = os.getpid()
    (run / "state.json").write_text(json.dumps(data))
    (gdir / "console.log").write_text("")
    return {**os.environ, "LABCTL_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}, gdir


SNIPPET = """
import json, sys
from labctl.cli import exec_cmd
finish = exec_cmd.started(sys.argv[1:])
loaded = [m for m in {later!r} if m in sys.modules]
print(json.dumps({{"started": finish is not None, "loaded": loaded}}), file=sys.stderr, flush=True)
sys.exit(finish() if finish is not None else 99)
"""


def _run(env: dict[str, str], *words: str) -> subprocess.CompletedProcess[bytes]:
    code = SNIPPET.format(later=LATER)
    return subprocess.run([sys.executable, "-c", code, *words], capture_output=True, env=env, cwd=ROOT,
                          timeout=60, check=False)


def _said(res: subprocess.CompletedProcess[bytes]) -> dict[str, object]:
    line = next(x for x in res.stderr.decode().splitlines() if x.startswith("{"))
    return dict(json.loads(line))


@pytest.mark.parametrize("words", [("--", "echo hi"), ("echo hi",), ("--timeout", "30", "--", "echo hi"),
                                   ("--timeout=30", "echo", "hi")])
def test_the_command_is_on_the_master_before_labctl_loads_the_rest(short: Path, words: tuple[str, ...]) -> None:
    env, gdir = _state(short)
    master = Master(gdir / f"mux-{PORT}", b"hi \xff\n", b"e\n", 4)
    try:
        res = _run(env, "exec", "one", "a", *words)
    finally:
        master.done.set()
    master.thread.join(5)
    said = _said(res)
    assert said == {"started": True, "loaded": []}, (said, res.stderr[-2000:])
    assert res.returncode == 4 and res.stdout == b"hi \xff\n" and res.stderr.endswith(b"}\ne\n"), res
    assert master.request.endswith(b"echo hi")  # one word: the shell line; two: quoted word by word, same here


@pytest.mark.parametrize("words", [
    ("exec", "--timeout", "5", "one", "a", "true"),  # exec's options before LAB: the parser's
    ("exec", "one", "a"),  # no command: the parser says so
    ("exec", "one", "nosuch", "true"),  # no such guest: cmd_exec says which there are
    ("exec", "../one", "a", "true"),  # not a lab name
    ("exec", "one", "a", "--timeout", "x", "true"),  # a bad timeout: split_exec's message, from cmd_exec
])
def test_other_shapes_go_the_usual_way(short: Path, words: tuple[str, ...]) -> None:
    env, gdir = _state(short)
    master = Master(gdir / f"mux-{PORT}", b"", b"", 0)
    try:
        res = _run(env, *words)
    finally:
        master.done.set()
    assert _said(res)["started"] is False and res.returncode == 99, res.stderr[-2000:]
    assert master.request == b""  # nothing was sent


def test_no_master_at_the_socket_goes_the_usual_way(short: Path) -> None:
    env, gdir = _state(short)
    (gdir / f"mux-{PORT}").write_text("")  # a stale socket path: nobody listens
    res = _run(env, "exec", "one", "a", "true")
    assert _said(res)["started"] is False, res.stderr[-2000:]


def test_a_run_directory_of_another_user_or_open_to_others_is_not_trusted(short: Path) -> None:
    env, gdir = _state(short)
    run = gdir.parent.parent
    run.parent.chmod(0o777)  # the labs root writable by anyone: a squatter could have put the lab there
    master = Master(gdir / f"mux-{PORT}", b"", b"", 0)
    try:
        res = _run(env, "exec", "one", "a", "true")
    finally:
        master.done.set()
        run.parent.chmod(0o700)
    assert _said(res)["started"] is False and master.request == b"", res.stderr[-2000:]


def test_started_is_none_for_what_is_not_an_exec() -> None:
    assert exec_cmd.started(["status"]) is None and exec_cmd.started(["exec", "one"]) is None
