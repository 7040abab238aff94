"""A ``kselftest:`` step end to end: the net selftests of the suite's 6.1 tree built on the host (into
labctl's cache, never into the tree), run in guests on two NIC models, each result checked against the
KTAP lines of the guest's raw output parsed here on their own, and the JUnit file read by junitparser;
then the same from the suite's 6.12 tree (linux-source-6.12 at 6.12.117), on a guest booted on Debian's
6.12.117 (the tree's own build is a small config without tun or BPF)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from junitparser import Failure, JUnitXml, Skipped

from tests.conftest import Cli
from tests.integration.test_kernel_612 import K612

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


def check_bundle(bundle: Path, xml: Path, variants: dict[str, str] = VARIANTS, tests: list[str] = TESTS,
                 lab: str = "kselftest-net") -> dict[str, Any]:
    """Every selftest result of the bundle against the raw KTAP and the JUnit file; the counts."""
    summary = json.loads((bundle / "summary.json").read_text())
    steps = {s["variant"]: s for s in summary["steps"]}
    assert set(steps) == set(variants)
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(xml)) for c in suite}
    counts: dict[str, Any] = {}
    for variant, guest in variants.items():
        step = steps[variant]
        record = step["kselftest"]
        assert record["guest"] == guest and record["target"] == "net"
        raw = (bundle / step["dir"] / guest / "kselftest.tap").read_text()
        hand = by_hand(raw)
        assert list(hand) == tests, hand
        assert [t["name"] for t in record["tests"]] == tests
        for t in record["tests"]:
            result, nested = hand[t["name"]]
            assert t["result"] == result, (variant, t)
            assert (sum((t["subtests"] or {}).values()) if t["subtests"] else 0) == nested, (variant, t)
            assert t["time_s"] is not None and t["time_s"] > 0
            log = (bundle / t["log"]).read_text()
            assert f"selftests: net: {t['name']}" in log
            if result == "skip":
                assert t["reason"], t
            case = cases[(f"{lab}.net-selftests[{variant}]", f"net:{t['name']}")]
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


#: 6.12's net selftests of the same kinds (tun's nested subtests, skips with reasons) on one guest.
TESTS_612 = ["reuseport_bpf", "reuseaddr_conflict", "tun", "altnames.sh", "drop_monitor_tests.sh"]


@pytest.mark.timeout(3 * 3600)  # a fresh machine downloads 6.12.117 (and its -dbg) first
def test_net_selftests_of_a_6_12_tree_on_debians_build_of_it(cli: Cli, image: object, tree_kernel_612: Path,
                                                       tmp_path: Path) -> None:
    """``kselftest: {tree:}`` of a linux-source-6.12 tree: built against that tree (its headers, its
    Makefiles), run on a guest booted on the same release of Debian's, read as the 6.1 ones are."""
    selftests = tree_kernel_612 / "tools" / "testing" / "selftests"
    started = time.time()
    lab = tmp_path / "kselftest-612.yaml"
    lab.write_text(f"""\
name: kselftest-612
kernel: debian:{K612}
networks: {{lan: {{}}}}
guests:
  b:
    memory: 768
    nics: [{{name: eth1, model: virtio-net-pci, network: lan, ip: 10.79.1.2/24}}]
steps:
  - name: net-selftests
    matrix:
      - {{label: virtio-net-pci, guest: b}}
    nic: "{{{{guest}}}}.eth1"
    kselftest:
      guest: "{{{{guest}}}}"
      tree: {tree_kernel_612}
      tests: [{", ".join(TESTS_612)}]
      timeout: 120
""")
    xml = tmp_path / "results.xml"
    res = cli("run", str(lab), "--out", str(tmp_path / "runs"), "--accel", "tcg", "--json", "--junit", str(xml), timeout=3600)
    assert res.returncode in (0, 6), res.stdout + res.stderr
    out = json.loads(res.stdout)
    bundle = Path(out["bundle"])
    counts = check_bundle(bundle, xml, {"virtio-net-pci": "b"}, TESTS_612, "kselftest-612")
    assert counts["virtio-net-pci"]["pass"] >= 2 and counts["virtio-net-pci"]["skip"] + \
        counts["virtio-net-pci"]["pass"] + counts["virtio-net-pci"]["fail"] == len(TESTS_612), counts
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["kernels"]["b"]["release"] == K612, manifest["kernels"]
    assert "6.12.117" in (tree_kernel_612 / "include" / "config" / "kernel.release").read_text()
    changed = [p for p in selftests.rglob("*") if p.lstat().st_mtime > started]
    assert changed == [], changed[:10]
