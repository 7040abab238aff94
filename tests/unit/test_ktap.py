"""The KTAP / TAP parser (labctl.trace.ktap) on real output shapes: run_kselftest.sh's ``# ``-prefixed
nesting with a kselftest_harness program inside, KUnit's indented KTAP v1, directives and a bail out."""

from __future__ import annotations

from labctl.trace.ktap import counts, kselftest_name, parse, parse_text, walk

# run_kselftest.sh -t net:reuseport_bpf -t net:tun -t net:drop_monitor_tests.sh -t net:icmp.sh (6.1), shortened
KSELFTEST = """\
TAP version 13
1..4
# selftests: net: reuseport_bpf
# ---- IPv4 UDP ----
# Testing EBPF mod 10...
# SUCCESS
ok 1 selftests: net: reuseport_bpf
# selftests: net: tun
# TAP version 13
# 1..3
# # Starting 3 tests from 1 test cases.
# #  RUN           tun.delete_detach_close ...
# #            OK  tun.delete_detach_close
# ok 1 tun.delete_detach_close
# #  RUN           tun.reattach_close ...
# # tun.c:123:reattach_close:Expected 0 (0) == ret (-1)
# #          FAIL  tun.reattach_close
# not ok 2 tun.reattach_close
# ok 3 tun.detach_close # SKIP needs CAP_NET_ADMIN twice
# # FAILED: 1 / 3 tests passed.
# # Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0
not ok 2 selftests: net: tun # exit=1
# selftests: net: drop_monitor_tests.sh
# SKIP: Could not run test without tshark tool
ok 3 selftests: net: drop_monitor_tests.sh # SKIP
# selftests: net: icmp.sh
#
not ok 4 selftests: net: icmp.sh # TIMEOUT 45 seconds
"""

KUNIT = """\
KTAP version 1
1..2
    KTAP version 1
    # Subtest: example
    1..3
    ok 1 example_simple_test
        KTAP version 1
        # Subtest: example_params
        ok 1 param-0
        not ok 2 param-1 # XFAIL known quirk
    ok 2 example_params
    ok 3 example_skip_test # SKIP this test should be skipped
# example: pass:2 fail:0 skip:1 total:3
ok 1 example
    KTAP version 1
    # Subtest: broken
    1..2
    not ok 1 broken_one
    Bail out! the machine fell over
not ok 2 broken
"""


def test_kselftest_runner_output_nested() -> None:
    doc = parse_text(KSELFTEST)
    assert (doc.version, doc.plan, doc.missing) == ("TAP version 13", 4, 0)
    names = [kselftest_name(r.name) for r in doc.results]
    assert names == [("net", "reuseport_bpf"), ("net", "tun"), ("net", "drop_monitor_tests.sh"), ("net", "icmp.sh")]
    assert [r.result for r in doc.results] == ["pass", "fail", "skip", "fail"]
    bpf, tun, drop, icmp = doc.results
    assert bpf.subtests == [] and "# SUCCESS" in bpf.log
    assert tun.reason == "exit=1" and tun.plan == 3
    assert [(s.number, s.name, s.result) for s in tun.subtests] == [
        (1, "tun.delete_detach_close", "pass"), (2, "tun.reattach_close", "fail"), (3, "tun.detach_close", "skip")]
    assert tun.subtests[2].skip_reason() == "needs CAP_NET_ADMIN twice"
    assert any("Expected 0 (0) == ret (-1)" in ln for ln in tun.subtests[1].log)
    assert counts(walk(tun.subtests)) == {"pass": 1, "fail": 1, "skip": 1, "xfail": 0}
    # a skip without a reason on its line: the test's own words
    assert drop.directive == "SKIP" and drop.skip_reason() == "SKIP: Could not run test without tshark tool"
    assert icmp.directive == "TIMEOUT" and icmp.reason == "TIMEOUT 45 seconds"
    assert counts(doc.results) == {"pass": 1, "fail": 2, "skip": 1, "xfail": 0}


def test_kunit_indented_ktap_to_any_depth_and_bail_out() -> None:
    doc = parse_text(KUNIT)
    assert doc.version == "KTAP version 1" and doc.plan == 2
    example, broken = doc.results
    assert example.result == "pass" and example.plan == 3
    simple, params, skipped = example.subtests
    assert simple.result == "pass" and skipped.result == "skip"
    assert skipped.skip_reason() == "this test should be skipped"
    assert [(p.name, p.result, p.reason) for p in params.subtests] == [
        ("param-0", "pass", ""), ("param-1", "xfail", "known quirk")]
    # the bail out ends the nested document: one of its two tests never reported
    assert broken.result == "fail" and [s.result for s in broken.subtests] == ["fail"]
    inner = parse(["1..2", "not ok 1 broken_one", "Bail out! the machine fell over", "ok 2 never"])
    assert inner.bailed == "the machine fell over" and inner.missing == 1


def test_plain_output_is_not_taken_for_results() -> None:
    # a script's own "ok" lines without a number, and "[ OK ]" verdicts, are diagnostics
    doc = parse_text("TAP version 13\n1..1\n# selftests: net: x.sh\n# ok\n#     TEST: a    [ OK ]\n"
                     "ok 1 selftests: net: x.sh\n")
    (x,) = doc.results
    assert x.subtests == [] and x.result == "pass"
    assert parse_text("1..2\nok 1 a\n").missing == 1
