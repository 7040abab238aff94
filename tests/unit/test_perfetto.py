"""Trace Event Format export (labctl.trace.perfetto) on the recorded traces of tests/fixtures/skb and
tests/fixtures/trace, the validator on deliberately broken documents, and the atomic writer."""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from labctl.errors import LabctlError
from labctl.trace.perfetto import (
    FLOW_CAT,
    FLOW_NAME,
    PID,
    POINT_MAX_NS,
    TID_BASE,
    ftrace_trace,
    skb_trace,
)
from labctl.trace.skbevents import parse_report
from labctl.trace.skblatency import stage_times, why_not_followed
from labctl.trace.skbpath import Packet, follow
from labctl.trace.tef import validate_trace, write_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SKB = sorted(p.name for p in (FIX / "skb").glob("*.txt.gz"))
RX_NAMES = ["napi_gro_receive", "netif_receive_skb", "ip_rcv_core", "tcp_v4_rcv", "skb_copy_datagram_iovec"]
TX_NAMES = ["tcp_sendmsg", "__tcp_transmit_skb", "__ip_queue_xmit", "__dev_queue_xmit", "net_dev_xmit"]


def fixture(name: str) -> str:
    return gzip.decompress((FIX / "skb" / name).read_bytes()).decode()


_DOCS: dict[str, dict[str, Any]] = {}


def export(name: str) -> dict[str, Any]:
    """skb_trace of a fixture (computed once; tests that change it take a deep copy)."""
    if name not in _DOCS:
        _DOCS[name] = skb_trace(fixture(name), guest="b")
    return _DOCS[name]


def followed_packets(name: str) -> list[Packet]:
    corr = follow(parse_report(fixture(name)))
    return [p for p in corr.rx + corr.tx if p.dev != "mgmt0" and why_not_followed(p) is None]


def ns(us: float) -> int:
    """A ts/dur as Perfetto's JSON importer reads it: microseconds * 1000, truncated."""
    return us * 1000 if isinstance(us, int) else math.trunc(us * 1000.0)


def phases(doc: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph]


def perfetto_import(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[Any, list[dict[str, Any]]], int]:
    """What Perfetto's JSON importer makes of a document, written from its source independently of the
    module: events sorted by ts (at equal ts: X longest first, then the rest in file order); per thread a
    stack of slices, popped only when a new slice starts at or after their end; a partially overlapping
    slice dropped; an s/t/f (bp "e") bound to the slice on top of its thread's stack at that moment.
    Returns the slices kept, the slices each flow id is bound to in order, and the slices dropped."""
    events = [(ns(e["ts"]), (2**62 - ns(e["dur"])) if e["ph"] == "X" else 2**62, i, e)
              for i, e in enumerate(doc["traceEvents"]) if e["ph"] != "M"]
    stacks: dict[Any, list[dict[str, Any]]] = {}
    kept: list[dict[str, Any]] = []
    bound: dict[Any, list[dict[str, Any]]] = {}
    dropped = 0
    for ts, _, _, e in sorted(events, key=lambda t: t[:3]):
        stack = stacks.setdefault((e["pid"], e["tid"]), [])
        if e["ph"] in ("X", "i"):
            dur = ns(e["dur"]) if e["ph"] == "X" else 0
            while stack and (stack[-1]["end"] < ts or (stack[-1]["end"] == ts and not (stack[-1]["dur"] == 0
                                                                                       and dur == 0))):
                stack.pop()
            if stack and ts < stack[-1]["end"] < ts + dur:
                dropped += 1
                continue
            s = {"name": e["name"], "ts": ts, "dur": dur, "end": ts + dur, "tid": e["tid"], "event": e}
            stack.append(s)
            kept.append(s)
        elif e["ph"] in ("s", "t", "f"):
            assert e["ph"] != "f" or e.get("bp") == "e"
            bound.setdefault(e["id"], []).append(stack[-1] if stack else {"name": None, "tid": e["tid"]})
    return kept, bound, dropped


# -- skb_trace on the recorded traces -----------------------------------------------------------

@pytest.mark.parametrize("name", SKB)
def test_export_of_every_recorded_trace_is_valid_and_json(name: str) -> None:
    doc = export(name)
    assert validate_trace(doc) == []
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    other = doc["otherData"]
    assert (other["source"], other["clock"], other["timestamps"], other["guest"]) == \
        ("skb-report.txt", "mono", "ns", "b")
    assert other["events"] == len(parse_report(fixture(name)).events) > 2900
    assert other["lines_skipped"] == 0 and other["overlapping_slices_dropped"] == 0


@pytest.mark.parametrize("name", SKB)
def test_one_flow_per_packet_followed_end_to_end(name: str) -> None:
    doc = export(name)
    followed = followed_packets(name)
    starts = phases(doc, "s")
    assert len(starts) == len(followed) == doc["otherData"]["flows"] > 0
    assert sorted(e["id"] for e in starts) == sorted(p.id for p in followed)
    assert doc["otherData"]["flows_not_drawn"] == {}
    assert {e["name"] for e in starts} == {FLOW_NAME} and {e["cat"] for e in starts} == {FLOW_CAT}
    assert len(phases(doc, "f")) == len(followed)


@pytest.mark.parametrize("name", SKB)
def test_flow_steps_are_in_time_order_and_perfetto_binds_them_to_the_stage_slices(name: str) -> None:
    doc = export(name)
    _, bound, dropped = perfetto_import(doc)
    assert dropped == 0
    steps: dict[int, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "t", "f"):
            steps.setdefault(e["id"], []).append(e)
    by_id = {p.id: p for p in followed_packets(name)}
    for fid, evs in steps.items():
        p = by_id[fid]
        assert [e["ph"] for e in evs] == ["s", "t", "t", "t", "f"] and evs[-1]["bp"] == "e"
        assert [ns(e["ts"]) for e in evs] == sorted(ns(e["ts"]) for e in evs)
        names = [s["name"] for s in bound[fid]]
        expected = RX_NAMES if p.dir == "rx" else TX_NAMES
        assert names[1:] == expected[1:], (fid, names)
        assert names[0] in (("napi_gro_receive", "netif_receive_skb_entry", "netif_rx") if p.dir == "rx"
                            else ("tcp_sendmsg",))
        for e, s in zip(evs, bound[fid]):  # bound to the slice that starts at the flow event, on its CPU
            assert s["tid"] == e["tid"] and s["ts"] == ns(e["ts"]) < s["end"]
        point_ts = [p.point(x) for x in (("entry", "netif", "ip", "tcp", "copy") if p.dir == "rx"
                                         else ("app", "tcp", "ip", "dev", "xmit"))]
        assert [ns(e["ts"]) for e in evs] == point_ts


def test_rx_export_has_irq_softirq_napi_and_stage_slices() -> None:
    doc = export("rx-e1000-gro.txt.gz")
    xs = phases(doc, "X")
    names = {(e["cat"], e["name"]) for e in xs}
    assert {("softirq", "NET_RX"), ("irq", "eth2"), ("irq", "eth1"), ("napi", "napi poll eth2"),
            ("skb.rx", "napi_gro_receive"), ("skb.rx", "netif_receive_skb"), ("skb.rx", "ip_rcv_core"),
            ("skb.rx", "tcp_v4_rcv"), ("skb.rx", "skb_copy_datagram_iovec"), ("skb.rx", "skb_try_coalesce")} <= names
    text = fixture("rx-e1000-gro.txt.gz")
    assert sum(e["name"] == "NET_RX" for e in xs) == text.count("softirq_entry:        vec=3 [action=NET_RX]") - 1
    # one CPU track, named, in the guest's process
    meta = phases(doc, "M")
    assert {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": "b CPUs"}} in meta
    assert {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID_BASE, "args": {"name": "CPU 0"}} in meta
    assert {e["tid"] for e in doc["traceEvents"] if e["ph"] != "M"} == {TID_BASE}


def test_timestamps_are_microseconds_of_the_nanosecond_trace() -> None:
    doc = export("rx-e1000-gro.txt.gz")
    # 90.878072366: ip_rcv_core  skb=0xffff88801ef33a00
    ip = next(e for e in phases(doc, "X") if e["name"] == "ip_rcv_core")
    assert ns(ip["ts"]) == 90_878_072_366 and ip["ts"] == pytest.approx(90_878_072.366, abs=1e-6)
    assert ip["args"]["skb"] == "0xffff88801ef33a00" and ip["args"]["until"] == "next event"
    assert ns(ip["dur"]) == 90_878_095_910 - 90_878_072_366  # up to the next event on CPU 0
    # 90.878263533 napi_gro_receive_entry ... 90.878275114 napi_gro_receive_exit ret=3
    gro = next(e for e in phases(doc, "X") if e["name"] == "napi_gro_receive")
    assert (ns(gro["ts"]), ns(gro["dur"])) == (90_878_263_533, 11_581)
    assert gro["args"]["skbaddr"] == "0xffff88801ef33d00" and gro["args"]["ret"] == 3
    # every time reads back as a whole number of nanoseconds close to ns/1000
    for e in doc["traceEvents"]:
        for key in ("ts", "dur"):
            if key in e:
                assert abs(e[key] * 1000 - ns(e[key])) < 1e-3


def test_point_slices_carry_the_packet_and_its_stage_latency() -> None:
    name = "rx-virtio.txt.gz"
    doc = export(name)
    own = [p for p in followed_packets(name) if p.head is None and p.into is None and not p.members]
    p = own[10]
    ip = next(e for e in phases(doc, "X") if e["name"] == "ip_rcv_core" and e["args"].get("packet") == p.id)
    assert ip["args"]["followed"] is True and ip["args"]["stage"] == "netif_receive_skb → IP"
    assert ip["args"]["stage_us"] == round(stage_times(p)["netif_ip"] / 1000, 3)
    copy_ = next(e for e in phases(doc, "X") if e["name"] == "skb_copy_datagram_iovec"
                 and e["args"].get("packet") == p.id)
    assert copy_["args"]["stage"] == "TCP → app (copy)"
    # packets that were not followed keep their slices, marked, and get no flow
    flows = {e["id"] for e in phases(doc, "s")}
    marked = [e for e in phases(doc, "X") if e["args"].get("followed") is False]
    assert marked and all(e["args"]["not_followed"] and e["args"]["packet"] not in flows for e in marked)


def test_transmit_export_starts_flows_at_the_write_and_ends_at_the_driver() -> None:
    doc = export("tx-virtio-gso.txt.gz")
    names = {e["name"] for e in phases(doc, "X")}
    assert set(TX_NAMES) | {"ip_output", "net_dev_queue", "NET_RX"} <= names
    send = next(e for e in phases(doc, "X") if e["name"] == "tcp_sendmsg")
    assert send["args"]["size"] == 131072 and len(send["args"]["other_packets"]) >= 5
    assert doc["otherData"]["followed"] == {"rx": 0, "tx": 47}


def test_napi_poll_runs_from_softirq_entry_or_the_previous_poll_to_its_event() -> None:
    doc = export("rx-virtio.txt.gz")
    xs = phases(doc, "X")
    polls = [e for e in xs if e["cat"] == "napi"]
    assert {e["args"]["start"] for e in polls} == {"NET_RX softirq entry", "end of the previous poll"}
    net_rx = [e for e in xs if e["name"] == "NET_RX"]
    for poll in polls:
        owner = [s for s in net_rx if ns(s["ts"]) <= ns(poll["ts"]) and
                 ns(poll["ts"]) + ns(poll["dur"]) <= ns(s["ts"]) + ns(s["dur"])]
        assert len(owner) == 1
        if poll["args"]["start"] == "NET_RX softirq entry":
            assert ns(poll["ts"]) == ns(owner[0]["ts"])
    text = fixture("rx-virtio.txt.gz")
    instants = [e for e in phases(doc, "i") if e["name"] == "napi_poll"]
    assert len(polls) + len(instants) == text.count(": napi_poll: ")


def test_trace_with_lost_events_marks_the_gaps_and_pairs_nothing_across_them() -> None:
    name = "rx-e1000-drops-oldprobes.txt.gz"
    doc = export(name)
    log = parse_report(fixture(name))
    lost = [e for e in phases(doc, "i") if e["name"] == "events lost"]
    assert len(lost) == len(log.drops) == doc["otherData"]["drop_markers"] == 8
    counts = [e["args"]["count"] for e in lost]
    assert sum(c for c in counts if c != "unknown") == log.dropped_events == doc["otherData"]["dropped_events"] > 0
    for gap in lost:  # no IRQ/softirq/GRO slice spans a gap
        t = ns(gap["ts"])
        assert not [e for e in phases(doc, "X") if e["cat"] in ("irq", "softirq", "napi") or
                    e["name"] == "napi_gro_receive" if ns(e["ts"]) < t < ns(e["ts"]) + ns(e["dur"])]
    assert doc["otherData"]["unmatched_entry_exit"] > 0
    assert any(e["args"].get("until") == "events lost" for e in phases(doc, "X"))


def test_point_slices_end_at_the_next_event_or_the_cap() -> None:
    doc = export("rx-rtl8139.txt.gz")
    points = [e for e in phases(doc, "X") if "until" in e["args"]]
    assert {e["args"]["until"] for e in points} >= {"next event", "cap"}
    assert all(ns(e["dur"]) == POINT_MAX_NS for e in points if e["args"]["until"] == "cap")
    assert all(0 < ns(e["dur"]) <= POINT_MAX_NS for e in points)


def test_an_event_at_the_same_nanosecond_as_a_flow_point_does_not_steal_the_binding() -> None:
    # a real trace with a softirq_raise copied in front of every ip_rcv_core, at the same time on the same CPU:
    # its instant must come after the flow events in the file, or Perfetto binds the flow to the instant
    lines = []
    for line in fixture("rx-virtio.txt.gz").splitlines():
        if ": ip_rcv_core:" in line:
            lines.append(line.split(" ip_rcv_core:")[0] + " softirq_raise:        vec=3 [action=NET_RX]")
        lines.append(line)
    doc = skb_trace("\n".join(lines), guest="b")
    assert validate_trace(doc) == [] and doc["otherData"]["flows"] == len(followed_packets("rx-virtio.txt.gz"))
    _, bound, dropped = perfetto_import(doc)
    assert dropped == 0
    assert all([s["name"] for s in slices][2] == "ip_rcv_core" for slices in bound.values())


def test_slices_that_would_cross_are_dropped_and_counted_not_exported() -> None:
    # a real trace whose first IRQ exit is moved into the NET_RX softirq that follows it (impossible, as
    # with corrupt input): the two slices would partially overlap, so the later one is left out
    text = fixture("rx-virtio.txt.gz").replace("157.605344964: irq_handler_exit", "157.605400000: irq_handler_exit")
    doc = skb_trace(text, guest="b")
    assert validate_trace(doc) == [] and perfetto_import(doc)[2] == 0
    assert doc["otherData"]["overlapping_slices_dropped"] >= 1
    assert not [e for e in phases(doc, "X") if e["name"] == "NET_RX" and ns(e["ts"]) == 157_605_352_778]


def test_export_is_deterministic() -> None:
    text = fixture("rx-rtl8139.txt.gz")
    assert json.dumps(skb_trace(text, guest="b")) == json.dumps(skb_trace(text, guest="b"))


def test_nic_selects_the_packets_drawn_as_flows() -> None:
    text = fixture("rx-rtl8139.txt.gz")
    assert skb_trace(text, guest="b", nic="eth1")["otherData"]["flows"] == len(followed_packets("rx-rtl8139.txt.gz"))
    other = skb_trace(text, guest="b", nic="eth9")
    assert other["otherData"]["flows"] == 0 and not phases(other, "s") and validate_trace(other) == []
    assert len(phases(other, "X")) == len(phases(export("rx-rtl8139.txt.gz"), "X"))


def test_odd_lines_are_skipped_and_counted_never_raised() -> None:
    lines = fixture("rx-virtio.txt.gz").splitlines()[:400]
    odd = "\n".join(["cpus=2", "version = 6", "garbage here", lines[5][:30], *lines[1:200],
                     "CPU:1 [EVENTS DROPPED]", "   sh-1 [001] 5.000000001: softirq_exit: vec=9 [action=RCU]",
                     "   sh-1 [001] 5.000000002: irq_handler_exit: irq=4 ret=handled", "", *lines[200:]])
    doc = skb_trace(odd, guest="b")
    assert validate_trace(doc) == []
    assert doc["otherData"]["lines_skipped"] == 2 and doc["otherData"]["cpus"] == 2
    assert doc["otherData"]["unmatched_entry_exit"] >= 2
    for text in ("", "\n\n", "nothing to see", "x-1 [000] 1.5: irq_handler_entry: irq=1 name=a"):
        empty = skb_trace(text, guest="b")
        assert validate_trace(empty) == [] and empty["otherData"]["flows"] == 0
        assert validate_trace(ftrace_trace(text, guest="b")) == []


# -- ftrace_trace ---------------------------------------------------------------------------------

def test_generic_report_in_microseconds_becomes_instants_on_each_cpu() -> None:
    text = (FIX / "trace" / "step" / "a" / "trace-report.txt").read_text()
    doc = ftrace_trace(text, guest="a")
    assert validate_trace(doc) == []
    instants = phases(doc, "i")
    assert len(instants) == 20 and not phases(doc, "X")
    first = instants[0]
    assert first == {"name": "net_dev_queue", "cat": "ftrace", "ph": "i", "s": "t", "ts": 242_729_773, "pid": PID,
                     "tid": TID_BASE + 1, "args": {"dev": "lo", "skbaddr": "0xffff88803fe25200", "len": 98,
                                                   "task": "ping-244"}}
    assert [e["args"]["name"] for e in phases(doc, "M") if e["name"] == "thread_name"] == ["CPU 0", "CPU 1"]
    other = doc["otherData"]
    assert (other["source"], other["clock"], other["timestamps"], other["events"]) == \
        ("trace-report.txt", "local", "us", 20)


def test_generic_report_pairs_irqs_and_softirqs_and_keeps_every_other_event() -> None:
    text = fixture("rx-e1000-gro.txt.gz")
    doc = ftrace_trace(text, guest="b")
    assert validate_trace(doc) == []
    xs = phases(doc, "X")
    assert {e["cat"] for e in xs} == {"irq", "softirq"} and {"NET_RX", "eth2"} <= {e["name"] for e in xs}
    assert 2 * len(xs) + len(phases(doc, "i")) == doc["otherData"]["events"]
    tcp = next(e for e in phases(doc, "i") if e["name"] == "tcp_v4_rcv")
    assert tcp["args"] == {"skb": "0xffff88801ef33a00", "len": 32, "doff": 128, "task": "iperf3-262"}
    assert ns(tcp["ts"]) == 90_878_134_322


# -- validate_trace on broken documents -------------------------------------------------------------

def broken() -> dict[str, Any]:
    return copy.deepcopy(export("rx-rtl8139.txt.gz"))


def one(problems: list[str], *words: str) -> None:
    assert any(all(w in p for w in words) for p in problems), problems


def test_unbalanced_begin_end_is_reported() -> None:
    doc = broken()
    doc["traceEvents"] += [{"name": "open", "ph": "B", "ts": 1, "pid": 7, "tid": 7},
                           {"name": "close", "ph": "E", "ts": 2, "pid": 8, "tid": 8},
                           {"name": "a", "ph": "B", "ts": 3, "pid": 9, "tid": 9},
                           {"name": "b", "ph": "E", "ts": 4, "pid": 9, "tid": 9}]
    problems = validate_trace(doc)
    one(problems, "'open'", "B never ended")
    one(problems, "'close'", "E without an open B")
    one(problems, "'b'", "ends", "'a'", "name differs")
    assert len(problems) == 3


def test_flow_without_start_and_flow_steps_out_of_place_are_reported() -> None:
    doc = broken()
    events = doc["traceEvents"]
    first = next(e for e in events if e["ph"] == "s")
    events.remove(first)
    problems = validate_trace(doc)
    one(problems, f"flow id {first['id']}", "no start")
    assert len(problems) == 1
    doc = broken()
    fid = next(e["id"] for e in doc["traceEvents"] if e["ph"] == "s")
    steps = [e for e in doc["traceEvents"] if e["ph"] in "stf" and e["id"] == fid]
    steps[-1]["ts"] = steps[0]["ts"] - 10_000  # the end before its start, before the first slice
    steps[1]["cat"] = "other"  # a step of another flow: no start, no end
    problems = validate_trace(doc)
    one(problems, f"flow id {fid}", "comes before its start")
    one(problems, f"flow id {fid}", "'other'", "no start")
    one(problems, f"flow id {fid}", "'other'", "no end")
    one(problems, f"flow id {fid}", "not inside a slice")


def test_partially_overlapping_and_negative_slices_are_reported() -> None:
    doc = broken()
    x = next(e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "NET_RX")
    doc["traceEvents"].append(dict(x, name="overlap", ts=x["ts"] + x["dur"] / 2, dur=x["dur"]))
    doc["traceEvents"].append(dict(x, name="backwards", dur=-1))
    problems = validate_trace(doc)
    one(problems, "'overlap'", "partially overlaps")
    one(problems, "'backwards'", "dur -1 is negative")
    assert len(problems) == 2


def test_missing_keys_bad_numbers_metadata_and_json_are_reported() -> None:
    doc = {"traceEvents": [
        {"name": "no-ts", "ph": "X", "dur": 1, "pid": 1, "tid": 1},
        {"name": "str-ts", "ph": "i", "ts": "5", "pid": 1, "tid": 1},
        {"name": "nan", "ph": "X", "ts": 1, "dur": float("nan"), "pid": 1, "tid": 1},
        {"name": "flow", "ph": "t", "ts": 1, "pid": 1, "tid": 1},
        {"name": "bad-bp", "ph": "f", "ts": 1, "pid": 1, "tid": 1, "id": 3, "cat": "c", "bp": "x"},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {}},
        {"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": "1"}},
        {"name": "mystery", "ph": "M", "pid": 1},
        {"name": "scope", "ph": "i", "ts": 1, "pid": 1, "tid": 1, "s": "x"},
        {"name": "no-tid", "ph": "X", "ts": 1, "dur": 1, "pid": 1},
        {"name": "z", "ph": "Q", "ts": 1, "pid": 1, "tid": 1},
        "not an event",
    ], "displayTimeUnit": "s", "otherData": {"x": {1, 2}}}
    problems = validate_trace(doc)
    for words in (("not JSON-serialisable",), ("'no-ts'", "ts is missing"), ("'str-ts'", "ts is missing"),
                  ("'nan'", "dur is missing or not a finite"), ("'flow'", "without an id"),
                  ("'flow'", "without a cat"), ("'bad-bp'", "bp 'x'"), ("'thread_name'", "args.name"),
                  ("'process_sort_index'", "args.sort_index"), ("'mystery'", "unknown metadata"),
                  ("'scope'", "scope"), ("'no-tid'", "tid is missing"), ("ph 'Q'",), ("[11]", "not a JSON object"),
                  ("displayTimeUnit",)):
        one(problems, *words)
    assert validate_trace([]) == ["the document is not a JSON object"]  # type: ignore[arg-type]
    assert validate_trace({"otherData": {}}) == ["traceEvents is missing or not a list"]


def test_times_are_checked_as_perfetto_reads_them() -> None:
    # both end at 90878073.367 µs in decimal, but Perfetto reads 1.001 µs as 1000 ns (1.001 * 1000.0
    # truncated), so the parent ends 1 ns before its child: the exporter nudges such values by an ulp
    parent: dict[str, Any] = {"name": "p", "ph": "X", "ts": 90_878_072.366, "dur": 1.001, "pid": 1, "tid": 1}
    child: dict[str, Any] = {"name": "c", "ph": "X", "ts": 90_878_072.367, "dur": 1.0, "pid": 1, "tid": 1}
    assert ns(child["ts"]) + ns(child["dur"]) == ns(parent["ts"]) + ns(parent["dur"]) + 1
    one(validate_trace({"traceEvents": [parent, child]}), "'c'", "partially overlaps", "'p'")
    nudged = dict(parent, dur=math.nextafter(1.001, math.inf))
    assert ns(nudged["dur"]) == 1001 and validate_trace({"traceEvents": [nudged, child]}) == []


# -- write_trace --------------------------------------------------------------------------------------

def test_write_trace_writes_compact_json_atomically(tmp_path: Path) -> None:
    doc = export("tx-virtio-gso.txt.gz")
    out = tmp_path / "trace.json"
    out.write_text("old")
    assert write_trace(doc, out) == out
    text = out.read_text()
    assert json.loads(text) == doc and ", " not in text[:200] and "\n" not in text
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]
    with pytest.raises(LabctlError, match="not JSON"):
        write_trace({"traceEvents": [{"x": float("inf")}]}, out)
    assert json.loads(out.read_text()) == doc  # the old file is untouched
    with pytest.raises(LabctlError, match="cannot write"):
        write_trace(doc, tmp_path / "missing" / "trace.json")
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_write_trace_gzips_a_gz_path_reproducibly(tmp_path: Path) -> None:
    doc = export("tx-virtio-gso.txt.gz")
    out = write_trace(doc, tmp_path / "trace.json.gz")
    data = out.read_bytes()
    assert data[:2] == b"\x1f\x8b" and json.loads(gzip.decompress(data)) == doc
    assert len(data) < len(json.dumps(doc)) / 4
    assert write_trace(doc, tmp_path / "again.json.gz").read_bytes() == data  # no time stamp in the header
