"""Whether a guest's QEMU still runs, from /proc alone (labctl.backends.qemu.liveness): a live process
with the guest's QMP socket on its command line is the guest; a reused pid, a zombie or no process is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from labctl.backends.qemu.liveness import alive
from labctl.guestrecord import GuestRecord


def _rec(pid: int, qmp: str) -> GuestRecord:
    return GuestRecord(name="a", backend="qemu", pid=pid, dir="/x", console="/x/console.log", qmp=qmp,
                       ssh_port=2222, accel="tcg")


def _stand_in(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A process whose command line names a QMP socket, as a guest's QEMU does (-qmp unix:...).
    Returned once it runs: Popen returns when exec closed its close-on-exec pipe, which the kernel
    does before it sets up the new argv, so /proc/PID/cmdline can still be empty then (CI saw it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)",
                             f"unix:{tmp_path}/a/qmp.sock"], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_the_guests_own_process_is_alive_and_a_reused_pid_is_not(tmp_path: Path) -> None:
    proc = _stand_in(tmp_path)
    try:
        assert alive(_rec(proc.pid, f"{tmp_path}/a/qmp.sock"))
        assert not alive(_rec(proc.pid, f"{tmp_path}/b/qmp.sock"))  # the pid now runs something else
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_and_a_gone_process_are_not_alive(tmp_path: Path) -> None:
    proc = _stand_in(tmp_path)
    proc.kill()
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # killed, not yet waited for: a zombie
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.01)
    assert not alive(_rec(proc.pid, f"{tmp_path}/a/qmp.sock"))
    proc.wait()
    assert not alive(_rec(proc.pid, f"{tmp_path}/a/qmp.sock"))
