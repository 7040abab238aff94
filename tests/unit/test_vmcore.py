"""Issue 37 phase 2 without a guest: a drgn check's language and its evaluation (on drgn's own
program of this host's platform, no kernel), the drgn check kind and bisect's --drgn oracle, the
crash watch's decisions on a console it reads (the dump itself stood in for), the report's crashes
section, ``labctl bundle`` leaving vmcores out, QEMU told to pause a panicked guest (not part of
the snapshot key) and ``down`` quitting a paused one at once. Real guests: test_oops_lab.py,
test_drgn.py."""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.errors import LabFileError, UsageError
from labctl.lab import load_lab_text
from labctl.lab.drgnexpr import BadExpression, parse

LAB = ("name: d\nnetworks: {n: {}}\nguests: {a: {nics: [{name: eth1, model: e1000, network: n}]}}\n"
       "checks:\n")


def host_prog() -> Any:
    import drgn

    return drgn.Program(drgn.host_platform)


# --------------------------------------------------------------------------- the language


@pytest.mark.parametrize("text", [
    "prog['init_net'].ipv4.sysctl_ip_default_ttl == 64",
    "netdev_get_by_name(prog['init_net'], 'eth1').qdisc.qstats.drops == 0",
    "sum(1 for dev in for_each_netdev(prog) if dev.flags & 1) >= 2",
    "not any(t.comm.string_().startswith(b'nc') for t in for_each_task(prog))",
    "cast('struct sock *', prog['x']).__sk_common.skc_num == 22",
    "prog.constant('NR_CPUS') if True else 0",
])
def test_what_a_drgn_check_may_say(text: str) -> None:
    parse(text)


@pytest.mark.parametrize("text, says", [
    ("prog.__class__", "the attribute '__class__' is not allowed"),
    ("(lambda: 1)()", "only a function or a method named in the expression can be called"),
    ("2 ** 64", "'**' is not allowed"),
    ("x := 1", "not an expression"),
    ("f'{prog}'", "an f-string is not allowed"),
    ("len(*[1])", "'*' is not allowed"),
    ("max(**{})", "** arguments are not allowed"),
    ("open('/etc/shadow')", "unknown name 'open'"),
    ("netdev_by_name(prog)", "unknown name 'netdev_by_name'"),
    ("import os", "not an expression"),
    ("[x for x.y in prog]", "a comprehension binds names"),
])
def test_what_a_drgn_check_may_not_say(text: str, says: str) -> None:
    with pytest.raises(BadExpression, match=says.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        parse(text)


def test_a_bad_check_is_reported_with_its_line() -> None:
    text = LAB + ("  - {name: ok, guest: a, drgn: \"prog['jiffies'] > 0\"}\n"
                  "  - {name: bad, guest: a, drgn: \"prog.__dict__\"}\n"
                  "  - {name: both, guest: a, command: 'true', drgn: '1'}\n")
    with pytest.raises(LabFileError) as exc:
        load_lab_text(text, "lab.yaml")
    both = ("lab.yaml:7: checks[2]: give one of 'command' (a shell command on the guest) or 'drgn' (an expression on "
            "its kernel), not both")
    assert [str(p) for p in exc.value.problems] == [
        "lab.yaml:6: checks[1].drgn: column 1: the attribute '__dict__' is not allowed", both]
    lab = load_lab_text(LAB + "  - {name: ok, guest: a, drgn: \"prog['jiffies'] > 0\"}\n", "lab.yaml")
    assert lab.checks[0].kind == "drgn" and lab.to_dict()["checks"][0]["kind"] == "drgn"


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("text, value", [
    ("1 + 2 == 3", True),
    ("sum(x for x in [1, 2, 3] if x > 1)", 5),
    ("len([y for y in [1, 2] for z in [3, 4]])", 4),
    ("'ab'.upper().startswith('A') and not 0", True),
    ("sizeof(prog.type('int')) * 2", 8),
    ("3 if 1 < 2 < 3 else 4", 3),
    ("1 < 5 < 3", False),  # a chain false in its last link: each link compares the one before it
    ("5 > 3 > 4", False),
    ("1 < 2 < 3 < 2", False),
    ("3 > 2 > 1", True),
    ("1 == 1 != 2 < 3", True),
])
def test_an_expression_is_walked_to_its_value(text: str, value: object) -> None:
    from labctl.inspect import evaluate

    assert evaluate(host_prog(), text) == value


@pytest.mark.parametrize("text, says", [
    ("(1).bit_length()", "'bit_length' of a int is not allowed"),
    ("prog.read(0, 4)", "'read' of a Program is not allowed"),
    ("'a' * 3", "'*' is for numbers and kernel objects only"),
    ("1 << 100000", "a shift of more than 4096 bits"),
    ("prog['no_such_symbol']", "could not find 'no_such_symbol'"),
    ("max(1)", "TypeError"),
])
def test_what_evaluation_refuses(text: str, says: str) -> None:
    from labctl.inspect import ExprError, evaluate

    with pytest.raises(ExprError, match=says.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        evaluate(host_prog(), text)


def test_the_checks_time_bounds_the_walk() -> None:
    from labctl.inspect import ExprError, evaluate

    with pytest.raises(ExprError) as exc:
        evaluate(host_prog(), "sum(1 for a in [1] * 1 for b in list(range(3)))", time.monotonic() - 1)
    assert not exc.value.timed_out and "unknown name 'range'" in exc.value.message
    big = "[" + ", ".join(["1"] * 40) + "]"
    with pytest.raises(ExprError) as exc:
        evaluate(host_prog(), f"sum(1 for a in {big} for b in {big})", time.monotonic() - 1)
    assert exc.value.timed_out


class _Kernel:
    def __init__(self) -> None:
        self.prog = host_prog()


@pytest.mark.parametrize("text, status, detail", [
    ("1 < 2", "pass", ""),
    ("1 + 1 == 3", "fail", "1 + 1 is 2"),
    ("[]", "fail", "the expression is []"),
    ("prog['nope']", "error", "could not find 'nope'"),
])
def test_the_drgn_kind_judges_the_value(text: str, status: str, detail: str) -> None:
    from labctl.grading import DrgnCheck, GuestChecks
    from labctl.lab import Check

    ctx = GuestChecks(None, "a")  # type: ignore[arg-type]
    ctx._kernel = _Kernel()  # type: ignore[assignment]
    r = DrgnCheck().run(ctx, Check("c", "a", text, kind="drgn"))
    assert (r.status, detail in r.detail) == (status, True), r
    assert r.exit_status is None and (r.summary() == f"fail ({r.detail})" if status == "fail" else True)


def test_bisects_drgn_oracle() -> None:
    import labctl.bisect.oracle as orc

    with pytest.raises(UsageError, match="--drgn: column 1: the attribute '__class__'"):
        orc.make("drgn", command="prog.__class__")
    o = orc.make("drgn", command="prog['x'] == 1", guest="b")
    assert orc.needs_lab_after_steps(o) and "is true on b's kernel" in orc.describe(o)
    passed: Any = {"name": "drgn", "guest": "b", "status": "pass", "passed": True, "exit_status": None, "seconds": 1.0,
              "hint": "", "detail": ""}
    assert orc.judge(o, orc.Evidence(command=passed)).outcome == orc.PASS
    failed: Any = {**passed, "status": "fail", "passed": False, "detail": "prog['x'] is (int)2"}
    j = orc.judge(o, orc.Evidence(command=failed))
    assert j.outcome == orc.FAIL and j.reason == "the expression is false: prog['x'] is (int)2"
    error: Any = {**passed, "status": "error"}
    assert orc.judge(o, orc.Evidence(command=error)).outcome == orc.UNDECIDED


# --------------------------------------------------------------------------- the crash watch


class _State:
    lab, backend = "x", "qemu"

    def __init__(self, console: Path) -> None:
        from labctl.backends import GuestRecord

        self.guests = {"a": GuestRecord(name="a", backend="qemu", pid=1, dir=str(console.parent),
                                        console=str(console), qmp="", ssh_port=22, accel="tcg")}


@pytest.fixture
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    from labctl.inspect import crashwatch

    console = tmp_path / "console.log"
    console.write_bytes(b"[ 1.0] booted\nBUG: an old one, before the watch\n")
    seen: dict[str, Any] = {"state": "running", "taken": [], "stopped": []}
    monkeypatch.setattr(crashwatch, "_run_state", lambda state, guest: seen["state"])
    def capture_crash(state: object, guest: str, where: Path, n: int, **kw: Any) -> dict[str, Any]:
        seen["taken"].append((guest, n, kw["cause"], kw["title"]))
        return {"guest": guest, "cause": kw["cause"], "file": str(where / "vmcore")}

    monkeypatch.setattr(crashwatch, "capture_crash", capture_crash)
    monkeypatch.setattr(crashwatch, "_stop_guest", lambda state, guest: seen["stopped"].append(guest))
    monkeypatch.setattr(crashwatch, "POLL", 0.02)
    monkeypatch.setattr(crashwatch, "SETTLE", 0.2)
    return console, seen


def _append(console: Path, text: str) -> None:
    with console.open("ab") as f:
        f.write(text.encode())


def _wait(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def test_a_panic_is_dumped_once_the_machine_pauses_then_its_qemu_stopped(watched: tuple[Path, dict[str, Any]],
                                                                          tmp_path: Path) -> None:
    from labctl.inspect import CrashWatch

    console, seen = watched
    watch = CrashWatch(_State(console), lambda g: tmp_path / g, when="step s").start()  # type: ignore[arg-type]
    time.sleep(0.1)
    assert seen["taken"] == []  # the crash from before the watch is not this one's
    _append(console, "BUG: kernel NULL pointer dereference, address: 0000000000000000\n#PF: ...\n")
    time.sleep(0.5)
    assert seen["taken"] == []  # no pause yet, and an oops may still become a panic
    seen["state"] = "guest-panicked"
    _wait(lambda: seen["taken"])
    records = watch.stop()
    assert seen["taken"] == [("a", 1, "panic", "BUG: kernel NULL pointer dereference")]
    assert seen["stopped"] == ["a"] and records[0]["file"] == str(tmp_path / "a" / "vmcore")


def test_an_oops_the_guest_survives_is_dumped_once_its_console_is_quiet(watched: tuple[Path, dict[str, Any]],
                                                                      tmp_path: Path) -> None:
    from labctl.inspect import CrashWatch

    console, seen = watched
    watch = CrashWatch(_State(console), lambda g: tmp_path / g).start()  # type: ignore[arg-type]
    _append(console, "Oops: general protection fault, probably for non-canonical address\nRIP: f+0x1\n"
                     "---[ end trace 0000000000000000 ]---\n")
    _wait(lambda: seen["taken"])
    _append(console, "BUG: a second one\n---[ end trace 0000000000000001 ]---\n")
    _wait(lambda: len(seen["taken"]) == 2)
    watch.stop()
    assert [t[1:3] for t in seen["taken"]] == [(1, "oops"), (2, "oops")] and seen["stopped"] == []


def test_a_guest_whose_qemu_ended_at_its_crash_is_recorded_without_a_vmcore(
        watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from labctl.inspect import CrashWatch

    console, seen = watched
    seen["state"] = None
    watch = CrashWatch(_State(console), lambda g: tmp_path / g).start()  # type: ignore[arg-type]
    _append(console, "Kernel panic - not syncing: Fatal exception\n")
    _wait(lambda: watch.records)
    (rec,) = watch.stop()
    assert seen["taken"] == [] and rec["file"] is None and "its QEMU ended at the crash" in rec["error"]


# --------------------------------------------------------------------------- the bundle and the report


def _crash_bundle(root: Path) -> Path:
    from labctl.bundle.layout import MANIFEST, SUMMARY

    b = root / "lab-1"
    (b / "guests" / "v").mkdir(parents=True)
    (b / "guests" / "v" / "vmcore").write_bytes(b"KDUMP   secret memory")
    (b / "guests" / "v" / "vmcore").chmod(0o600)
    (b / "guests" / "v" / "console.log").write_text("boot\n")
    digest = {"tasks": [{"crashed": True, "pid": 0, "comm": "swapper/0", "frames": [
                  {"function": "buggy_nf_count", "source": "buggy_nf.c:45",
                   "locals": {"st": "(struct port_stats *)0x0", "len": "(unsigned int)33"}},
                  {"function": "nf_hook_slow", "source": "", "locals": {
                      "skb": "0xffff (skb len=33 data_len=0 protocol=0x0800 dev=eth1 10.31.0.2:5 > 10.31.0.1:9999 udp)"}}]}],
              "netdevs": [{"name": "eth1", "mtu": 1500, "up": True, "running": True, "carrier": True, "flags": 1,
                           "stats": {"rx_packets": 5, "tx_packets": 3, "rx_dropped": 0, "tx_dropped": 0},
                           "qdisc": {"kind": "fq_codel", "qlen": 0, "drops": 0}}],
              "dmesg": "line one\nBUG: kernel NULL pointer dereference \x1b[2J here"}
    (b / "guests" / "v" / "vmcore.json").write_text(json.dumps(digest))
    rec = {"guest": "v", "cause": "panic", "when": "step trigger", "title": "BUG: kernel NULL pointer dereference",
           "file": "guests/v/vmcore", "summary_file": "guests/v/vmcore.json", "error": None, "size": 21,
           "format": "kdump", "release": "6.1", "build_id": "ab", "ready_after_s": 3.1}
    outside = {**rec, "guest": "w", "file": None, "summary_file": "../../etc/passwd", "error": "no vmcore: gone"}
    (b / MANIFEST).write_text(json.dumps({"lab": {"name": "lab"}, "status": "failed", "vmcores": ["guests/v/vmcore"]}))
    (b / SUMMARY).write_text(json.dumps({"lab": "lab", "status": "failed", "steps": [], "vmcores": [rec, outside]}))
    return b


def test_the_report_shows_drgns_view_of_each_crash(tmp_path: Path) -> None:
    from labctl.report import render_run

    md, html = render_run(_crash_bundle(tmp_path))
    text = md.read_text()
    assert "## Crashes" in text and "### Guest v panicked during step trigger" in text
    assert "#0 buggy_nf_count at buggy_nf.c:45\n     st = (struct port_stats *)0x0\n     len = (unsigned int)33" in text
    assert "10.31.0.2:5 > 10.31.0.1:9999 udp" in text and "| `eth1` | 1500 | UP RUNNING carrier |" in text
    assert "\\x1b[2J" in text and "\x1b" not in text  # the guest's log, its controls escaped
    assert "[`guests/v/vmcore`](guests/v/vmcore)" in text and "secret memory" not in text
    assert "### Guest w panicked" in text and "no vmcore: gone" in text and "root:" not in text
    assert "<pre class=\"text\">" in html.read_text()


def test_bundle_leaves_vmcores_out_unless_asked(tmp_path: Path) -> None:
    from labctl.bundle import pack, vmcores_of

    b = _crash_bundle(tmp_path)
    assert vmcores_of(b) == [Path("guests/v/vmcore")]
    with tarfile.open(pack(b)) as tar:
        names = tar.getnames()
    assert "lab-1/guests/v/console.log" in names and "lab-1/guests/v/vmcore" not in names
    assert "lab-1/guests/v/vmcore.json" in names
    with tarfile.open(pack(b, tmp_path / "with.tar.gz", vmcores=True)) as tar:
        assert "lab-1/guests/v/vmcore" in tar.getnames()


# --------------------------------------------------------------------------- QEMU


def test_qemu_pauses_a_panicked_guest_and_the_snapshot_key_does_not_see_it() -> None:
    from labctl.backends.qemu.argv import PANIC_ACTION
    from labctl.up.snapshots import _without_actions

    assert PANIC_ACTION == ("-action", "panic=pause")
    argv = ["qemu", "-action", "panic=pause", "-m", "512", "-action", "shutdown=poweroff"]
    assert _without_actions(argv) == ["qemu", "-m", "512"]


@pytest.mark.parametrize("status, share, sent", [
    ("running", False, ["SIGTERM"]),  # nothing of it outlives down: no power button (0.3 s under TCG), no QMP
    ("running", True, ["query-status", "system_powerdown", "SIGTERM"]),  # its last writes to the share land
    ("guest-panicked", True, ["query-status", "SIGTERM"]), ("paused", True, ["query-status", "SIGTERM"])])
def test_down_powers_off_only_a_running_guest_with_a_writable_share(monkeypatch: pytest.MonkeyPatch, status: str,
                                                                    share: bool, sent: list[str]) -> None:
    """A panicked or paused guest would never answer the power button; one without a writable share
    leaves nothing on the host for a clean shutdown to save."""
    from labctl.backends import GuestRecord
    from labctl.backends.qemu import machines as qemu_backend

    commands: list[str] = []

    def qmp_execute(qmp: str, command: str, timeout: float = 0) -> dict[str, str]:
        commands.append(command)
        return {"status": status}

    monkeypatch.setattr(qemu_backend, "qmp_execute", qmp_execute)
    b = qemu_backend.QemuBackend()
    monkeypatch.setattr(b, "alive", lambda rec: True)
    monkeypatch.setattr(b, "_wait_gone", lambda rec, timeout: False)  # the power button unanswered
    monkeypatch.setattr(b, "kill", lambda rec: commands.append("SIGTERM"))
    argv = ["qemu", "-fsdev", "local,id=share0,path=/x/share0,security_model=mapped-xattr"] if share else [
        "qemu", "-fsdev", "local,id=share0,path=/srv,security_model=none,readonly=on"]
    b.stop(GuestRecord(name="a", backend="qemu", pid=1, dir="/x", console="", qmp="/x/qmp", ssh_port=1,
                       accel="tcg", argv=argv), 10.0)
    assert commands == sent


