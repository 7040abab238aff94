"""labctl's L2 switch: learning, flooding, and real datagrams between sockets."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from labctl.net.switch import Switch
from tests import harness

A, B, C = (bytes([0x52, 0x54, 0, 0, 0, i]) for i in (1, 2, 3))
BCAST = b"\xff" * 6


def frame(dst: bytes, src: bytes) -> bytes:
    return dst + src + b"\x08\x00" + b"x" * 50


def test_learning_switch_floods_then_forwards(tmp_path: Path) -> None:
    sw = Switch(str(tmp_path / "sw.sock"))
    assert sw.handle(frame(BCAST, A), "pa") == []  # only port known so far
    sw.handle(frame(BCAST, B), "pb")
    sw.handle(frame(BCAST, C), "pc")
    assert sorted(sw.handle(frame(BCAST, A), "pa")) == ["pb", "pc"]
    assert sw.handle(frame(B, A), "pa") == ["pb"]  # learnt
    assert sw.handle(frame(A, A), "pa") == []  # never back out of its port
    assert sw.handle(b"short", "pa") == []


def test_switch_process_forwards_real_datagrams(tmp_path: Path) -> None:
    hub = tmp_path / "sw.sock"
    proc = harness.popen([sys.executable, "-m", "labctl.net.switch", str(hub)])  # it gets SIGTERM
    try:
        for _ in range(100):
            if hub.exists():
                break
            time.sleep(0.05)
        socks = {}
        for name in "abc":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.bind(str(tmp_path / f"{name}.sock"))
            s.settimeout(3)
            socks[name] = s
        for name, mac in zip("abc", (A, B, C)):  # every port introduces itself
            socks[name].sendto(frame(BCAST, mac), str(hub))
        time.sleep(0.2)
        for s in socks.values():  # drain the floods
            s.settimeout(0.2)
            try:
                while s.recv(2048):
                    pass
            except TimeoutError:
                pass
            s.settimeout(3)
        socks["a"].sendto(frame(C, A), str(hub))
        assert socks["c"].recv(2048) == frame(C, A)
        socks["b"].settimeout(0.3)
        try:
            socks["b"].recv(2048)
            raise AssertionError("unicast to C leaked to B")
        except TimeoutError:
            pass
    finally:
        proc.terminate()
        proc.wait(5)
    assert not hub.exists()


def test_a_port_that_stops_reading_never_stalls_the_others(tmp_path: Path) -> None:
    """A guest paused in gdb stops reading its socket: its queue fills, and the
    switch must keep forwarding between the other ports (frames to it are dropped)."""
    sw = Switch(str(tmp_path / "sw.sock"))
    socks = {}
    for name in "abc":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.bind(str(tmp_path / f"{name}.sock"))
        socks[name] = s
    for name, mac in zip("abc", (A, B, C)):
        sw.handle(frame(BCAST, mac), str(tmp_path / f"{name}.sock"))
    stalled = str(tmp_path / "b.sock")  # b never reads
    t0 = time.monotonic()
    for _ in range(2000):  # far more than b's queue holds; a blocking send would hang here
        sw.send(frame(B, A), stalled)
    assert time.monotonic() - t0 < 30  # a generous bound: the hang is what this catches
    sw.send(frame(C, A), str(tmp_path / "c.sock"))
    socks["c"].settimeout(3)
    assert socks["c"].recv(2048) == frame(C, A)
