"""A step's followed packets, from the raw files in ``<step>/follow/`` to ``journey.json`` and a timeline.

``follow/inputs.json`` (:func:`follow_inputs`) keeps what the step measured besides each guest's
events (``follow/<guest>.txt``): the filter, the followed guests, the topology and labctl's
impairments, the VLAN devices, each guest's clock samples, the frames the wire captures matched (and
their VLAN tags), events lost and the rulesets before and after. :func:`analyze` makes the journeys from them
(:mod:`labctl.trace.journey`) and writes ``journey.json`` (every packet's path, the paths grouped,
the clocks' bounds) and ``journey-trace.json.gz`` (Perfetto: one track per guest, each hop a short
slice, a flow arrow carrying each packet from hop to hop and kernel to kernel; the wire hops on a
track of their own), and returns the step's summary piece.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from labctl.pktfilter import FilterError, Vlan, parse, vlan_of
from labctl.trace.clocks import Clock, ClockFit
from labctl.trace.drops import netfilter_note
from labctl.trace.hops import parse_text
from labctl.trace.journey import Correlator
from labctl.trace.pathmodel import Journey, JourneyRecord, PathRecord, Topology, Totals, Wire, paths, totals
from labctl.trace.tef import TraceArg, TraceEvent, us, write_trace
from labctl.trace.xdphops import apply_step as apply_xdp

FOLLOW_DIR = "follow"
FOLLOW_INPUTS = "inputs.json"
JOURNEY_JSON = "journey.json"
JOURNEY_TRACE = "journey-trace.json.gz"
PACKETS_KEPT = 2000  # journey.json's packets (the paths count them all)
PATHS_IN_SUMMARY = 12
HOP_NS = 100  # a hop's slice in the timeline


def _key_out(key: tuple[object, ...]) -> list[Any]:
    return [list(k) if isinstance(k, tuple) else k for k in key]


def _key_in(value: list[Any]) -> tuple[object, ...]:
    return tuple(tuple(k) if isinstance(k, list) else k for k in value)


def follow_inputs(filt: str, guests: list[str], topo: Topology, samples: dict[str, dict[str, tuple[int, int]]],
                  wire: Wire, lost: dict[str, int], rulesets: dict[str, tuple[str, str]],
                  reasons: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """What ``follow/inputs.json`` holds (JSON)."""
    return {"filter": filt, "guests": guests,
            "nets": [[g, n, net] for (g, n), net in topo.nets.items()],
            "impair": [[g, n, v] for (g, n), v in topo.impair.items()],
            "ifaces": [[g, n, v] for (g, n), v in topo.ifaces.items()],
            "vlans": [[g, n, v] for (g, n), v in topo.vlans.items()],
            "samples": {g: {m: list(v) for m, v in s.items()} for g, s in samples.items()},
            "captured": [list(k) for k in sorted(wire.captured)],
            "wire": [[g, n, [[_key_out(k), t] for k, t in seen.items()]] for (g, n), seen in wire.seen.items()],
            "wire_tags": [[g, n, [[_key_out(k), sorted(v)] for k, v in tags.items()]] for (g, n), tags in wire.tags.items()],
            "lost": lost, "rulesets": {g: list(r) for g, r in rulesets.items()},
            **({"reasons": reasons} if reasons else {})}


def read_inputs(data: dict[str, Any]) -> tuple[Topology, Wire]:
    """The topology and the wire's frames of ``follow/inputs.json``."""
    guests = tuple(str(g) for g in data.get("guests") or [])
    topo = Topology({(str(g), str(n)): str(net) for g, n, net in data.get("nets") or []},
                    {(str(g), str(n)): dict(v) for g, n, v in data.get("impair") or []}, guests,
                    {(str(g), str(n)): str(v) for g, n, v in data.get("ifaces") or []},
                    {(str(g), str(n)): int(v) for g, n, v in data.get("vlans") or []})
    wire = Wire({(str(g), str(n)): {_key_in(k): list(t) for k, t in seen} for g, n, seen in data.get("wire") or []},
                {(str(g), str(n)) for g, n in data.get("captured") or []},
                {(str(g), str(n)): {_key_in(k): {int(v) for v in vids} for k, vids in tags}
                 for g, n, tags in data.get("wire_tags") or []})
    return topo, wire


def _vlan(filt: object) -> Vlan | None:
    """The step's filter's ``vlan [ID]`` (the journeys kept), None without one."""
    try:
        return vlan_of(parse(str(filt or "")))
    except FilterError:
        return None


class Facts(TypedDict):
    """What surrounds a step's journeys: its filter, guests, clocks, lost events and warnings."""

    filter: str
    guests: list[str]
    clocks: dict[str, ClockFit]  # guest -> its clock's fit (labctl.trace.clocks.Clock.as_dict)
    lost_events: dict[str, int]
    warnings: list[str]


class FollowSummary(Facts):
    """A step's follow in summary.json (:func:`analyze`): the facts, totals, the first paths, and
    the two files written beside them."""

    totals: Totals
    paths: list[PathRecord]
    journey: str
    timeline: str


class JourneyFile(Facts):
    """``journey.json``: the facts, totals, every path and the first :data:`PACKETS_KEPT` packets."""

    totals: Totals
    paths: list[PathRecord]
    packets: list[JourneyRecord]


class TimelineOther(TypedDict):
    """The timeline's ``otherData``."""

    source: str
    filter: str
    packets: int


class TimelineDoc(TypedDict):
    """``journey-trace.json.gz``, in Trace Event Format (:func:`timeline`)."""

    traceEvents: list[TraceEvent]
    displayTimeUnit: str
    otherData: TimelineOther


def journeys_of(step_dir: Path) -> tuple[list[Journey], Facts] | None:
    """The journeys of a step's follow (None when it has none), and the facts around them."""
    d = step_dir / FOLLOW_DIR
    try:
        data = json.loads((d / FOLLOW_INPUTS).read_text())
    except (OSError, ValueError):
        return None
    topo, wire = read_inputs(data)
    clocks: dict[str, Clock] = {}
    events = []
    for g in topo.guests:
        try:
            text = (d / f"{g}.txt").read_text(errors="replace")
        except OSError:
            continue
        evs, _ = parse_text(text, g)
        samples = {m: (int(v[0]), int(v[1])) for m, v in (data.get("samples") or {}).get(g, {}).items()}
        clocks[g] = Clock.from_samples(samples, [e for e in evs if e.point == "marker"])
        events += [e for e in evs if e.point != "marker"]
    notes = {g: n for g, (before, after) in (data.get("rulesets") or {}).items()
             if (n := netfilter_note(before, after))}
    reasons = {str(g): [str(n) for n in names] for g, names in (data.get("reasons") or {}).items()
               if isinstance(names, list)}
    rulesets = {str(g): (str(r[0]), str(r[1])) for g, r in (data.get("rulesets") or {}).items() if len(r) == 2}
    corr = Correlator(topo, clocks, wire, notes, reasons=reasons, rulesets={g: r[0] for g, r in rulesets.items()},
                      rulesets_after={g: r[1] for g, r in rulesets.items()}, vlan=_vlan(data.get("filter")))
    for ev in sorted(events, key=lambda e: clocks[e.guest].host(e.ts) if e.guest in clocks else e.ts):
        corr.add(ev)
    facts: Facts = {"filter": str(data.get("filter") or ""), "guests": list(topo.guests),
             "clocks": {g: c.as_dict() for g, c in clocks.items()}, "lost_events": data.get("lost") or {},
             "warnings": data.get("warnings") or []}
    js = corr.settle(None)
    apply_xdp(d, list(topo.guests), js)  # XDP verdicts: hops and ends (labctl.trace.xdphops)
    return js, facts


def analyze(step_dir: Path) -> FollowSummary | None:
    """``journey.json`` and the timeline written into ``step_dir``; the summary piece (None: no follow)."""
    got = journeys_of(step_dir)
    if got is None:
        return None
    js, facts = got
    grouped, counted = paths(js), totals(js)
    doc: JourneyFile = {"filter": facts["filter"], "guests": facts["guests"], "clocks": facts["clocks"],
                        "lost_events": facts["lost_events"], "warnings": facts["warnings"], "totals": counted,
                        "paths": grouped, "packets": [j.as_dict() for j in js[:PACKETS_KEPT]]}
    (step_dir / JOURNEY_JSON).write_text(json.dumps(doc, indent=1) + "\n")
    write_trace(timeline(js, facts), step_dir / JOURNEY_TRACE)
    return {"filter": facts["filter"], "guests": facts["guests"], "clocks": facts["clocks"],
            "lost_events": facts["lost_events"], "warnings": facts["warnings"], "totals": counted,
            "paths": grouped[:PATHS_IN_SUMMARY], "journey": str(JOURNEY_JSON), "timeline": str(JOURNEY_TRACE)}


def timeline(js: list[Journey], facts: Facts) -> TimelineDoc:
    """The journeys in Trace Event Format: a process per guest (its kernel's hops), one for the wire,
    a flow per packet through all its hops."""
    guests = list(facts.get("guests") or [])
    pids = {g: i + 1 for i, g in enumerate(guests)}
    wire_pid = len(guests) + 1
    meta: list[TraceEvent] = []
    for g, pid in pids.items():
        meta += [{"ph": "M", "pid": pid, "tid": 1, "name": "process_name", "args": {"name": f"{g} kernel"}},
                 {"ph": "M", "pid": pid, "tid": 1, "name": "thread_name", "args": {"name": "hops"}},
                 {"ph": "M", "pid": pid, "tid": 1, "name": "process_sort_index", "args": {"sort_index": pid}}]
    meta += [{"ph": "M", "pid": wire_pid, "tid": 1, "name": "process_name", "args": {"name": "wire"}},
             {"ph": "M", "pid": wire_pid, "tid": 1, "name": "process_sort_index", "args": {"sort_index": wire_pid}}]
    t0 = min((j.start for j in js if j.hops), default=0)
    slices: list[TraceEvent] = []
    flows: list[TraceEvent] = []
    taken: set[tuple[int, int]] = set()
    for j in js:
        points = []
        for i, h in enumerate(j.hops):
            pid = wire_pid if h.point == "wire" else pids.get(h.guest, wire_pid)
            ts = h.t - t0
            if (pid, ts) in taken:  # another hop at the same nanosecond on this track: no flow through it
                continue
            taken.add((pid, ts))
            args: dict[str, TraceArg | None] = {"packet": j.header.describe(), "id": j.id, "dev": h.dev,
                                                "note": h.note or None}
            if i == len(j.hops) - 1:
                args["end"] = j.end.text
            slices.append({"ph": "X", "pid": pid, "tid": 1, "ts": us(ts), "dur": us(HOP_NS), "cat": "hop",
                           "name": f"{h.where} {h.dev}" if h.dev else h.where,
                           "args": {k: v for k, v in args.items() if v is not None}})
            points.append((pid, ts))
        for i, (pid, ts) in enumerate(points if len(points) > 1 else []):
            ph = "s" if i == 0 else "f" if i == len(points) - 1 else "t"
            ev: TraceEvent = {"ph": ph, "pid": pid, "tid": 1, "ts": us(ts), "id": j.id, "cat": "packet", "name": "packet"}
            if ph == "f":
                ev["bp"] = "e"
            flows.append(ev)
    return {"traceEvents": meta + slices + flows, "displayTimeUnit": "ns",
            "otherData": {"source": "labctl follow", "filter": facts.get("filter", ""), "packets": len(js)}}
