"""``exec`` and ``cp`` over the guest's kept connection (labctl.mux: OpenSSH's ControlMaster), with a
real guest: the master ``up`` made in the background, then one per guest, its socket 0600 and the user's; the exit status, input and output
the guest command's own; a ``reset`` between two execs (the second reaches the reset guest over a new
connection); sshd killed in the guest (a clear error, no hang); ``down`` leaves no socket nor master.

One lab of one small guest for the module; its tests run in this order (the last takes it down).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.proc import pid_alive
from tests import harness
from tests.conftest import Cli, new_cli

ROOT = Path(__file__).resolve().parents[2]
LAB = "muxt"
LAB_YAML = f"""\
name: {LAB}
networks: {{lan: {{}}}}
guests:
  a:
    memory: 384
    nics: [{{name: eth1, model: virtio-net-pci, network: lan, ip: 10.78.0.1/24}}]
"""


@pytest.fixture(scope="module")
def lab(image: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    cli = new_cli(tmp_path_factory, "mux")
    assert cli.tracked is not None
    cli.tracked.test = f"test_exec_mux lab (first used by {harness.current_test()})"
    d = tmp_path_factory.mktemp("muxlab")
    (d / "lab.yaml").write_text(LAB_YAML)
    try:
        up = cli("up", str(d / "lab.yaml"), "--accel", "tcg", timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        yield cli
    finally:
        harness.teardown(cli.tracked)


def guest_dir(cli: Cli) -> Path:
    return cli.state_dir / "labs" / LAB / "guests" / "a"


def sockets(cli: Cli) -> list[Path]:
    d = guest_dir(cli)
    return sorted(p for p in d.iterdir() if p.name.startswith("mux-")) if d.is_dir() else []


def master(sock: Path) -> int | None:
    """The pid of the master at ``sock`` (``ssh -O check``), None when none answers."""
    res = subprocess.run(["ssh", "-F", "none", "-o", f"ControlPath={sock}", "-O", "check", "x"],
                         capture_output=True, text=True, timeout=30, check=False)
    words = (res.stdout + res.stderr).split("pid=")
    return int(words[1].split(")")[0]) if res.returncode == 0 and len(words) > 1 else None


def masters_naming(path: Path) -> list[int]:
    """ssh masters whose title names a file under ``path``: ``ssh: PATH [mux]`` (made by a call), or the
    command line of the ``ssh -f -N`` that ``up`` started (its ControlPath)."""
    return [pid for pid, cmd in harness.processes().items()
            if str(path) in cmd and ("[mux]" in cmd or (cmd.startswith("ssh ") and " -N " in cmd))]


def test_up_leaves_the_kept_connection_made_for_the_first_exec(lab: Cli) -> None:
    """``up`` logs in in the background as it ends (labctl.mux.prewarm): a master answers before any
    exec, and the first exec runs on it rather than logging in again."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (sockets(lab) and master(sockets(lab)[0])):
        time.sleep(0.5)
    (sock,) = sockets(lab)
    pid = master(sock)
    assert pid is not None and masters_naming(lab.state_dir) == [pid]
    assert lab("exec", LAB, "a", "--", "true").returncode == 0
    assert master(sock) == pid and masters_naming(lab.state_dir) == [pid]


def test_one_kept_connection_0600_status_and_bytes_as_the_guests(lab: Cli) -> None:
    first = lab("exec", LAB, "a", "--", "exit 7")
    assert first.returncode == 7, first.stderr
    (sock,) = sockets(lab)
    st = sock.lstat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(sock.parent.stat().st_mode) & 0o077 == 0
    pid = master(sock)
    assert pid is not None
    # input, output and error literal (control bytes included), on the same master
    data = b"\x1b[31mred\x00\xff\n"
    res = subprocess.run([sys.executable, "-m", "labctl", "exec", LAB, "a", "--", "cat; echo E >&2"],
                         input=data, capture_output=True, cwd=ROOT, env=lab.env, timeout=300, check=False)
    assert res.returncode == 0 and res.stdout == data and res.stderr == b"E\n", res
    assert master(sock) == pid and sockets(lab) == [sock]
    # cp goes over it too
    dest = lab.state_dir.parent / "mux-cp"
    dest.mkdir(mode=0o700, exist_ok=True)
    copied = lab("cp", LAB, "a:/etc/hostname", str(dest), "--json")
    assert copied.returncode == 0 and (dest / "hostname").read_text().strip(), copied.stdout + copied.stderr
    assert master(sock) == pid


def test_reset_between_two_execs_reaches_the_reset_guest(lab: Cli) -> None:
    assert lab("exec", LAB, "a", "--", "echo here > /root/marker").returncode == 0
    (sock,) = sockets(lab)
    old = master(sock)
    assert old is not None
    reset = lab("reset", LAB, "a", timeout=600)
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert old not in masters_naming(lab.state_dir)  # reset closed it
    after = lab("exec", LAB, "a", "--", "test ! -e /root/marker && echo fresh")
    assert after.returncode == 0 and after.stdout == "fresh\n", after.stdout + after.stderr
    (sock,) = sockets(lab)
    assert master(sock) not in (None, old)


def test_sshd_killed_in_the_guest_is_a_clear_error_then_reset_brings_it_back(lab: Cli) -> None:
    (sock,) = sockets(lab)
    old = master(sock)
    killed = lab("exec", LAB, "a", "--", "pkill -KILL sshd", timeout=120)
    assert killed.returncode == 255  # its own session went with sshd
    again = lab("exec", LAB, "a", "--", "true", timeout=120)  # a hang fails this (the timeout)
    assert again.returncode == 4, again.stdout + again.stderr
    assert "cannot run a command on guest a over SSH" in again.stderr
    assert old not in masters_naming(lab.state_dir)
    assert lab("reset", LAB, "a", timeout=600).returncode == 0
    assert lab("exec", LAB, "a", "--", "true").returncode == 0


def test_down_leaves_no_socket_and_no_master(lab: Cli) -> None:
    assert lab("exec", LAB, "a", "--", "true").returncode == 0
    (sock,) = sockets(lab)
    pid = master(sock)
    assert pid is not None
    down = lab("down", LAB)
    assert down.returncode == 0, down.stderr
    assert not sock.exists() and not (lab.state_dir / "labs" / LAB).exists()
    # Gone, or a zombie that init has yet to reap (init here reaps orphans ~2 s late): not a master.
    assert masters_naming(lab.state_dir) == [] and not pid_alive(pid)
