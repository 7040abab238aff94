"""The steps runner, the bundle writer and the pipeline, with injected guest sessions and backend.

Real guests run these in tests/integration; here every guest command is
answered by a fake session, so that what the runner sends, records, copies
and concludes can be checked exactly.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.base import GuestRecord
from labctl.lab import load_lab_text
from labctl.pipeline import run_steps
from labctl.ssh import Result
from labctl.state.runstate import LabState
from labctl.steps.runner import Runner
from tests.conftest import fake_kernel

LAB = """\
name: unit
networks: {lan: {}}
guests:
  a: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.5.0.1/24}]}
  b: {nics: [{name: eth1, model: virtio, network: lan, ip: 10.5.0.2/24}]}
steps:
  - name: ping
    matrix:
      - {label: small, size: "56"}
      - {label: big, size: "1400"}
    run:
      - {guest: b, command: "sleep 30", background: true, ready_after: 0}
      - {guest: a, command: "ping -c 1 -s {{size}} {{b.eth1.ip}}"}
  - name: after
    run:
      - {guest: a, command: "true"}
"""


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class FakeSession:
    """A guest's SSH session: every command is logged and answered by ``answer``."""

    def __init__(self, guest: str, log: list[tuple[str, str]], answer: Callable[[str, str], int]) -> None:
        self.guest, self.log, self.answer = guest, log, answer

    def run(self, command: str, timeout: float = 60.0, **_kw: Any) -> Result:
        self.log.append((self.guest, command))
        status = self.answer(self.guest, command)
        out = b"perf\ntrace-cmd\nmpstat\nethtool\nnstat\ntimeout\n" if "command -v" in command else b""
        return Result(status, out, b"", 0.01)

    @contextlib.contextmanager
    def stream(self, command: str, timeout: float) -> Iterator[io.BytesIO]:
        self.log.append((self.guest, command))
        step = re.search(r"/tmp/labctl/([\w-]+)", command)
        yield io.BytesIO(_tar({"cmd-0.out": f"{self.guest} {step.group(1) if step else '?'}\n".encode()}))

    def close(self) -> None:
        pass


class FakeBackend:
    name = "qemu"

    def __init__(self) -> None:
        self.dead: set[str] = set()

    def alive(self, rec: GuestRecord) -> bool:
        return rec.name not in self.dead

    def qmp(self, rec: GuestRecord, command: str, args: Any = None) -> Any:
        assert command == "query-version"
        return {"qemu": {"major": 7, "minor": 2, "micro": 22}, "package": "Debian"}


@pytest.fixture
def lab_state(tmp_path: Path) -> tuple[Any, LabState]:
    lab = load_lab_text(LAB, "unit.yaml")
    guests = {}
    for g in lab.guests:
        gdir = tmp_path / "run" / "guests" / g
        gdir.mkdir(parents=True)
        (gdir / "console.log").write_text(f"LABCTL-READY {g} 5.0 eth1=e1000\n")
        guests[g] = GuestRecord(name=g, backend="qemu", pid=1, dir=str(gdir), console=str(gdir / "console.log"),
                                qmp=str(gdir / "qmp.sock"), ssh_port=2200, accel="tcg", argv=["qemu-system-x86_64"])
    image = tmp_path / "image"
    image.mkdir()
    kernel = fake_kernel(tmp_path / "kernel")
    state = LabState(lab="unit", source="unit.yaml", dir=str(tmp_path / "run"), backend="qemu", accel="tcg",
                     image={"name": "debian-12", "key": "k", "dir": str(image)}, started_at="now", guests=guests,
                     kernels={g: str(kernel.dir) for g in guests})
    return lab, state


def _runner(lab: Any, state: LabState, bundle: Path, answer: Callable[[str, str], int],
            backend: FakeBackend | None = None) -> tuple[Runner, list[tuple[str, str]]]:
    log: list[tuple[str, str]] = []
    runner = Runner(lab, state, bundle, connect=lambda g: FakeSession(g, log, answer),  # type: ignore[arg-type, return-value]
                    backend=backend or FakeBackend(), watch_host=False)  # type: ignore[arg-type]
    return runner, log


def test_every_variant_runs_its_commands_and_brings_its_files_home(lab_state: Any, tmp_path: Path) -> None:
    lab, state = lab_state
    runner, log = _runner(lab, state, tmp_path / "bundle", lambda g, c: 0)
    results = runner.run()
    assert [(r.name, r.variant, r.status) for r in results] == [("ping", "small", "ok"), ("ping", "big", "ok"),
                                                                ("after", None, "ok")]
    sent = [c for g, c in log if g == "a"]
    # matrix values and addresses are filled in (shell-quoted), each variant in its own directory
    assert any("ping -c 1 -s 56 10.5.0.2" in c and "/tmp/labctl/ping-small" in c for c in sent)
    assert any("ping -c 1 -s 1400 10.5.0.2" in c and "/tmp/labctl/ping-big" in c for c in sent)
    # the background command runs detached, its status collected at the end of the step
    assert any("setsid timeout" in c and "sleep 30" in c for g, c in log if g == "b")
    # statistics before and after every step, on every guest involved
    assert sum("stats/before" in c for _g, c in log) == sum("stats/after" in c for _g, c in log) == 5
    for variant in ("small", "big"):
        for g in "ab":
            assert (tmp_path / "bundle" / "steps" / "ping" / variant / g / "cmd-0.out").read_text() == \
                f"{g} ping-{variant}\n"
    recorded = [(c["step"], c["variant"], c["guest"], c["status"]) for c in runner.commands]
    assert ("ping", "big", "a", 0) in recorded and ("after", None, "a", 0) in recorded


def test_a_failed_command_fails_its_step_and_skips_the_rest(lab_state: Any, tmp_path: Path) -> None:
    lab, state = lab_state
    runner, _log = _runner(lab, state, tmp_path / "bundle", lambda g, c: 3 if "-s 1400" in c else 0)
    results = runner.run()
    assert [(r.variant or r.name, r.status) for r in results] == [("small", "ok"), ("big", "failed"),
                                                                  ("after", "skipped")]
    assert "exited with status 3" in (results[1].reason or "") and "ping -c 1 -s 1400" in (results[1].reason or "")
    assert results[2].reason == "an earlier step failed"


def test_a_guest_whose_machine_is_gone_is_named(lab_state: Any, tmp_path: Path) -> None:
    lab, state = lab_state
    backend = FakeBackend()

    def answer(guest: str, command: str) -> int:
        if "-s 56" in command:
            backend.dead.add("b")  # b's QEMU exits during the first variant
        return 0

    runner, _log = _runner(lab, state, tmp_path / "bundle", answer, backend)
    first = runner.run()[0]
    assert first.status == "failed"
    assert first.reason == "guest b stopped (its QEMU exited); see guests/b/console.log"


def test_the_pipeline_writes_manifest_summary_and_reports(lab_state: Any, tmp_path: Path) -> None:
    lab, state = lab_state
    state.emulators = {g: "QEMU emulator version 7.2.22 (Debian)" for g in state.guests}  # as up recorded them
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    runner, _log = _runner(lab, state, bundle, lambda g, c: 3 if "-s 1400" in c else 0)
    outcome = run_steps(lab, state, bundle, runner=runner)
    assert outcome.status == "failed" and outcome.reason and outcome.reason.startswith("step ping (big): ")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["lab"]["name"] == "unit"
    assert manifest["qemu"]["version"] == "QEMU emulator version 7.2.22 (Debian)"  # from the state, not asked
    # the image's build has no manifest (removed while the lab was up): still named, and said
    assert manifest["image"] == {"name": "debian-12", "key": "k"}
    assert any("image's manifest could not be read" in w for w in manifest["warnings"])
    assert {(c["variant"], c["status"]) for c in manifest["commands"] if c["guest"] == "a"} >= {("big", 3)}
    summary = json.loads((bundle / "summary.json").read_text())
    assert [(s["name"], s["variant"], s["status"]) for s in summary["steps"]] == [
        ("ping", "small", "ok"), ("ping", "big", "failed"), ("after", None, "skipped")]
    assert set(summary["steps"][0]["guests"]) == {"a", "b"}  # figures computed from the copied files
    assert (bundle / "lab.yaml").read_text() == LAB
    assert (bundle / "guests" / "a" / "console.log").is_file()
    assert [p.name for p in outcome.reports] == ["report.md", "report.html"]
    assert "exited with status 3" in (bundle / "report.md").read_text()


def test_ctrl_c_still_writes_the_bundle_then_is_raised(lab_state: Any, tmp_path: Path) -> None:
    lab, state = lab_state
    bundle = tmp_path / "bundle"
    bundle.mkdir()

    def answer(guest: str, command: str) -> int:
        if "-s 1400" in command:
            raise KeyboardInterrupt
        return 0

    runner, _log = _runner(lab, state, bundle, answer)
    with pytest.raises(KeyboardInterrupt):
        run_steps(lab, state, bundle, runner=runner)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["reason"] == "interrupted (Ctrl-C)"
    summary = json.loads((bundle / "summary.json").read_text())
    assert [s["status"] for s in summary["steps"]] == ["ok", "failed"]
    assert (bundle / "steps" / "ping" / "big" / "a" / "cmd-0.out").is_file()  # the interrupted step's files
    assert (bundle / "report.html").is_file()


REPEATED = LAB.replace("  - name: after\n", "  - name: after\n    repeat: 3\n")


def test_a_repeated_step_runs_each_time_in_its_own_directory(lab_state: Any, tmp_path: Path) -> None:
    _, state = lab_state
    lab = load_lab_text(REPEATED, "unit.yaml")
    runner, log = _runner(lab, state, tmp_path / "bundle", lambda g, c: 0)
    results = runner.run()
    after = [r for r in results if r.name == "after"]
    assert [(r.repeat, r.repeats, r.dir) for r in after] == [
        (1, 3, "steps/after/_"), (2, 3, "steps/after/_@2"), (3, 3, "steps/after/_@3")]
    assert all(r.status == "ok" for r in results)
    assert [r.repeat for r in results if r.name == "ping"] == [1, 1]
    workdirs = {m.group(0) for _g, c in log for m in [re.search(r"/tmp/labctl/after[\w@-]*", c)] if m}
    assert workdirs == {"/tmp/labctl/after-_", "/tmp/labctl/after-_-r2", "/tmp/labctl/after-_-r3"}
    for d in ("_", "_@2", "_@3"):
        assert (tmp_path / "bundle" / "steps" / "after" / d / "a" / "cmd-0.out").is_file()


def test_the_window_opens_after_the_tracers_and_closes_after_the_commands(lab_state: Any, tmp_path: Path) -> None:
    lab, state = lab_state
    runner, log = _runner(lab, state, tmp_path / "bundle", lambda g, c: 0)
    runner.run()
    a = [c for g, c in log if g == "a" and "/tmp/labctl/ping-small" in c]
    start = next(i for i, c in enumerate(a) if "window-stat-start.txt" in c)
    end = next(i for i, c in enumerate(a) if "window-stat-end.txt" in c)
    command = next(i for i, c in enumerate(a) if "ping -c 1" in c)
    before = next(i for i, c in enumerate(a) if "stats/before" in c)
    after = next(i for i, c in enumerate(a) if "stats/after" in c)
    assert before < start < command < end < after
    assert all(r.window_s is not None and r.window_s >= 0 for r in runner.results)


NET_LAB = """\
name: unet
networks: {lan: {capture: [b.eth1]}}
guests:
  a: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.5.0.1/24, impair: {delay: 5ms}}]}
  b: {nics: [{name: eth1, model: virtio, network: lan, ip: 10.5.0.2/24}]}
steps:
  - name: lossy
    matrix: [{label: p10, loss: 10%}]
    impair: {a.eth1: {loss: "{{loss}}"}}
    run:
      - {guest: a, command: "ping -c 1 {{b.eth1.ip}}"}
      - {link: a.eth1, state: down}
      - {guest: a, command: "true"}
"""


class FakeQemu(FakeBackend):
    """QMP of guests booted 100 s ago: filter-dump writes two frames (0.1 and 0.2 s after it is added)
    stamped as QEMU 7.2 does, and the monitor reads the PM timer and the HPET."""

    def __init__(self, capture_dir: Path) -> None:
        super().__init__()
        import time

        self.dir, self.calls, self.origin = capture_dir, [], time.time() - 100.0
        self.frame_times: list[float] = []

    def capture_dir(self, rec: GuestRecord) -> Path:
        return self.dir

    def qemu_log(self, rec: GuestRecord) -> Path | None:
        return None

    def qmp(self, rec: GuestRecord, command: str, args: Any = None) -> Any:
        import struct
        import time

        from labctl.net.vmclock import HPET_HZ, PM_TIMER_HZ, PM_TIMER_WRAP

        self.calls.append((rec.name, command, args))
        now = time.time()
        if command == "object-add":
            start_ts = int(time.mktime(time.gmtime(int(now))))
            frames = b""
            for delay in (0.1, 0.2):
                raw = start_ts * 1_000_000 + round((now + delay - self.origin) * 1e6)
                frames += struct.pack("<IIII", raw // 1_000_000, raw % 1_000_000, 60, 60) + bytes(60)
                self.frame_times.append(now + delay)
            Path(args["file"]).write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + frames)
            return {}
        if command == "human-monitor-command":
            vm = now - self.origin
            if args["command-line"].startswith("i "):
                return f"portl[0x0608] = {round(vm * PM_TIMER_HZ) % PM_TIMER_WRAP:#010x}\r\n"
            return f"00000000fed000f0: {round((vm - 0.9) * HPET_HZ):#018x}\r\n"
        if command in ("object-del", "set_link"):
            return {}
        return super().qmp(rec, command, args)


def test_a_step_impairs_captures_and_takes_a_link_down_then_puts_everything_back(tmp_path: Path) -> None:
    from labctl.net.pcap import read_pcapng
    from labctl.state.netstate import load, update

    lab = load_lab_text(NET_LAB, "unet.yaml")
    run_dir = tmp_path / "run"
    guests = {g: GuestRecord(name=g, backend="qemu", pid=1, dir=str(run_dir / g), console=str(run_dir / g / "c"),
                             qmp="", ssh_port=2200, accel="tcg") for g in lab.guests}
    for g in guests:
        (run_dir / g).mkdir(parents=True)
        (run_dir / g / "c").write_text("")
    state = LabState(lab="unet", source="unet.yaml", dir=str(run_dir), backend="qemu", accel="tcg", image={},
                     started_at="now", guests=guests, resolved=lab.to_dict())
    with update(run_dir) as record:  # what up put in force: the lab file's delay
        record.set_impairment("a", "eth1", lab.guests["a"].nic("eth1").impair)
    backend = FakeQemu(tmp_path / "qemu")
    backend.dir.mkdir()
    runner, log = _runner(lab, state, tmp_path / "bundle", lambda g, c: 0, backend)
    (result,) = runner.run()
    assert result.status == "ok", result.reason

    a = [c for g, c in log if g == "a"]
    first_ping = next(i for i, c in enumerate(a) if "ping -c 1 10.5.0.2" in c)
    assert a.index("tc qdisc replace dev eth1 root netem loss 10%") < first_ping  # in force for the commands
    tc = [i for i, c in enumerate(a) if c.startswith("tc qdisc")]
    assert a[tc[-1]] == "tc qdisc replace dev eth1 root netem delay 5ms"  # the lab file's put back ...
    assert "stats/after" in a[tc[-1] - 1]  # ... once the step's figures are taken
    links = [(g, args) for g, cmd, args in backend.calls if cmd == "set_link"]
    assert links == [("a", {"name": "lab0", "up": False}), ("a", {"name": "lab0", "up": True})]
    assert [c["command"] for c in runner.commands] == ["ping -c 1 10.5.0.2", "labctl link unet a eth1 down", "true"]
    assert result.records["network"] == {"impair": {"a.eth1": {"loss": "10%"}}, "links": {"a.eth1": "down"}}
    after = load(run_dir)
    assert after.impair == {"a.eth1": {"delay": "5ms"}} and after.links == {}

    # b.eth1 was captured (the network's capture), its frames moved to real time; QEMU's filter removed.
    (cap,) = result.records["captures"]  # type: ignore[misc]
    assert (cap["guest"], cap["nic"], cap["frames"], cap["calibrated"]) == ("b", "eth1", 2, True)
    frames = list(read_pcapng(tmp_path / "bundle" / cap["file"]))
    assert [f.interface for f in frames] == ["b.eth1"] * 2
    for f, real in zip(frames, backend.frame_times, strict=True):
        assert abs(f.ts_us / 1e6 - real) < 0.005
    added = [args["id"] for g, cmd, args in backend.calls if cmd == "object-add"]
    assert [args["id"] for g, cmd, args in backend.calls if cmd == "object-del"] == added
    assert list(backend.dir.iterdir()) == [] and list((run_dir / "captures").iterdir()) == []


def test_a_filter_that_always_straddles_a_second_is_kept_and_said(tmp_path: Path, monkeypatch: Any) -> None:
    """A busy host where adding the filter always crosses a wall-clock second: the fifth filter stays."""
    import time

    import labctl.live.capture as livecap

    lab = load_lab_text(NET_LAB, "unet.yaml")
    run_dir = tmp_path / "run"
    (run_dir / "b").mkdir(parents=True)
    rec = GuestRecord(name="b", backend="qemu", pid=1, dir=str(run_dir / "b"), console="", qmp="",
                      ssh_port=2200, accel="tcg")
    state = LabState(lab="unet", source="unet.yaml", dir=str(run_dir), backend="qemu", accel="tcg", image={},
                     started_at="now", guests={"b": rec}, resolved=lab.to_dict())
    backend = FakeQemu(tmp_path / "qemu")
    backend.dir.mkdir()
    clock = iter(float(1_700_000_000 + i) + 0.9 for i in range(100))  # every call a second later
    monkeypatch.setattr(time, "time", lambda: next(clock))
    cap = livecap.start(state, backend, "b", "eth1", purpose="step")
    calls = [c for _, c, _ in backend.calls if c.startswith("object")]
    assert calls == ["object-add", "object-del"] * 4 + ["object-add"]  # the last one is in place
    assert any("may be off" in n for n in cap.notes)
    monkeypatch.undo()
    assert any("may be off" in w for w in livecap.stop(state, backend, cap))
    assert [c for _, c, _ in backend.calls][-1] == "object-del"


KS_LAB = """\
name: uks
networks: {lan: {}}
guests:
  a: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.5.0.1/24}]}
steps:
  - name: selftests
    matrix: [{label: one}, {label: two}]
    kselftest: {tree: TREE, target: net, tests: [t1, t2]}
  - name: after
    run: [{guest: a, command: "true"}]
"""
TAP_ONE_FAILS = ("TAP version 13\n1..2\n# selftests: net: t1\nok 1 selftests: net: t1\n"
                 "# selftests: net: t2\n# boom\nnot ok 2 selftests: net: t2 # exit=1\n")
TAP_ALL_PASS = ("TAP version 13\n1..2\n# selftests: net: t1\nok 1 selftests: net: t1\n"
                "# selftests: net: t2\nok 2 selftests: net: t2\n")
TAP_ONE_SILENT = "TAP version 13\n1..2\n# selftests: net: t1\nok 1 selftests: net: t1\n# selftests: net: t2\n"


def _selftests_run(lab_state: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   taps: dict[str, str]) -> list[Any]:
    """The selftests step of KS_LAB run with a build from the 'cache' and each variant's KTAP output
    (``taps``: variant -> kselftest.tap) sent back by the guest."""
    from labctl.steps import selftests

    _, state = lab_state
    tree = tmp_path / "tree"
    for rel in ("tools/testing/selftests/Makefile", "tools/testing/selftests/net/Makefile",
                "tools/testing/selftests/net/t1", "tools/testing/selftests/net/t2"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("")
    lab = load_lab_text(KS_LAB.replace("TREE", str(tree)), "uks.yaml", trusted=[tmp_path])
    monkeypatch.setattr(selftests, "build", lambda spec, say: selftests.Build("k", tmp_path / "install",
                                                                             cached=True, tests=["t1", "t2"]))
    log: list[tuple[str, str]] = []

    class Session(FakeSession):
        @contextlib.contextmanager
        def stream(self, command: str, timeout: float) -> Iterator[io.BytesIO]:
            step = re.search(r"/tmp/labctl/selftests-(\w+)", command)
            files = {"kselftest.tap": taps[step.group(1)].encode()} if step else {}
            yield io.BytesIO(_tar(files))

    runner = Runner(lab, state, tmp_path / "bundle", connect=lambda g: Session(g, log, lambda g, c: 0),  # type: ignore[arg-type, return-value]
                    backend=FakeBackend(), watch_host=False)  # type: ignore[arg-type]
    results = runner.run()
    assert any("run_kselftest.sh -t net:t1 -t net:t2" in c for _g, c in log)
    return results


def test_a_failed_selftest_fails_its_step_and_the_next_variant_still_runs(lab_state: Any, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    one, two, after = _selftests_run(lab_state, tmp_path, monkeypatch, {"one": TAP_ONE_FAILS, "two": TAP_ALL_PASS})
    assert (one.status, one.reason) == ("failed", "1 of 2 selftests failed: t2")
    assert one.records["kselftest"]["only_tests_failed"] and one.lab_intact
    assert one.kinds == ["drops", "network", "stats", "kselftest"]
    assert [(t["name"], t["result"]) for t in one.records["kselftest"]["tests"]] == [("t1", "pass"), ("t2", "fail")]
    assert (tmp_path / "bundle" / one.records["kselftest"]["tests"][1]["log"]).read_text() == "selftests: net: t2\nboom\n"
    assert (two.status, after.status) == ("ok", "ok")  # only selftests failed: the lab is fine


def test_selftests_that_never_report_fail_the_step_and_stop_the_run(lab_state: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    one, two, after = _selftests_run(lab_state, tmp_path, monkeypatch, {"one": TAP_ONE_SILENT, "two": TAP_ALL_PASS})
    assert (one.status, one.reason) == ("failed", "1 selftests never reported a result")
    assert one.records["kselftest"]["missing"] == 1 and not one.records["kselftest"]["only_tests_failed"] and not one.lab_intact
    assert (two.status, after.status) == ("skipped", "skipped")
