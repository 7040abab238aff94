"""run_breakpoint_session's control flow against a fake gdb speaking MI (no guest).

The fake answers like gdb 13 did against a real guest (records copied from a
captured session) and logs every command it receives, so the tests can
check that the guest is always left running: breakpoints deleted, target
detached, gdb told to exit, whatever happened.
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.base import GuestRecord
from labctl.debug.gdb import (
    BackendMonitor,
    DebugError,
    GdbSpec,
    MiSession,
    MiTimeout,
    as_monitor,
    ensure_gdbstub_free,
    ensure_resumed,
    gdbstub_clients,
    qmp_running,
    run_breakpoint_session,
)
from labctl.errors import UsageError

FAKE_GDB = r'''
import os, re, sys
mode = os.environ.get("FAKE_GDB_MODE", "hits")
log = open(os.environ["FAKE_GDB_LOG"], "a")
FRAME = ('frame={addr="0xffffffffc0361a20",func="e1000_xmit_frame",args=[{name="skb",value="0xffff88801ef33200"},'
         '{name="netdev",value="0xffff88801fbde000"}],file="drivers/net/ethernet/intel/e1000/e1000_main.c",'
         'fullname="debian/build/build_amd64_none_amd64/drivers/net/ethernet/intel/e1000/e1000_main.c",'
         'line="%d",arch="i386:x86-64"}')
IDLE = ('frame={addr="0xffffffff81a592eb",func="native_safe_halt",args=[],file="arch/x86/include/asm/irqflags.h",'
        'fullname="debian/build/build_amd64_none_amd64/arch/x86/include/asm/irqflags.h",line="52",arch="i386:x86-64"}')
line = 3098
def out(s):
    sys.stdout.write(s + "\n(gdb) \n")
    sys.stdout.flush()
for raw in sys.stdin:
    tok, cmd, rest = re.match(r"(\d*)(\S+)(.*)", raw.strip()).groups()
    log.write(cmd + rest + "\n")
    log.flush()
    if mode == "silent" and cmd != "-gdb-exit":
        continue
    if cmd == "-interpreter-exec" and "target remote" in rest:
        if mode == "refused":
            out(tok + '^error,msg="/x/gdb.sock: Connection refused."')
            continue
        out("*stopped," + IDLE + ',thread-id="1",stopped-threads="all"')
        out(tok + "^done")
    elif cmd == "-break-insert":
        if "nope" in rest:
            out(tok + '^error,msg="Function \\"nope\\" not defined."')
        else:
            out(tok + '^done,bkpt={number="1",type="hw breakpoint",disp="keep",enabled="y",addr="0xffffffffc0361a20",'
                'func="e1000_xmit_frame",file="drivers/net/ethernet/intel/e1000/e1000_main.c",line="3098"}')
    elif cmd == "-exec-continue":
        out(tok + "^running")
        out('*running,thread-id="all"')
        if mode == "hits":
            line = 3098
            out('*stopped,reason="breakpoint-hit",disp="keep",bkptno="1",' + FRAME % line
                + ',thread-id="1",stopped-threads="all"')
    elif cmd in ("-exec-next", "-exec-step", "-exec-next-instruction"):
        out(tok + "^running")
        out('*running,thread-id="all"')
        line += 1
        out('*stopped,reason="end-stepping-range",' + FRAME % line + ',thread-id="1",stopped-threads="all"')
    elif cmd == "-exec-interrupt":
        out(tok + "^done")
        out('*stopped,reason="signal-received",signal-name="SIGINT",signal-meaning="Interrupt",' + IDLE
            + ',thread-id="1",stopped-threads="all"')
    elif cmd == "-data-list-register-names":
        out(tok + '^done,register-names=["rax","rbx","rcx","rdx","rsi","rdi","rbp","rsp","r8","r9","r10","r11",'
            '"r12","r13","r14","r15","rip"]')
    elif cmd == "-data-list-register-values":
        nums = rest.split()[1:]
        out(tok + "^done,register-values=[" + ",".join('{number="%s",value="0x%s"}' % (n, n) for n in nums) + "]")
    elif cmd == "-stack-list-frames":
        out(tok + '^done,stack=[frame={level="0",addr="0xffffffffc0361a20",func="e1000_xmit_frame",'
            'file="drivers/net/ethernet/intel/e1000/e1000_main.c",line="3098"},frame={level="1",'
            'addr="0xffffffff817dcc70",func="dev_hard_start_xmit",file="net/core/dev.c",line="3722"}]')
    elif cmd == "-gdb-exit":
        out(tok + "^exit")
        break
    else:
        out(tok + "^done")
'''


@pytest.fixture
def fake_gdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    script = tmp_path / "fake-gdb"
    script.write_text(f"#!{sys.executable}\n{FAKE_GDB}")
    script.chmod(0o755)
    log = tmp_path / "gdb-commands.log"
    log.touch()
    monkeypatch.setenv("FAKE_GDB_LOG", str(log))
    return str(script), log


def _vmlinux(tmp_path: Path) -> Path:
    v = tmp_path / "vmlinux.debug"
    v.write_bytes(b"\x7fELF")
    return v


def _stub(tmp_path: Path) -> str:
    """A gdbstub socket path nobody listens on (the fake gdb never connects)."""
    return str(tmp_path / "gdb.sock")


def _commands(log: Path) -> list[str]:
    return [line.split(" ", 1)[0] for line in log.read_text().splitlines()]


def _assert_left_running(log: Path) -> None:
    cmds = _commands(log)
    assert "-break-delete" in cmds
    assert cmds[-2:] == ["-target-detach", "-gdb-exit"], cmds


def test_hits_with_steps(fake_gdb: tuple[str, Path], tmp_path: Path) -> None:
    gdb, log = fake_gdb
    spec = GdbSpec("e1000_xmit_frame", hits=2, step=3)
    t = run_breakpoint_session(_stub(tmp_path), _vmlinux(tmp_path), ["add-symbol-file /m/e1000.ko 0x1"], spec,
                               tmp_path / "out", gdb=gdb)
    assert (t.hits, t.timed_out, t.interrupted, t.error) == (2, False, False, None)
    assert [s.kind for s in t.stops] == ["hit", "step", "step", "step"] * 2
    hit = t.hit_stops[0]
    assert hit.frame.func == "e1000_xmit_frame" and hit.frame.line == 3098
    assert [a.name for a in hit.args] == ["skb", "netdev"]
    assert hit.registers == {"rip": "0x16", "rsp": "0x7", "rdi": "0x5", "rsi": "0x4"}
    assert [f.func for f in hit.backtrace] == ["e1000_xmit_frame", "dev_hard_start_xmit"]
    assert [s.frame.line for s in t.stops[1:4]] == [3099, 3100, 3101]
    assert t.message == "breakpoint at e1000_xmit_frame hit 2 times"
    assert t.guest_resumed
    cmds = _commands(log)
    assert cmds.count("-exec-next") == 6
    assert "-break-insert" in cmds and '-h "e1000_xmit_frame"' in log.read_text()
    assert any(c.startswith("-interpreter-exec") for c in cmds)  # the module symbols
    _assert_left_running(log)
    text = (tmp_path / "out" / "gdb-transcript.txt").read_text()
    assert ("hit 1 at e1000_xmit_frame (drivers/net/ethernet/intel/e1000/e1000_main.c:3098) "
            "args: skb=0xffff88801ef33200, netdev=0xffff88801fbde000") in text
    assert (tmp_path / "out" / "gdb-transcript.json").is_file()


def test_instruction_steps_and_no_details(fake_gdb: tuple[str, Path], tmp_path: Path) -> None:
    gdb, log = fake_gdb
    spec = GdbSpec("e1000_xmit_frame", step=1, step_mode="instruction", registers=(), args=False, backtrace=0,
                   hardware=False)
    t = run_breakpoint_session(_stub(tmp_path), _vmlinux(tmp_path), [], spec, tmp_path / "out", gdb=gdb)
    hit = t.hit_stops[0]
    assert hit.args == [] and hit.registers == {} and hit.backtrace == []
    cmds = _commands(log)
    assert "-exec-next-instruction" in cmds
    assert "-stack-list-frames" not in cmds and "-data-list-register-names" not in cmds
    assert '-break-insert "e1000_xmit_frame"' in log.read_text()


def test_never_hit_times_out_with_a_clear_message(fake_gdb: tuple[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gdb, log = fake_gdb
    monkeypatch.setenv("FAKE_GDB_MODE", "nohit")
    t = run_breakpoint_session(_stub(tmp_path), _vmlinux(tmp_path), [], GdbSpec("sysrq_handle_crash", timeout=1),
                               tmp_path / "out", gdb=gdb)
    assert t.timed_out and t.hits == 0
    assert t.message == "breakpoint sysrq_handle_crash was never hit within 1 s"
    assert [s.kind for s in t.stops] == ["interrupt"]
    assert _commands(log).count("-exec-interrupt") == 1
    _assert_left_running(log)
    assert "was never hit within 1 s" in (tmp_path / "out" / "gdb-transcript.txt").read_text()


def test_stop_event_interrupts(fake_gdb: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gdb, log = fake_gdb
    monkeypatch.setenv("FAKE_GDB_MODE", "nohit")
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    t = run_breakpoint_session(_stub(tmp_path), _vmlinux(tmp_path), [], GdbSpec("f", hits=3, timeout=60),
                               tmp_path / "out", stop, gdb=gdb)
    assert t.interrupted and not t.timed_out
    assert t.message == "interrupted after 0 of 3 hits of breakpoint f"
    _assert_left_running(log)


def test_unknown_location_raises_after_cleaning_up(fake_gdb: tuple[str, Path], tmp_path: Path) -> None:
    gdb, log = fake_gdb
    with pytest.raises(DebugError, match='cannot set a breakpoint at nope: gdb: Function "nope" not defined'):
        run_breakpoint_session(_stub(tmp_path), _vmlinux(tmp_path), [], GdbSpec("nope"), tmp_path / "out", gdb=gdb)
    assert _commands(log)[-2:] == ["-target-detach", "-gdb-exit"]
    assert "cannot set a breakpoint at nope" in (tmp_path / "out" / "gdb-transcript.json").read_text()


def test_refused_connection(fake_gdb: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gdb, _ = fake_gdb
    monkeypatch.setenv("FAKE_GDB_MODE", "refused")
    with pytest.raises(DebugError, match="cannot attach to the gdbstub on .*gdb.sock: .*Connection refused"):
        run_breakpoint_session(_stub(tmp_path), _vmlinux(tmp_path), [], GdbSpec("f"), tmp_path / "out", gdb=gdb)


def test_missing_vmlinux(fake_gdb: tuple[str, Path], tmp_path: Path) -> None:
    gdb, log = fake_gdb
    with pytest.raises(DebugError, match="no kernel with debug info"):
        run_breakpoint_session(_stub(tmp_path), tmp_path / "nope", [], GdbSpec("f"), tmp_path / "out", gdb=gdb)
    assert not [c for c in _commands(log) if "target remote" in c]  # never attached, nothing to undo


def test_a_silent_gdb_never_hangs(fake_gdb: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    gdb, _ = fake_gdb
    monkeypatch.setenv("FAKE_GDB_MODE", "silent")
    mi = MiSession(gdb)
    try:
        with pytest.raises(MiTimeout, match="gdb did not answer -target-select within 1 s"):
            mi.command("-target-select remote 127.0.0.1:1", timeout=1)
        assert mi.wait_stopped(0.3) is None
    finally:
        mi.close()
    assert not mi.alive


def test_gdb_that_dies_is_reported(tmp_path: Path) -> None:
    dead = tmp_path / "dead-gdb"
    dead.write_text("#!/bin/sh\necho 'gdb: broken' >&2\nexit 3\n")
    dead.chmod(0o755)
    mi = MiSession(str(dead))
    try:
        with pytest.raises(DebugError, match="gdb exited unexpectedly"):
            mi.command("-gdb-set confirm off", timeout=10)
    finally:
        mi.close()


def test_bad_specs_are_refused() -> None:
    with pytest.raises(UsageError, match="hits=0 .*step=-1 .*step_mode='sideways'"):
        GdbSpec("f", hits=0, step=-1, step_mode="sideways")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="an empty location.*timeout=0"):
        GdbSpec(" ", timeout=0)


def test_no_gdb_binary() -> None:
    with pytest.raises(DebugError, match="cannot start"):
        MiSession("/nonexistent/gdb")


def test_gdbstub_clients_counts_established_connections() -> None:
    table = ("Num       RefCount Protocol Flags    Type St Inode Path\n"
             "0000000000000000: 00000002 00000000 00010000 0001 01 28918 /run/g/gdb.sock\n"  # listening
             "0000000000000000: 00000003 00000000 00000000 0001 03 28920 /run/g/gdb.sock\n"  # accepted
             "0000000000000000: 00000003 00000000 00000000 0001 03 28921 /run/h/gdb.sock\n"  # another guest's
             "0000000000000000: 00000003 00000000 00000000 0001 03 28922\n")  # gdb's end: no path
    assert gdbstub_clients("/run/g/gdb.sock", table) == 1
    assert gdbstub_clients("/run/x/gdb.sock", table) == 0


def test_a_held_gdbstub_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "gdb.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        assert gdbstub_clients(path) == 0
        ensure_gdbstub_free(path)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            conn, _ = server.accept()
            with conn, pytest.raises(DebugError, match="another debugger is attached"):
                ensure_gdbstub_free(path)


def test_ensure_resumed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []
    status = {"running": False}

    def qmp_execute(sock: Any, command: str, args: Any = None, timeout: float = 5.0) -> Any:
        calls.append(command)
        if command == "cont":
            status["running"] = True
            return {}
        return dict(status)

    monkeypatch.setattr("labctl.backends.monitor.qmp_execute", qmp_execute)
    sock = tmp_path / "qmp.sock"
    assert ensure_resumed(None, None, True) is True  # no QMP: trust the detach
    assert ensure_resumed(sock, False, False) is False  # paused before we came: left alone
    assert calls == []
    assert ensure_resumed(sock, True, False) is True
    assert calls == ["query-status", "cont", "query-status"]
    calls.clear()
    assert ensure_resumed(sock, True, True) is True
    assert calls == ["query-status"]



def test_ensure_resumed_goes_through_the_guest_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """libvirt guests have no QMP socket: query-status/cont go through Backend.qmp."""
    calls: list[tuple[str, str]] = []
    status = {"running": False}

    class FakeBackend:
        name = "libvirt"

        def qmp(self, rec: GuestRecord, command: str, args: Any = None) -> Any:
            calls.append((rec.name, command))
            if command == "cont":
                status["running"] = True
                return {}
            return dict(status)

    rec = GuestRecord(name="a", backend="libvirt", pid=0, dir="/x", console="/x/console.log", qmp="",
                      ssh_port=2222, accel="tcg", gdb="/x/gdb.sock", extra={"uri": "qemu:///system"})
    mon = BackendMonitor(FakeBackend(), rec)  # type: ignore[arg-type]
    assert as_monitor(mon) is mon and as_monitor("") is None and as_monitor(None) is None
    assert qmp_running(mon) is False
    assert ensure_resumed(mon, True, False) is True
    assert calls == [("a", "query-status"), ("a", "query-status"), ("a", "cont"), ("a", "query-status")]
