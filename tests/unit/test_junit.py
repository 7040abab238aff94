"""JUnit XML from fake step and check results, read back with junitparser (what CI plugins parse)."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from labctl.bundle.junit import step_cases
from labctl.cli import junit_out
from labctl.cli.main import build_parser
from labctl.errors import GuestError, UsageError
from labctl.grading import CheckResult
from labctl.pipeline import RunOutcome
from labctl.steps.result import StepResult


def _results() -> list[StepResult]:
    ok = StepResult("transfer", "rtl8139", "ok", None, 12.5, "steps/transfer/rtl8139", guests=["a"])
    bad = StepResult("transfer", "e1000", "failed", "a: command 1 exited with status 1", 3.25,
                     "steps/transfer/e1000", guests=["a"], warnings=["a: not copied: x: a FIFO"])
    skipped = StepResult("after", None, "skipped", "an earlier step failed", 0.0, "steps/after/_")
    r1 = StepResult("noise", None, "ok", None, 1.0, "steps/noise/_@1", repeat=1, repeats=2)
    r2 = StepResult("noise", None, "ok", None, 1.5, "steps/noise/_@2", repeat=2, repeats=2)
    return [ok, bad, skipped, r1, r2]


def _suite(xml: Path):  # type: ignore[no-untyped-def]
    doc = JUnitXml.fromfile(str(xml))
    suites = list(doc)
    assert len(suites) == 1
    return suites[0]


def test_a_run_reads_back_case_by_case(tmp_path: Path) -> None:
    bundle = tmp_path / "runs" / "lab-1"
    outcome = RunOutcome(bundle, "failed", "step transfer (e1000): ...", _results(), [])
    out = tmp_path / "results.xml"
    junit_out.write_run(out, "lab", outcome, "2026-11-25T14:00:00+00:00")
    suite = _suite(out)
    assert suite.name == "lab"
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (5, 1, 0, 1)
    assert suite.time == pytest.approx(18.25)
    assert suite.timestamp == "2026-11-25T14:00:00+00:00"
    cases = {c.name: c for c in suite}
    assert list(cases) == ["transfer[rtl8139]", "transfer[e1000]", "after", "noise@1", "noise@2"]
    assert cases["transfer[rtl8139]"].is_passed and cases["transfer[rtl8139]"].time == pytest.approx(12.5)
    assert cases["transfer[rtl8139]"].classname == "lab.steps"
    (failure,) = cases["transfer[e1000]"].result
    assert isinstance(failure, Failure)
    assert "command 1 exited with status 1" in failure.message
    assert str(bundle / "steps/transfer/e1000") in failure.message
    assert "warning: a: not copied: x: a FIFO" in failure.text
    (skip,) = cases["after"].result
    assert isinstance(skip, Skipped) and skip.message == "an earlier step failed"
    assert {p.name: p.value for p in suite.properties()} == {"bundle": str(bundle), "status": "failed"}


def test_checks_one_case_per_check_and_guest(tmp_path: Path) -> None:
    results = [CheckResult("ping", "a", "pass", "h", 0, 0.5, "64 bytes"),
               CheckResult("ping", "b", "fail", "look at rp_filter", 1, 2.0, "100% packet loss"),
               CheckResult("answer", "b", "timeout", "", 124, 10.0, ""),
               CheckResult("answer", "c", "error", "", None, 10.0, "cannot SSH to guest c")]
    out = tmp_path / "checks.xml"
    junit_out.write_checks(out, "lab@alice", results, junit_out.now())
    suite = _suite(out)
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (4, 2, 1, 0)
    cases = {(c.classname, c.name): c for c in suite}
    assert set(cases) == {("lab@alice.a", "ping"), ("lab@alice.b", "ping"), ("lab@alice.b", "answer"),
                          ("lab@alice.c", "answer")}
    assert cases[("lab@alice.a", "ping")].is_passed
    (f,) = cases[("lab@alice.b", "ping")].result
    assert isinstance(f, Failure) and f.message == "fail (exit 1)" and "hint: look at rp_filter" in f.text
    assert cases[("lab@alice.b", "ping")].system_out == "100% packet loss"
    (t,) = cases[("lab@alice.b", "answer")].result
    assert isinstance(t, Failure) and t.message == "timeout (10 s)"
    (e,) = cases[("lab@alice.c", "answer")].result
    assert isinstance(e, Error) and "cannot SSH" in e.message


def test_an_error_before_the_steps(tmp_path: Path) -> None:
    out = tmp_path / "r.xml"
    junit_out.write_error(out, "lab", "up", GuestError("guest a never became ready", hint="console"), junit_out.now())
    suite = _suite(out)
    assert (suite.tests, suite.errors) == (1, 1)
    (case,) = list(suite)
    (e,) = case.result
    assert isinstance(e, Error) and e.message == "guest a never became ready" and "hint: console" in e.text


def test_guest_text_that_xml_cannot_carry_is_escaped(tmp_path: Path) -> None:
    nasty = "bell\x07 esc\x1b[31m nul\x00 \udcff ok: <&\"'> ü"
    results = [StepResult(nasty, None, "failed", nasty, 1.0, "steps/x/_")]
    out = tmp_path / "r.xml"
    junit_out.write_run(out, "lab", RunOutcome(tmp_path, "failed", nasty, results, []), junit_out.now())
    ET.parse(out)  # well-formed
    (case,) = list(_suite(out))
    assert case.name == "bell\\x07 esc\\x1b[31m nul\\x00 \\udcff ok: <&\"'> ü"
    assert "\\x1b[31m" in case.result[0].message


def test_a_run_that_failed_before_any_step(tmp_path: Path) -> None:
    out = tmp_path / "r.xml"
    junit_out.write_run(out, "lab", RunOutcome(tmp_path, "failed", "interrupted (Ctrl-C)", [], []), junit_out.now())
    (case,) = list(_suite(out))
    assert isinstance(case.result[0], Error) and case.result[0].message == "interrupted (Ctrl-C)"


def test_step_cases_from_summary_dicts() -> None:
    cases = step_cases("l", (r.entry() for r in _results()), None)
    assert [c.status for c in cases] == ["passed", "failed", "skipped", "passed", "passed"]
    assert cases[1].message == "a: command 1 exited with status 1"


def test_the_file_is_checked_before_anything_runs(tmp_path: Path) -> None:
    assert junit_out.check_path(None) is None
    assert junit_out.check_path(str(tmp_path / "r.xml")) == tmp_path / "r.xml"
    with pytest.raises(UsageError, match="no such directory"):
        junit_out.check_path(str(tmp_path / "missing" / "r.xml"))
    with pytest.raises(UsageError, match="file name"):
        junit_out.check_path(str(tmp_path))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    from labctl.errors import UnsafePath

    with pytest.raises(UnsafePath):
        junit_out.check_path(str(shared / "r.xml"))


def test_the_written_file_replaces_a_link_never_follows_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "r.xml").symlink_to(victim)
    junit_out.write_checks(tmp_path / "r.xml", "lab", [CheckResult("c", "a", "pass")], junit_out.now())
    assert victim.read_text() == "keep" and not (tmp_path / "r.xml").is_symlink()


@pytest.mark.parametrize("argv", [["run", "lab.yaml", "--junit", "r.xml"], ["check", "lab@x", "--junit", "r.xml"]])
def test_the_option(argv: list[str]) -> None:
    args: argparse.Namespace = build_parser().parse_args(argv)
    assert args.junit == "r.xml"


def test_run_that_never_comes_up_writes_one_error_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from labctl.cli import run_cmd
    from labctl.errors import ImageError

    monkeypatch.setattr(run_cmd, "load_source",
                        lambda args: (SimpleNamespace(ident="lab@ci", steps=[1], image="x", guests={}), None))

    def no_image(lab: object, *args: object, **kwargs: object) -> None:
        raise ImageError("the image cannot be built", hint="see setup.sh")

    monkeypatch.setattr(run_cmd, "prepare", no_image)
    out = tmp_path / "r.xml"
    args = build_parser().parse_args(["run", "lab.yaml", "--junit", str(out)])
    with pytest.raises(ImageError):
        args.func(args)
    suite = _suite(out)
    assert (suite.name, suite.tests, suite.errors) == ("lab@ci", 1, 1)
    (case,) = list(suite)
    assert case.name == "up" and case.result[0].message == "the image cannot be built"


def test_a_bad_junit_path_fails_before_the_lab_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.cli import check_cmd, run_cmd

    monkeypatch.setattr(run_cmd, "load_source", lambda args: pytest.fail("the lab was loaded"))
    monkeypatch.setattr(check_cmd.LabState, "load", lambda lab: pytest.fail("the lab was loaded"))
    for argv in (["run", "lab.yaml", "--junit", str(tmp_path / "no" / "r.xml")],
                 ["check", "lab", "--junit", str(tmp_path / "no" / "r.xml")]):
        args = build_parser().parse_args(argv)
        with pytest.raises(UsageError, match="no such directory"):
            args.func(args)
