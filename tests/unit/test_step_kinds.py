"""Every step kind is whole: declared once (labctl.lab.stepkinds), run (labctl.steps.kinds), its records
typed, kept in summary.json and shown by a report section; and the ``sysctls`` kind, the example of
docs/development.md's "Adding a step kind", from its lab-file keys to its report table."""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.base import GuestRecord
from labctl.bundle import Run
from labctl.errors import LabFileError
from labctl.lab import STEP_KINDS, GdbRecord, KindDecl, load_lab_text
from labctl.lab.stepsysctl import StepSysctls
from labctl.report.document import Table
from labctl.report.registry import SECTIONS
from labctl.report.run_summary import RECORDED, summarize_step
from labctl.report.sections import ReportSection
from labctl.report.sysctls import SysctlSection
from labctl.ssh import Result
from labctl.state.runstate import LabState
from labctl.steps.kinds import RUNS
from tests.conftest import fake_kernel
from tests.unit.test_runner import FakeBackend, _runner


def _is_record_type(t: object) -> bool:
    """A TypedDict or dataclass, or a list of them."""
    if typing.get_origin(t) is list:
        (t,) = typing.get_args(t)
    return typing.is_typeddict(t) or hasattr(t, "__dataclass_fields__")


def kind_problems(decls: Iterable[KindDecl], runs: Mapping[str, object], sections: Iterable[ReportSection],
                  recorded: Iterable[str]) -> list[str]:
    """What is missing of each declared kind: its run, its records' types and summary keys, a section."""
    decls, recorded = list(decls), set(recorded)
    shown = {k for s in sections for k in s.kinds}
    out = [f"{name}: runs but is not declared" for name in runs if name not in {d.name for d in decls}]
    for d in decls:
        if d.name not in runs:
            out.append(f"{d.name}: no run (labctl.steps.kinds.RUNS)")
        if d.name not in shown:
            out.append(f"{d.name}: no report section shows it (ReportSection.kinds)")
        for key, t in d.records:
            if not _is_record_type(t):
                out.append(f"{d.name}: record {key} has no record type ({t!r})")
            if key not in recorded:
                out.append(f"{d.name}: record {key} is not kept in summary.json")
    return out


def test_every_declared_kind_runs_is_typed_kept_and_shown() -> None:
    assert kind_problems(STEP_KINDS, RUNS, SECTIONS, RECORDED) == []


@pytest.mark.parametrize(("decl", "sections", "recorded", "missing"), [
    (KindDecl("xdp", ("xdp",), records=(("xdp", None),)), SECTIONS, (*RECORDED, "xdp"), "no record type"),
    (KindDecl("xdp", ("xdp",), records=(("xdp", dict[str, int]),)), SECTIONS, (*RECORDED, "xdp"), "no record type"),
    (KindDecl("gdb2", records=(("gdb", GdbRecord),)), SECTIONS, RECORDED,
     "no report section"),
    (KindDecl("sysctls", records=(("sysctls2", dict),)), SECTIONS, RECORDED, "not kept in summary.json"),
])
def test_a_kind_registered_without_its_parts_is_named(decl: KindDecl, sections: tuple[ReportSection, ...],
                                                      recorded: tuple[str, ...], missing: str) -> None:
    runs = {**RUNS, decl.name: RUNS["gdb"]}
    problems = kind_problems([*STEP_KINDS, decl], runs, sections, recorded)
    assert any(decl.name in p and missing in p for p in problems), problems


def test_a_kind_that_runs_without_a_declaration_is_named() -> None:
    assert kind_problems(STEP_KINDS, {**RUNS, "xdp": RUNS["gdb"]}, SECTIONS, RECORDED) == \
        ["xdp: runs but is not declared"]


def test_summary_json_keeps_every_declared_record(tmp_path: Path) -> None:
    step: dict[str, Any] = {"name": "s", "variant": None, "status": "ok", "dir": "steps/s/_", "guests": [],
                            "kinds": [d.name for d in STEP_KINDS]}
    for d in STEP_KINDS:
        for key, t in d.records:
            step[key] = [] if typing.get_origin(t) is list else {"from": d.name}
    entry: dict[str, Any] = dict(summarize_step(tmp_path, step))
    for d in STEP_KINDS:
        for key, t in d.records:
            assert entry.get(key) == ([] if typing.get_origin(t) is list else {"from": d.name}), key


# -- the sysctls kind ------------------------------------------------------------------------------------

SYSCTL_LAB_TEXT = """\
name: unit
networks: {lan: {}}
guests:
  a: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.5.0.1/24}]}
  b: {nics: [{name: eth1, model: virtio, network: lan, ip: 10.5.0.2/24}]}
steps:
  - name: reno
    sysctls: {SYSCTLS}
    run:
      - {guest: a, command: "true"}
"""
SYSCTL_LAB = SYSCTL_LAB_TEXT.replace("{SYSCTLS}", "{a: {net.ipv4.tcp_congestion_control: reno, net.core.rmem_max: 4194304}}")


def _state(tmp_path: Path) -> LabState:
    """The running state of SYSCTL_LAB's two guests (as tests/unit/test_runner.py's lab_state)."""
    guests = {}
    for g in ("a", "b"):
        gdir = tmp_path / "run" / "guests" / g
        gdir.mkdir(parents=True)
        (gdir / "console.log").write_text(f"LABCTL-READY {g} 5.0 eth1=e1000\n")
        guests[g] = GuestRecord(name=g, backend="qemu", pid=1, dir=str(gdir), console=str(gdir / "console.log"),
                                qmp=str(gdir / "qmp.sock"), ssh_port=2200, accel="tcg", argv=["qemu-system-x86_64"])
    (tmp_path / "image").mkdir()
    kernel = fake_kernel(tmp_path / "kernel")
    return LabState(lab="unit", source="unit.yaml", dir=str(tmp_path / "run"), backend="qemu", accel="tcg",
                    image={"name": "debian-12", "key": "k", "dir": str(tmp_path / "image")}, started_at="now",
                    guests=guests, kernels={g: str(kernel.dir) for g in guests})


def test_a_steps_sysctls_are_read_per_guest_in_order() -> None:
    (step,) = load_lab_text(SYSCTL_LAB, "unit.yaml").steps
    spec = step.spec("sysctls", StepSysctls)
    assert spec is not None
    ((guest, sysctls),) = spec.guests
    assert guest == "a"
    assert [(s.name, s.value, s.path) for s in sysctls] == [
        ("net.ipv4.tcp_congestion_control", "reno", "net/ipv4/tcp_congestion_control"),
        ("net.core.rmem_max", "4194304", "net/core/rmem_max")]


@pytest.mark.parametrize(("body", "where"), [
    ("{c: {net.core.rmem_max: 1}}", "unit.yaml:8: steps[0].sysctls.c: unknown guest 'c'"),
    ("{a: {net.core.rmem_max: true}}", "unit.yaml:8: steps[0].sysctls.a.net.core.rmem_max: expected a number"),
    ("{a: {proc.core: 1}}", "unit.yaml:8: steps[0].sysctls.a.proc.core: 'proc.core' is not a sysctl"),
    ("[a]", "unit.yaml:8: steps[0].sysctls: expected a mapping"),
])
def test_a_bad_sysctl_of_a_step_is_named_at_its_line(body: str, where: str) -> None:
    with pytest.raises(LabFileError) as e:
        load_lab_text(SYSCTL_LAB_TEXT.replace("{SYSCTLS}", body), "unit.yaml")
    assert any(str(p).startswith(where) for p in e.value.problems), [str(p) for p in e.value.problems]


def test_the_sysctls_are_set_for_the_step_and_put_back(tmp_path: Path) -> None:
    state = _state(tmp_path)
    lab = load_lab_text(SYSCTL_LAB, "unit.yaml")
    values = {"/proc/sys/net/ipv4/tcp_congestion_control": "cubic\n", "/proc/sys/net/core/rmem_max": "212992\n"}

    def answer(guest: str, command: str) -> int:
        return 1 if "rmem_max" in command and "printf '%s\\n' 212992" in command else 0

    runner, log = _runner(lab, state, tmp_path / "bundle", answer, FakeBackend())
    real = runner.sessions.ssh

    def ssh(g: str) -> Any:
        s = real(g)
        plain = s.run

        def run(command: str, timeout: float = 60.0, **kw: Any) -> Result:
            out = plain(command, timeout, **kw)
            for path, value in values.items():
                if command == f"cat {path}":
                    return Result(0, value.encode(), b"", 0.01)
            return out

        s.run = run  # type: ignore[method-assign]
        return s

    runner.sessions.ssh = ssh  # type: ignore[method-assign]
    (result,) = runner.run()
    assert result.status == "ok", result.reason
    assert "sysctls" in result.kinds and "a" in result.guests
    sent = [c for g, c in log if g == "a" and "/proc/sys/" in c]
    assert sent.index("printf '%s\\n' reno > /proc/sys/net/ipv4/tcp_congestion_control") \
        < sent.index("printf '%s\\n' cubic > /proc/sys/net/ipv4/tcp_congestion_control")  # set, then put back
    record = result.records["sysctls"]
    assert record == {"guests": {"a": {
        "net.ipv4.tcp_congestion_control": {"before": "cubic", "set": "reno", "restored": True},
        "net.core.rmem_max": {"before": "212992", "set": "4194304", "restored": False}}}}
    assert result.warnings == ["a: sysctl net.core.rmem_max not put back to 212992"]
    table = next(b for b in SysctlSection().step_blocks(Run(tmp_path, {}, {}), result.entry())  # type: ignore[arg-type]
                 if isinstance(b, Table))
    assert [[s.text for cell in r.cells for s in cell] for r in table.rows] == [
        ["a", "net.ipv4.tcp_congestion_control", "cubic", "reno", "yes"],
        ["a", "net.core.rmem_max", "212992", "4194304", "no"]]
    assert [r.cls for r in table.rows] == ["", "failed"]


def test_a_sysctl_the_kernel_refuses_fails_the_step(tmp_path: Path) -> None:
    state = _state(tmp_path)
    lab = load_lab_text(SYSCTL_LAB, "unit.yaml")
    runner, _ = _runner(lab, state, tmp_path / "bundle",
                        lambda g, c: 1 if c.startswith("printf '%s\\n' reno") else 0, FakeBackend())
    (result,) = runner.run()
    assert result.status == "failed" and result.reason == \
        "a: the kernel refused sysctl net.ipv4.tcp_congestion_control = reno"



def test_a_kinds_guests_come_after_the_known_order_not_lost() -> None:
    from labctl.steps.kinds import guest_order

    assert guest_order({"network": ["c"], "sysctls": ["d", "a"], "commands": ["a", "b"], "nic": ["b"]}) == \
        ["a", "b", "c", "d"]


def test_the_gdb_record_is_shown_in_its_step() -> None:
    from labctl.report.document import Meta
    from labctl.report.gdbsession import GdbSection

    step: dict[str, Any] = {"gdb": {"breakpoint": {"func": "e1000_xmit_frame", "file": "e1000_main.c", "line": "3100"},
                                    "hits": 0, "timed_out": True, "message": "never hit in 60 s",
                                    "transcript": "gdb-transcript.txt"}}
    (_, meta) = GdbSection().step_blocks(Run(Path("."), {}, {}), step)  # type: ignore[arg-type]
    assert isinstance(meta, Meta)
    rows = {k: "".join(s.text for s in v) for k, v in meta.rows}
    assert rows == {"breakpoint": "e1000_xmit_frame (e1000_main.c:3100)", "hits": "0 (timed out: never hit in 60 s)",
                    "transcript": "gdb-transcript.txt"}
    assert GdbSection().step_blocks(Run(Path("."), {}, {}), {}) == []
    from labctl.report.gdbsession import _where

    assert _where({"func": "ip_rcv", "file": "ip_input.c"}) == "ip_rcv"  # no line: no place
    assert _where({"original-location": "*0xffffffff81000000"}) == "*0xffffffff81000000"
