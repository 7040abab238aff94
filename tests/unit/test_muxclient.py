"""labctl.muxclient: OpenSSH's mux protocol spoken by labctl itself on a live master. A stand-in master
on the guest's socket plays OpenSSH's part (byte layout from OpenSSH's PROTOCOL.mux); the real master
is tests/integration/test_exec_mux.py's."""

from __future__ import annotations

import array
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labctl import mux, muxclient
from labctl.endpoint import Endpoint
from labctl.errors import GuestError


def _packet(*words: int, tail: bytes = b"") -> bytes:
    body = struct.pack(f">{len(words)}I", *words) + tail
    return struct.pack(">I", len(body)) + body


def _read_packet(conn: socket.socket) -> bytes:
    size = struct.unpack(">I", _exact(conn, 4))[0]
    return _exact(conn, size)


def _exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the client closed early"
        data += chunk
    return data


def _strings(body: bytes) -> list[bytes]:
    out, i = [], 0
    while i + 4 <= len(body):
        size = struct.unpack(">I", body[i:i + 4])[0]
        out.append(body[i + 4:i + 4 + size])
        i += 4 + size
    return out


class Master:
    """A stand-in ControlMaster: greets, takes one session and its three descriptors, writes
    ``out`` and ``err`` to them, then sends ``status`` (None: closes with no exit message)."""

    def __init__(self, path: Path, out: bytes, err: bytes, status: int | None, refuse: str | None = None) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.out, self.err, self.status, self.refuse = out, err, status, refuse
        self.request: bytes = b""
        self.fds: list[int] = []
        self.done = threading.Event()  # set by the test: the connection stays open until then
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            conn.sendall(_packet(muxclient.HELLO, 4))
            assert _read_packet(conn) == struct.pack(">II", muxclient.HELLO, 4)
            self.request = _read_packet(conn)
            for _ in range(3):  # OpenSSH's master takes the descriptors before it decides
                fds = array.array("i")
                _, anc, _, _ = conn.recvmsg(1, socket.CMSG_LEN(fds.itemsize))
                fds.frombytes(anc[0][2][:fds.itemsize])
                self.fds.append(fds[0])
            if self.refuse is not None:
                conn.sendall(_packet(muxclient.PERMISSION_DENIED, 1, len(self.refuse.encode()),
                                     tail=self.refuse.encode()))
                return
            os.write(self.fds[1], self.out)
            os.write(self.fds[2], self.err)
            for fd in self.fds:
                os.close(fd)
            # the opening and the exit in one write: a quick command's, as a client may read them at once
            conn.sendall(_packet(muxclient.SESSION_OPENED, 1, 9)
                         + (_packet(muxclient.EXIT_MESSAGE, 9, self.status) if self.status is not None else b""))
            if self.status is not None:
                self.done.wait(10)  # the client must not wait for the socket's end once it has the status


def test_the_session_request_has_openssh_layout() -> None:
    """type, request id, reserved string, four flags (no tty, X11, agent, subsystem), no escape
    character, an empty terminal type, the command."""
    pkt = muxclient.new_session_packet(7, "echo hi")
    size, kind, rid = struct.unpack(">III", pkt[:12])
    assert size == len(pkt) - 4 and kind == 0x10000002 and rid == 7
    assert struct.unpack(">I", pkt[12:16])[0] == 0  # reserved, empty
    assert struct.unpack(">5I", pkt[16:36]) == (0, 0, 0, 0, 0xFFFFFFFF)
    assert _strings(pkt[36:]) == [b"", b"echo hi"]


@pytest.mark.parametrize("status", [0, 3, 255])
def test_a_call_on_a_live_master_relays_the_output_and_returns_its_status(
        tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes], status: int) -> None:
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    master = Master(gdir / "mux-2222", b"out \x00\xff bytes\n", b"err\n", status)
    session = mux.MuxSession(Endpoint("g", 2222, tmp_path / "key", tmp_path / "kh"), gdir)
    try:
        assert session.call("cmd 'x'", timeout=3) == status
    finally:
        master.done.set()
    master.thread.join(5)
    captured = capfdbinary.readouterr()
    assert captured.out == b"out \x00\xff bytes\n"  # byte for byte
    assert captured.err == b"err\n"
    assert _strings(master.request[32:]) == [b"", b"cmd 'x'"]


def test_a_master_that_ends_the_session_without_a_status_is_ssh_s_255(tmp_path: Path) -> None:
    """As OpenSSH's client says when its master goes away mid-command."""
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    Master(gdir / "mux-2222", b"", b"", None)
    assert mux.MuxSession(Endpoint("g", 2222, tmp_path / "key", tmp_path / "kh"), gdir).call("x", timeout=10) == 255


def test_a_refused_session_is_an_error_with_the_masters_reason(tmp_path: Path) -> None:
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    Master(gdir / "mux-2222", b"", b"", 0, refuse="too many sessions")
    with pytest.raises(GuestError, match="refused a session: too many sessions"):
        mux.MuxSession(Endpoint("g", 2222, tmp_path / "key", tmp_path / "kh"), gdir).call("x", timeout=10)


def test_no_master_at_the_socket_is_none_and_a_stale_socket_too(tmp_path: Path) -> None:
    """Then the caller starts ssh, which makes the master."""
    assert muxclient.open_session(tmp_path / "mux-1", "x", 0, 1, 2) is None
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "mux-2"))
    stale.close()  # the file stays, nobody listens
    assert muxclient.open_session(tmp_path / "mux-2", "x", 0, 1, 2) is None


def test_a_packet_length_no_master_sends_is_refused(tmp_path: Path) -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(struct.pack(">I", 10 << 20))
        packets = muxclient.Packets(a)  # type: ignore[arg-type]
        with pytest.raises(GuestError, match="packet of"):
            packets.wait()


# --------------------------------------------------------------------------- up's background login (mux.prewarm)

def _logging_in(control: Path, seconds: float) -> subprocess.Popen[bytes]:
    """A stand-in for the ssh that ``up`` left logging in: a process whose title names the socket,
    its pid in the marker beside it."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})", str(control)])
    muxclient.starting_marker(control).write_text(str(proc.pid))
    for _ in range(500):  # until its title is its own (a moment after the start, /proc shows it)
        if muxclient.starting_pid(control) == proc.pid:
            break
        time.sleep(0.01)
    return proc


def test_a_call_while_up_still_logs_in_waits_for_that_master_instead_of_making_one(
        tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """The master answers only once the background login is done: the call waits for it and runs on
    it (without the wait it would find no master, and log in a second time)."""
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    control = gdir / "mux-2222"
    proc = _logging_in(control, 1.2)  # the master answers 0.4 s in, the login ends 0.8 s later (room for a loaded host)
    masters: list[Master] = []
    timer = threading.Timer(0.4, lambda: masters.append(Master(control, b"on it\n", b"", 0)))
    timer.start()
    try:
        started = muxclient.start_on_master(control, "true")
        assert started is not None and proc.poll() is not None  # it waited until the login was done
        assert mux.MuxSession(Endpoint("g", 2222, tmp_path / "key", tmp_path / "kh"), gdir).relay(started, 5, None) == 0
    finally:
        timer.join()
        for m in masters:
            m.done.set()
        proc.kill()
    assert capfdbinary.readouterr().out == b"on it\n"


def test_no_login_under_way_is_no_wait_and_a_stale_marker_neither(tmp_path: Path) -> None:
    """A marker whose process is gone (or is another program now) means nobody is logging in."""
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    control = gdir / "mux-2222"
    assert muxclient.await_master(control) is False
    muxclient.starting_marker(control).write_text(str(os.getpid()))  # alive, but not naming the socket
    assert muxclient.starting_pid(control) is None and muxclient.await_master(control) is False
    assert muxclient.start_on_master(control, "true") is None


def test_close_stops_a_login_still_under_way_and_removes_its_marker(tmp_path: Path) -> None:
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    control = gdir / "mux-2222"
    proc = _logging_in(control, 30)
    assert muxclient.starting_pid(control) == proc.pid
    mux.close(gdir)
    assert proc.wait(5) == -9 and not muxclient.starting_marker(control).exists()


def test_prewarm_starts_ssh_in_the_background_with_the_marker_0600(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``up``'s call: ssh started (its own session, to the background once logged in: -f -N), its pid
    noted beside the socket 0600, and not a second time while it logs in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\nsleep 30\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    gdir = tmp_path / "guest"
    gdir.mkdir(mode=0o700)
    ep = Endpoint("g", 2222, tmp_path / "key", tmp_path / "kh")
    assert mux.prewarm(ep, gdir) is True
    marker = muxclient.starting_marker(gdir / "mux-2222")
    pid = int(marker.read_text())
    try:
        assert marker.stat().st_mode & 0o777 == 0o600 and os.getsid(pid) == pid
        for _ in range(100):
            if (tmp_path / "argv").exists() and muxclient.starting_pid(gdir / "mux-2222") == pid:
                break
            time.sleep(0.05)
        argv = (tmp_path / "argv").read_text().split()
        assert "-f" in argv and "-N" in argv and f'ControlPath="{gdir / "mux-2222"}"' in argv
        assert mux.prewarm(ep, gdir) is False  # one login at a time
    finally:
        mux.close(gdir)
    assert not marker.exists()
