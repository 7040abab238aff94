"""``--junit`` end to end: a real run with a passing and a failing step, and the graded checks of the
lab it left up, each read back with junitparser as a CI system would."""

from __future__ import annotations

import json
from pathlib import Path

from junitparser import Failure, JUnitXml

from tests.conftest import Cli

LAB = """\
name: junittest
networks: {lan: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio-net-pci, network: lan, ip: 10.78.0.1/24}]
steps:
  - name: passes
    run:
      - {guest: a, command: "uname -r"}
  - name: fails
    run:
      - {guest: a, command: "echo broken >&2; exit 3"}
checks:
  - name: has-root
    guest: a
    command: test -d /root
    hint: "there is always a /root"
  - name: has-answer
    guest: a
    command: test -f /root/answer
    hint: "write /root/answer"
"""


def test_run_and_check_write_junit(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "junittest.yaml"
    lab.write_text(LAB)
    xml = tmp_path / "results.xml"
    res = cli("run", str(lab), "--out", str(tmp_path / "runs"), "--accel", "tcg", "--keep", "--json",
              "--junit", str(xml), timeout=900)
    assert res.returncode == 6, res.stdout + res.stderr
    bundle = json.loads(res.stdout)["bundle"]
    (suite,) = list(JUnitXml.fromfile(str(xml)))
    assert suite.name == "junittest"
    assert (suite.tests, suite.failures, suite.errors) == (2, 1, 0)
    cases = {c.name: c for c in suite}
    assert set(cases) == {"passes", "fails"}
    assert cases["passes"].is_passed and cases["passes"].time > 0
    (failure,) = cases["fails"].result
    assert isinstance(failure, Failure)
    assert "status 3" in failure.message, failure.message
    assert f"{bundle}/steps/fails" in failure.message and f"bundle: {bundle}/steps/fails" in failure.text
    assert {p.name: p.value for p in suite.properties()} == {"bundle": bundle, "status": "failed"}
    # commands that move nothing are no transfer: no throughput, CPU or driver columns and charts
    # (one step failed: they would be marked failed), no cost per GB, no warning about an iperf3
    # JSON, mpstat or perf report the steps never asked for
    report = (Path(bundle) / "report.md").read_text()
    assert "| step | variant / NIC model | status |" in report
    for absent in ("Throughput", "CPU load", "Whole cost", "per GB", "iperf3", "mpstat", "perf-report", "Top symbols"):
        assert absent not in report, absent

    # the lab stayed up (--keep): its checks, one passing, one failing
    checks = tmp_path / "checks.xml"
    res = cli("check", "junittest", "--junit", str(checks))
    assert res.returncode == 6, res.stdout + res.stderr
    (suite,) = list(JUnitXml.fromfile(str(checks)))
    assert (suite.tests, suite.failures, suite.errors) == (2, 1, 0)
    cases = {(c.classname, c.name): c for c in suite}
    assert cases[("junittest.a", "has-root")].is_passed
    (failure,) = cases[("junittest.a", "has-answer")].result
    assert isinstance(failure, Failure) and failure.message == "fail (exit 1)"
    assert "hint: write /root/answer" in failure.text

    cli("exec", "junittest", "a", "--", "touch /root/answer", check=True)
    assert cli("check", "junittest", "--junit", str(checks)).returncode == 0
    (suite,) = list(JUnitXml.fromfile(str(checks)))
    assert (suite.tests, suite.failures, suite.errors) == (2, 0, 0)
    assert cli("down", "junittest").returncode == 0
