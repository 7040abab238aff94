"""labctl.mux, the pieces: the socket's path, the ssh command line (pinned host key, no config file,
the kept connection's options), and how a call tells ssh's own failure from the command's exit status
(a stand-in ``ssh`` on PATH plays OpenSSH's part; the real one is tests/integration/test_exec_mux.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from labctl import mux, muxclient
from labctl.endpoint import Endpoint
from labctl.errors import GuestError

FAKE_SSH = """#!/bin/sh
# the stand-in: ssh's own messages go to the -E file; the command is the word after --
log=
while [ $# -gt 0 ]; do
  case "$1" in
    -E) log=$2; shift 2;;
    --) shift; break;;
    *) shift;;
  esac
done
case "$1" in
  refused) echo "ssh: connect to host 127.0.0.1 port 2222: Connection refused" >> "$log"; exit 255;;
  remote255) exit 255;;
  hang) exec sleep 30;;
  held) sleep 30 & exec sleep 30;;  # as ssh's master does: another process keeps the output open
  *) exec sh -c "$1";;
esac
"""


def endpoint(tmp_path: Path) -> Endpoint:
    return Endpoint("g", 2222, tmp_path / "id_ed25519", tmp_path / "known hosts")


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    return gdir


def test_the_socket_is_in_the_guests_directory_named_by_its_port(tmp_path: Path) -> None:
    assert mux.control_path(tmp_path, 2222) == tmp_path / "mux-2222"
    deep = tmp_path / ("d" * (muxclient.MAX_SOCKET_PATH - len(str(tmp_path))))
    assert mux.control_path(deep, 2222) is None  # too long for a unix socket: no kept connection


def test_the_command_line_pins_the_host_key_and_reads_no_config(tmp_path: Path) -> None:
    ep = endpoint(tmp_path)
    argv = mux.ssh_argv(ep, tmp_path / "mux-2222", tmp_path / "log", "echo hi; exit 3")
    assert argv[:4] == ["ssh", "-F", "none", "-T"] and argv[argv.index("-E") + 1] == str(tmp_path / "log")
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert f'UserKnownHostsFile="{tmp_path / "known hosts"}"' in opts and "StrictHostKeyChecking=yes" in opts
    assert {"IdentitiesOnly=yes", "BatchMode=yes", "ControlMaster=auto", f"ControlPersist={mux.PERSIST}",
            f'ControlPath="{tmp_path / "mux-2222"}"', f"ServerAliveInterval={mux.ALIVE_INTERVAL}"} <= set(opts)
    # X25519, not OpenSSH 9.2's sntrup761x25519 (0.14 s more per login under TCG); the guest's sshd
    # takes it (every exec of tests/integration/test_exec_mux.py logs in with it)
    assert "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org" in opts
    assert argv[-3:] == ["root@127.0.0.1", "--", "echo hi; exit 3"]  # one word: the command line as given
    plain = mux.ssh_argv(ep, None, None, "true")
    assert "ControlMaster=no" in plain and "ControlPath=none" in plain and "-E" not in plain


def test_a_call_returns_the_commands_status(fake_ssh: Path, tmp_path: Path) -> None:
    s = mux.MuxSession(endpoint(tmp_path), fake_ssh)
    assert s.call("exit 7", timeout=30) == 7
    assert s.call("remote255", timeout=30) == 255  # the guest's own 255: ssh said nothing
    res = s.run("echo out; echo err >&2; exit 3", timeout=30)
    assert (res.status, res.stdout, res.stderr) == (3, b"out\n", b"err\n")
    assert not [p for p in fake_ssh.iterdir() if p.name.endswith(".log")]  # each call's log is removed


def test_ssh_failing_is_a_guest_error_with_what_it_said(fake_ssh: Path, tmp_path: Path) -> None:
    s = mux.MuxSession(endpoint(tmp_path), fake_ssh)
    with pytest.raises(GuestError, match="cannot run a command on guest g over SSH.*Connection refused"):
        s.call("refused", timeout=30)
    with pytest.raises(GuestError, match="Connection refused"):
        s.run("refused", timeout=30)


def test_a_call_gives_up_when_told_or_at_its_timeout(fake_ssh: Path, tmp_path: Path) -> None:
    s = mux.MuxSession(endpoint(tmp_path), fake_ssh)
    with pytest.raises(GuestError, match="guest crashed"):
        s.call("hang", timeout=60, abort=lambda: "guest crashed")
    with pytest.raises(GuestError, match="no exit status after 1 s"):
        s.call("hang", timeout=1)


HELD = """
import sys
from pathlib import Path
from labctl import mux
from labctl.endpoint import Endpoint
from labctl.errors import GuestError
tmp = Path(sys.argv[1])
s = mux.MuxSession(Endpoint("g", 2222, tmp / "id_ed25519", tmp / "known hosts"), tmp / "guest")
try:
    s.call("held", timeout=1)
except GuestError as exc:
    print(exc.message)
"""


def test_output_held_by_another_process_never_holds_labctls_own(fake_ssh: Path, tmp_path: Path) -> None:
    """ssh hands its client's descriptors to the master, which keeps the error stream open while the
    guest's command runs: labctl's own output must not be those descriptors, or whoever reads it waits
    for the guest (CI's test_security and test_web_class hung 60-120 s on a timed-out exec)."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HELD, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=15)  # EOF on both: nothing else holds them
        assert b"no exit status after 1 s" in out
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_output_is_copied_byte_for_byte(fake_ssh: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    code = HELD.replace('s.call("held", timeout=1)', 's.call("printf \'\\\\377o\'; printf e >&2; exit 4", timeout=30)')
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, capture_output=True, timeout=30)
    assert (res.stdout, res.stderr) == (b"\xffo", b"e")


def test_stream_and_feed_check_the_exit_status(fake_ssh: Path, tmp_path: Path) -> None:
    s = mux.MuxSession(endpoint(tmp_path), fake_ssh)
    with s.stream("printf abc", timeout=30) as f:
        assert f.read() == b"abc"
    with pytest.raises(GuestError, match="exited with status 2: bad"), s.stream("echo bad >&2; exit 2", 30) as f:
        f.read()
    out = tmp_path / "fed"
    with s.feed(f"cat > '{out}'", timeout=30) as w:
        w.write(b"x" * 200_000)
    assert out.read_bytes() == b"x" * 200_000


def test_close_removes_a_socket_no_master_answers(tmp_path: Path) -> None:
    import socket

    gdir = tmp_path / "g"
    gdir.mkdir()
    sock = gdir / "mux-2222"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()  # a stale socket: its master is gone
    (gdir / "console.log").write_text("")
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    mux.close_lab(tmp_path / "nolab")  # no run directory: nothing happens, nothing raised
    mux.close(gdir)
    assert not sock.exists() and (gdir / "console.log").exists()


def test_a_master_that_exited_is_gone_though_nobody_reaped_it(tmp_path: Path) -> None:
    """A master's parent is init, which may take seconds to reap it (1.9 s was seen): its zombie
    holds nothing, so ``close`` does not wait for it; a live process is not gone."""
    import subprocess
    import sys
    import time

    control = tmp_path / "mux-2222"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(control)])
    child = subprocess.Popen(["true", str(control)])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert mux._gone(child.pid, control)  # a zombie, not reaped yet
        while str(control).encode() not in Path(f"/proc/{live.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline  # until it has exec'd sleep
            time.sleep(0.01)
        assert not mux._gone(live.pid, control)
    finally:
        live.kill()
        live.wait()
        child.wait()
