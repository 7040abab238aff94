"""Shared test helpers: run the real ``labctl`` CLI in a child process.

Every labctl a test starts gets the signals tests send at their default (a suite started in
the background by a shell without job control inherits SIGINT ignored), every lab a test
brings up is taken down after it whatever its outcome, and the run ends with a check that it
left nothing of its own behind: see ``tests/harness.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import harness, isolation

ROOT = Path(__file__).resolve().parents[1]


_BASELINE: list[harness.Baseline] = []
_ISOLATION: list[isolation.Isolation] = []


def pytest_configure(config: pytest.Config) -> None:
    """Before anything reads a labctl directory: the run's own cache and state (tests/isolation.py)."""
    if not _ISOLATION:
        _ISOLATION.append(isolation.isolate(worker=hasattr(config, "workerinput")))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """--dist loadgroup: a file's tests on one worker, declared groups of files together
    (tests/xdist_groups.py says why pytest-xdist's own does not, under pytest 9)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_groups import FileGroupScheduling

    return FileGroupScheduling(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    _BASELINE.append(harness.begin())


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of what is still set up (an interrupted run)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Check that the run left no lab of its own behind (and say which test made what it left);
    then its cache goes, what a later run can use again kept in the suite's store
    (tests/isolation.py)."""
    try:
        if _BASELINE:
            _check_leftovers(session, _BASELINE[0])
    finally:
        for iso in _ISOLATION:
            isolation.finish(iso)


def _check_leftovers(session: pytest.Session, base: harness.Baseline) -> None:
    """Fixtures have taken their labs down by now (pytest's own teardown runs first, also after
    Ctrl-C): anything of this run still there was left behind; say which test made it, remove it,
    and fail the run."""
    found = harness.leftovers(base)
    if not found:
        return
    lines = ["", "LEFTOVERS: the test run left these behind (removed now):"]
    lines += [f"  {lo.what}  -- made by {lo.test}" for lo in found]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=bool(line.strip()), bold=line.startswith("LEFTOVERS"))
        else:
            print(line, file=sys.stderr)
    harness.clean(found)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@dataclass
class Cli:
    """Runs ``python -m labctl`` with a private state directory."""

    state_dir: Path
    env: dict[str, str]
    tracked: harness.Tracked | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Taken down after the test that made it (the cli fixture's teardown), else at the run's end.
        if self.tracked is None:
            self.tracked = harness.track(self.state_dir, self.env)

    def __call__(self, *args: str, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess[str]:
        assert self.tracked is not None
        self.tracked.note_args(args)
        proc = harness.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"labctl {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """``labctl ARGS`` started with SIGINT, SIGTERM, SIGHUP and SIGQUIT at their default (harness.popen)."""
        assert self.tracked is not None
        self.tracked.note_args(args)
        return harness.popen([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def teardown(self) -> None:
        """Take down every lab of this state directory and whatever still names it (harness.teardown)."""
        assert self.tracked is not None
        harness.teardown(self.tracked)

    @contextlib.contextmanager
    def running(self, *args: str) -> Iterator[subprocess.Popen[str]]:
        """``labctl ARGS`` in the background for the block; killed if it is
        still running when the block ends (a failed wait, an assertion)."""
        proc = self.popen(*args)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def interrupt(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Ctrl-C: SIGINT to ``proc`` (started by ``Cli.popen``/``harness.popen``, so SIGINT is at its
    default there even when this pytest inherited it ignored); its stdout and stderr once it has exited."""
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=timeout)


def new_cli(tmp_path_factory: pytest.TempPathFactory, prefix: str = "st") -> Cli:
    """A ``Cli`` with a new private state directory (a short path: unix socket names must stay
    under 108 bytes)."""
    state = Path(tmp_path_factory.mktemp(prefix, numbered=True))
    env = dict(os.environ)
    env["LABCTL_STATE_DIR"] = str(state)
    env.pop("XDG_RUNTIME_DIR", None)
    return Cli(state, env)


@pytest.fixture
def cli(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """labctl with a private state directory. Afterwards, whatever the test's outcome (a failed
    assertion, a timeout, Ctrl-C), every lab it brought up there is taken down, with those of any
    other ``Cli`` the test made."""
    c = new_cli(tmp_path_factory)
    assert c.tracked is not None
    c.tracked.test = request.node.nodeid
    try:
        yield c
    finally:
        for t in harness.tracked():
            if t is c.tracked or t.test == request.node.nodeid:
                harness.teardown(t, say=lambda line: print(line, file=sys.stderr))  # in the test's report


def fake_kernel(directory: Path, modules: bool = True) -> Any:
    """A prepared kernel's directory with stand-in files (for tests that build command lines)."""
    from labctl.kernel.cached import Kernel

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.json").write_text(
        '{"release": "6.1.0-56-amd64", "source": {"kind": "debian", "release": "6.1.0-56-amd64"}, '
        '"files": {"boot": {"sha256": "' + "a" * 64 + '"}, "modules.img": {"sha256": "' + "c" * 64 + '"}}}')
    (directory / "boot").write_bytes(b"\x7fELF")
    if modules:
        (directory / "modules.img").write_bytes(b"")
    return Kernel.at(directory)


# -- where the time goes: seconds per test file -------------------------------------------------------

#: A test file that takes longer than this says why at its top, in a module-level ``OVER_3_MIN``.
FILE_BUDGET_S = 180.0
_FILE_SECONDS: dict[str, float] = {}
_FILE_TESTS: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration
    if report.when == "call":
        _FILE_TESTS[path] = _FILE_TESTS.get(path, 0) + 1


def _over_budget_reason(path: str) -> str | None:
    import ast

    try:
        tree = ast.parse((ROOT / path).read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "OVER_3_MIN" for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Seconds per test file (setup, call and teardown of its tests; a session fixture counts where
    it was first set up), slowest first; a file over :data:`FILE_BUDGET_S` without its reason is
    flagged."""
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    tr = terminalreporter
    tr.write_sep("=", f"time per test file ({total / 60:.1f} min in {len(_FILE_SECONDS)} files)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        if seconds < 1.0:
            continue
        line = f"{seconds:8.1f} s  {_FILE_TESTS.get(path, 0):4d} tests  {path}"
        if seconds > FILE_BUDGET_S:
            reason = _over_budget_reason(path)
            line += f"  -- over {FILE_BUDGET_S / 60:.0f} min: " + (reason or "NO REASON GIVEN (add OVER_3_MIN at its top)")
            tr.write_line(line, yellow=reason is not None, red=reason is None)
        else:
            tr.write_line(line)


@pytest.fixture(autouse=True)
def _machine_share(request: pytest.FixtureRequest) -> Iterator[None]:
    """With pytest-xdist's workers side by side on this machine's two cores, a test marked
    ``alone`` (its assertions hold only with the host's CPUs to itself: a clock within a second,
    no ping lost during a reset, a throughput threshold) runs with no other test beside it: every
    test holds a shared lock, an ``alone`` one the exclusive lock (a turnstile in front keeps a
    stream of shared holders from starving it). Without workers (one process, or a nested run)
    nothing is locked."""
    if not hasattr(request.config, "workerinput"):
        yield
        return
    import fcntl

    from tests import isolation

    shared = Path(os.environ[isolation.SHARED_ENV])
    alone = request.node.get_closest_marker("alone") is not None
    fds = [os.open(shared / name, os.O_RDWR | os.O_CREAT, 0o600) for name in ("turnstile.lock", "machine.lock")]
    turnstile, machine = fds
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        for fd in fds:
            os.close(fd)
