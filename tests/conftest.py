"""Shared test helpers: run the real ``labctl`` CLI in a child process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


SESSION_STARTED = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the post-boot snapshots this run of the suite took (about 90 MB per guest each):
    a machine that runs the suite often would otherwise fill its disk with them. Those that
    were there before the run stay."""
    from labctl.up.snapshots import list_all

    for snap in list_all():
        with contextlib.suppress(OSError):
            if snap.dir.stat().st_mtime >= SESSION_STARTED:
                shutil.rmtree(snap.dir, ignore_errors=True)


@dataclass
class Cli:
    """Runs ``python -m labctl`` with a private state directory."""

    state_dir: Path
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"labctl {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

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
    """Ctrl-C: SIGINT to ``proc``; its stdout and stderr once it has exited."""
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=timeout)


@pytest.fixture
def cli(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    # Short path: unix socket names must stay under 108 bytes.
    state = Path(tmp_path_factory.mktemp("st", numbered=True))
    env = dict(os.environ)
    env["LABCTL_STATE_DIR"] = str(state)
    env.pop("XDG_RUNTIME_DIR", None)
    return Cli(state, env)


def fake_kernel(directory: Path, modules: bool = True) -> Any:
    """A prepared kernel's directory with stand-in files (for tests that build command lines)."""
    from labctl.kernel.store import Kernel

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.json").write_text(
        '{"release": "6.1.0-56-amd64", "source": {"kind": "debian", "release": "6.1.0-56-amd64"}, '
        '"files": {"boot": {"sha256": "' + "a" * 64 + '"}, "modules.img": {"sha256": "' + "c" * 64 + '"}}}')
    (directory / "boot").write_bytes(b"\x7fELF")
    if modules:
        (directory / "modules.img").write_bytes(b"")
    return Kernel.at(directory)
