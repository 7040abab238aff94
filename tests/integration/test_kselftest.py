"""A ``kselftest:`` step end to end: the net selftests of the suite's 6.1 tree built on the host (into
labctl's cache, never into the tree), run in guests on two NIC models, each result checked against the
KTAP lines of the guest's raw output parsed here on their own, and the JUnit file read by junitparser."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from junitparser import Failure, JUnitXml, Skipped

from tests.conftest import Cli

#: Files on the suite's kernel tree share one worker: on a new machine its build is waited for once.
pytestmark = pytest.mark.xdist_group("kernel-tree")

#: Every kind of result in a few seconds a guest: passes, a failure with nested subtests (tun), nested
#: passes (reuseaddr_ports_exhausted.sh), skips with their reasons (altnames.sh, drop_monitor_tests.sh).
#: ip_defrag.sh (25 s a guest), so_txtime.sh, udpgso.sh and icmp.sh added nothing else.
TESTS = ["reuseport_bpf", "reuseport_dualstack", "reuseaddr_conflict", "reuseaddr_ports_exhausted.sh",
         "sk_connect_zero_addr", "tun", "run_netsocktests", "altnames.sh", "drop_monitor_tests.sh"]
VARIANTS = {"e1000": "a", "virtio-net-pci": "b"}
_TOP = re.compile(r"(not )?ok (\d+) selftests: net: (\S+)(?: # ([A-Za-z]+)\b.*)?")
_SUB = re.compile(r"# (not )?ok \d+ ")


def lab_text(tree: Path) -> str:
    return f"""\
name: kselftest-net
networks: {{lan: {{}}}}
guests:
  a:
    memory: 768
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.79.0.1/24}}]
  b:
    memory: 768
    nics: [{{name: eth1, model: virtio-net-pci, network: lan, ip: 10.79.0.2/24}}]
steps:
  - name: net-selftests
    matrix:
      - {{label: e1000, guest: a}}
      - {{label: virtio-net-pci, guest: b}}
    nic: "{{{{guest}}}}.eth1"
    kselftest:
      guest: "{{{{guest}}}}"
      tree: {tree}
      tests: [{", ".join(TESTS)}]
      timeout: 120
"""


def by_hand(tap: str) -> dict[str, tuple[str, int]]:
    """test -> (result, nested result lines) from the raw output, without labctl's parser."""
    out: dict[str, tuple[str, int]] = {}
    nested = 0
    for line in tap.splitlines():
        if _SUB.match(line):
            nested += 1
        m = _TOP.fullmatch(line.strip())
        if m:
            directive = (m[4] or "").upper()
            result = "skip" if directive == "SKIP" else "xfail" if directive == "XFAIL" else \
                "fail" if m[1] else "pass"
            out[m[3]] = (result, nested)
            nested = 0
    return out


def check_bundle(bundle: Path, xml: Path) -> dict[str, Any]:
    """Every selftest result of the bundle against the raw KTAP and the JUnit file; the counts."""
    summary = json.loads((bundle / "summary.json").read_text())
    steps = {s["variant"]: s for s in summary["steps"]}
    assert set(steps) == set(VARIANTS)
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(xml)) for c in suite}
    counts: dict[str, Any] = {}
    for variant, guest in VARIANTS.items():
        step = steps[variant]
        record = step["kselftest"]
        assert record["guest"] == guest and record["target"] == "net"
        raw = (bundle / step["dir"] / guest / "kselftest.tap").read_text()
        hand = by_hand(raw)
        assert list(hand) == TESTS, hand
        assert [t["name"] for t in record["tests"]] == TESTS
        for t in record["tests"]:
            result, nested = hand[t["name"]]
            assert t["result"] == result, (variant, t)
            assert (sum((t["subtests"] or {}).values()) if t["subtests"] else 0) == nested, (variant, t)
            assert t["time_s"] is not None and t["time_s"] > 0
            log = (bundle / t["log"]).read_text()
            assert f"selftests: net: {t['name']}" in log
            if result == "skip":
                assert t["reason"], t
            case = cases[(f"kselftest-net.net-selftests[{variant}]", f"net:{t['name']}")]
            if result == "fail":
                assert isinstance(case.result[0], Failure) and t["name"] in step["reason"]
            elif result == "skip":
                assert isinstance(case.result[0], Skipped) and case.result[0].message == t["reason"]
            else:
                assert case.is_passed
        assert record["counts"] == {r: sum(1 for v in hand.values() if v[0] == r)
                                    for r in ("pass", "fail", "skip", "xfail")}
        counts[variant] = record["counts"]
    return counts


def test_net_selftests_on_two_nic_models(cli: Cli, image: object, tree_kernel: Path, tmp_path: Path) -> None:
    selftests = tree_kernel / "tools" / "testing" / "selftests"
    started = time.time()
    lab = tmp_path / "kselftest.yaml"
    lab.write_text(lab_text(tree_kernel))
    xml = tmp_path / "results.xml"
    res = cli("run", str(lab), "--out", str(tmp_path / "runs"), "--accel", "tcg", "--json", "--junit", str(xml),
              timeout=1800)
    assert res.returncode in (0, 6), res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert [s["status"] for s in out["steps"]] != ["skipped", "skipped"]
    counts = check_bundle(Path(out["bundle"]), xml)
    # the chosen set holds each kind of result, and tun's harness subtests were parsed as nested
    assert counts["e1000"]["pass"] >= 5 and counts["e1000"]["skip"] >= 1, counts
    assert counts["e1000"]["fail"] >= 1, counts
    # the build went to labctl's cache: nothing in the tree changed
    changed = [p for p in selftests.rglob("*") if p.lstat().st_mtime > started]
    assert changed == [], changed[:10]
