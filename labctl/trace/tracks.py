"""One trace-cmd recording as per-CPU tracks of Trace Event Format slices, instants and flows.

:class:`Builder` holds the events of a parsed ``trace-cmd report``
(:mod:`labctl.trace.skbevents`) and turns them into a document: entry/exit
pairs become slices (:meth:`Builder.pair`), ``napi_poll`` events inside a
``NET_RX`` softirq become poll slices, single events become short point
slices or instants, ring-buffer gaps become ``events lost`` instants, and
slices that would partially overlap are dropped (:meth:`Builder.nest`), all
in the order Perfetto reads them (:meth:`Builder.document`). What is drawn
and why is :mod:`labctl.trace.perfetto`'s docstring.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from labctl.trace.skbevents import Event, TraceLog
from labctl.trace.skbpath import Packet
from labctl.trace.tef import TraceArg, TraceEvent
from labctl.trace.tef import us as _us

PID = 1  # the guest's "<guest> CPUs" process
TID_BASE = 1000  # CPU n is thread TID_BASE + n
POINT_MAX_NS = 100_000  # a point slice ends at the next event on its CPU, or after this
FLOW_CAT = "skb.flow"
FLOW_NAME = "packet"
SKB_CLOCK = "mono"  # skb_latency records with trace-cmd -C mono (labctl.trace.skbprobes)
FTRACE_CLOCK = "local"  # trace-cmd's default clock: per CPU, not comparable across CPUs
MAX_CPUS = 1024  # a larger cpus=N header is not believed: only CPUs with events get a track

_HEADER = re.compile(r"^\s*(?:cpus=\d+|version\s*=\s*\S+|CPU\s*\d+ is empty|trace-cmd:.*)\s*$")
_CPUS = re.compile(r"^\s*cpus=(\d+)\s*$", re.MULTILINE)
_DROP_LINE = re.compile(r"^\s*CPU:\s*\d+\s+\[(?:\d+\s+)?EVENTS DROPPED\]")
_TS_DIGITS = re.compile(r"\[\d+\]\s+(?:\S+\s+)?\d+\.(\d+):")
_DECIMAL = re.compile(r"-?\d+")


class TraceOther(TypedDict):
    """A per-CPU trace's ``otherData`` (:meth:`Builder.other_data`; the ``skb_latency`` one adds the rest)."""

    generator: str
    source: str
    guest: str
    clock: str
    timestamps: str  # "us", "ns", "N decimals" or "unknown"
    cpus: int
    events: int
    lines_skipped: int
    unparsed_event_lines: int
    dropped_events: int
    drop_markers: int
    slices: dict[str, int]  # category -> slices
    instants: int
    unmatched_entry_exit: int
    overlapping_slices_dropped: int
    flows: int
    nic: NotRequired[str]  # skb_latency: the NIC whose packets are flows, or "all but mgmt0"
    packets: NotRequired[dict[str, int]]  # skb_latency: "rx"/"tx" -> packets
    followed: NotRequired[dict[str, int]]  # skb_latency: "rx"/"tx" -> packets followed end to end
    flows_not_drawn: NotRequired[dict[str, int]]  # skb_latency: reason -> flows


class TraceDoc(TypedDict):
    """A recording's Trace Event Format document (:meth:`Builder.document`)."""

    traceEvents: list[TraceEvent]
    displayTimeUnit: str
    otherData: TraceOther


@dataclass(frozen=True)
class PairKind:
    """Events that open and close one slice on a CPU (``key``: a field both must agree on)."""

    entry: str
    exit: str
    key: str | None
    cat: str
    title: str | None  # the slice name; None: from the entry's fields (IRQ handler, softirq action)


IRQ = PairKind("irq_handler_entry", "irq_handler_exit", "irq", "irq", None)
SOFTIRQ = PairKind("softirq_entry", "softirq_exit", "vec", "softirq", None)


@dataclass
class Slice:
    cpu: int
    ts: int  # ns
    dur: int  # ns
    name: str
    cat: str
    args: dict[str, TraceArg]
    seq: int

    @property
    def end(self) -> int:
        return self.ts + self.dur


@dataclass
class Instant:
    cpu: int
    ts: int
    name: str
    cat: str
    args: dict[str, TraceArg]
    seq: int


@dataclass
class Flow:
    packet: Packet
    steps: list[Slice]


def field_value(text: str) -> str | int:
    """A trace field as an arg: decimal numbers as ints, everything else (hex addresses too) as text."""
    return int(text) if _DECIMAL.fullmatch(text) and len(text) < 16 else text


def event_args(ev: Event) -> dict[str, TraceArg]:
    args: dict[str, TraceArg] = {k: field_value(v) for k, v in ev.fields.items()}
    args["task"] = f"{ev.comm}-{ev.pid}"
    return args


class Builder:
    """Slices, instants and flows of one trace, per CPU, in the order Perfetto will read them."""

    def __init__(self, text: str, log: TraceLog) -> None:
        self.log = log
        self.events = log.events
        self.used = [False] * len(log.events)
        self.slices: list[Slice] = []
        self.instants: list[Instant] = []
        self.flows: list[Flow] = []
        self.of_event: dict[int, Slice] = {}  # event index -> the slice it starts
        self.counts: Counter[str] = Counter()
        self.not_drawn: Counter[str] = Counter()
        self._seq = 0
        cpus = _CPUS.search(text)
        self.cpus = set(range(int(cpus[1]))) if cpus and int(cpus[1]) <= MAX_CPUS else set()
        self.cpus |= {ev.cpu for ev in log.events} | {d.cpu for d in log.drops}
        self.cpu_ts: dict[int, list[int]] = {}
        for ev in log.events:
            self.cpu_ts.setdefault(ev.cpu, []).append(ev.ts)
        self.gap_ts = {(d.cpu, d.ts) for d in log.drops}

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def slice(self, cpu: int, ts: int, dur: int, name: str, cat: str, args: dict[str, TraceArg],
              event: int | None = None) -> Slice:
        s = Slice(cpu, ts, dur, name, cat, args, self._next_seq())
        self.slices.append(s)
        if event is not None:
            self.of_event[event] = s
            self.used[event] = True
        return s

    def instant(self, i: int, note: str | None = None) -> None:
        ev = self.events[i]
        args = event_args(ev)
        if note:
            args["unmatched"] = note
            self.counts["unmatched"] += 1
        self.instants.append(Instant(ev.cpu, ev.ts, ev.name, "ftrace", args, self._next_seq()))
        self.used[i] = True

    # -- entry/exit pairs ------------------------------------------------------
    def pair(self, kinds: Iterable[PairKind]) -> list[tuple[int, str]]:
        """Slices for the entry/exit pairs of ``kinds`` on each CPU; returns the entries left unpaired.

        A second entry of a kind before the exit, a ring-buffer gap on the
        CPU, or the end of the trace leaves the open entry unpaired. An exit
        without its entry (or with another ``key``) becomes an instant.
        """
        by_entry = {k.entry: k for k in kinds}
        by_exit = {k.exit: k for k in by_entry.values()}
        open_: dict[tuple[int, str], int] = {}
        unpaired: list[tuple[int, str]] = []
        drops = sorted(self.log.drops, key=lambda d: (d.ts, d.cpu))
        di = 0
        for i, ev in enumerate(self.events):
            while di < len(drops) and drops[di].ts <= ev.ts:
                gone = sorted(key for key in open_ if key[0] == drops[di].cpu)
                unpaired += [(open_.pop(key), "events were lost before its exit") for key in gone]
                di += 1
            if ev.name in by_entry:
                kind = by_entry[ev.name]
                prev = open_.pop((ev.cpu, kind.entry), None)
                if prev is not None:
                    unpaired.append((prev, "another entry came before its exit"))
                open_[(ev.cpu, kind.entry)] = i
            elif ev.name in by_exit:
                kind = by_exit[ev.name]
                start = open_.get((ev.cpu, kind.entry))
                if start is None or (kind.key is not None and
                                     self.events[start].fields.get(kind.key) != ev.fields.get(kind.key)):
                    self.instant(i, "its entry was not traced")
                    continue
                del open_[(ev.cpu, kind.entry)]
                self._pair_slice(kind, start, i)
        unpaired += [(i, "no exit before the trace ended") for _, i in sorted(open_.items())]
        return sorted(unpaired)

    def _pair_slice(self, kind: PairKind, start: int, end: int) -> None:
        entry, exit_ = self.events[start], self.events[end]
        args = event_args(entry)
        for k, v in exit_.fields.items():
            if args.get(k) != field_value(v):
                args[k if k not in args else f"exit_{k}"] = field_value(v)
        if kind is IRQ:
            name = entry.fields.get("name") or f"irq {entry.fields.get('irq', '?')}"
        elif kind is SOFTIRQ:
            name = entry.fields.get("action") or f"softirq {entry.fields.get('vec', '?')}"
        else:
            name = kind.title or entry.name
        self.slice(entry.cpu, entry.ts, exit_.ts - entry.ts, name, kind.cat, args, start)
        self.used[end] = True
        self.counts[f"slices.{kind.cat}"] += 1

    # -- NAPI polls --------------------------------------------------------------
    def napi_polls(self) -> None:
        """A poll slice for each ``napi_poll`` inside a NET_RX softirq (see the module docstring)."""
        net_rx: dict[int, list[Slice]] = {}
        for s in sorted(self.slices, key=lambda s: (s.ts, s.seq)):
            if s.cat == "softirq" and s.name == "NET_RX":
                net_rx.setdefault(s.cpu, []).append(s)
        starts = {cpu: [s.ts for s in lst] for cpu, lst in net_rx.items()}
        last_poll: dict[int, int] = {}  # softirq slice seq -> end of its latest poll
        for i, ev in enumerate(self.events):
            if ev.name != "napi_poll" or self.used[i]:
                continue
            k = bisect_left(starts.get(ev.cpu, []), ev.ts) - 1
            softirq = net_rx[ev.cpu][k] if k >= 0 else None
            if softirq is None or ev.ts > softirq.end:
                continue  # left for the instants
            begin = last_poll.get(softirq.seq, softirq.ts)
            if ev.ts <= begin:
                continue
            args = event_args(ev)
            args["start"] = "end of the previous poll" if softirq.seq in last_poll else "NET_RX softirq entry"
            self.slice(ev.cpu, begin, ev.ts - begin, f"napi poll {ev.fields.get('dev', '?')}", "napi", args, i)
            last_poll[softirq.seq] = ev.ts
            self.counts["slices.napi"] += 1

    # -- points ------------------------------------------------------------------
    def point(self, i: int, name: str, cat: str, note: str | None = None) -> None:
        """A short slice from event ``i`` to the next event on its CPU (see the module docstring)."""
        ev = self.events[i]
        times = self.cpu_ts[ev.cpu]
        k = bisect_right(times, ev.ts)
        if k == len(times):
            dur, until = 1, "end of trace"
        elif (ev.cpu, times[k]) in self.gap_ts:
            dur, until = 1, "events lost"
        elif times[k] - ev.ts > POINT_MAX_NS:
            dur, until = POINT_MAX_NS, "cap"
        else:
            dur, until = times[k] - ev.ts, "next event"
        args = event_args(ev)
        args["until"] = until
        if note:
            args["exit"] = f"not traced: {note}"
            self.counts["unmatched"] += 1
        self.slice(ev.cpu, ev.ts, dur, name, cat, args, i)
        self.counts[f"slices.{cat}"] += 1

    def rest_as_instants(self) -> None:
        for i, used in enumerate(self.used):
            if not used:
                self.instant(i)

    def drop_markers(self) -> None:
        for d in sorted(self.log.drops, key=lambda d: (d.ts, d.cpu)):
            args: dict[str, TraceArg] = {"count": d.count if d.count is not None else "unknown"}
            self.instants.append(Instant(d.cpu, d.ts, "events lost", "ftrace.loss", args, self._next_seq()))

    # -- nesting -------------------------------------------------------------------
    def nest(self) -> None:
        """Drop (and count) every slice that would partially overlap one before it on its CPU."""
        kept: list[Slice] = []
        stacks: dict[int, list[Slice]] = {}
        for s in sorted(self.slices, key=slice_order):
            stack = stacks.setdefault(s.cpu, [])
            while stack and stack[-1].end <= s.ts:
                stack.pop()
            if stack and s.end > stack[-1].end:
                self.counts["overlapping_slices_dropped"] += 1
                continue
            stack.append(s)
            kept.append(s)
        self.slices = kept
        alive = {id(s) for s in kept}
        self.of_event = {i: s for i, s in self.of_event.items() if id(s) in alive}

    # -- the document ------------------------------------------------------------
    def document(self, guest: str, other: TraceOther) -> TraceDoc:
        meta: list[TraceEvent] = [
            {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": f"{guest} CPUs"}},
            {"name": "process_sort_index", "ph": "M", "pid": PID, "args": {"sort_index": 0}},
        ]
        for cpu in sorted(self.cpus):
            meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": TID_BASE + cpu,
                         "args": {"name": f"CPU {cpu}"}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": TID_BASE + cpu,
                         "args": {"sort_index": cpu}})
        timed: list[tuple[tuple[int, int, int, int], TraceEvent]] = []
        for s in self.slices:
            timed.append(((s.ts, 0, -s.dur, s.seq), {
                "name": s.name, "cat": s.cat, "ph": "X", "ts": _us(s.ts), "dur": _us(s.dur),
                "pid": PID, "tid": TID_BASE + s.cpu, "args": s.args}))
        seq = self._seq
        for flow in self.flows:
            last = len(flow.steps) - 1
            for k, step in enumerate(flow.steps):
                seq += 1
                ev: TraceEvent = {"name": FLOW_NAME, "cat": FLOW_CAT, "ph": "s" if k == 0 else "f" if k == last
                                      else "t", "id": flow.packet.id, "ts": _us(step.ts), "pid": PID,
                                      "tid": TID_BASE + step.cpu}
                if k == last:
                    ev["bp"] = "e"
                timed.append(((step.ts, 1, 0, seq), ev))
        for inst in self.instants:
            timed.append(((inst.ts, 2, 0, inst.seq), {
                "name": inst.name, "cat": inst.cat, "ph": "i", "s": "t", "ts": _us(inst.ts),
                "pid": PID, "tid": TID_BASE + inst.cpu, "args": inst.args}))
        timed.sort(key=lambda t: t[0])
        return {"traceEvents": meta + [ev for _, ev in timed], "displayTimeUnit": "ns", "otherData": other}

    def other_data(self, text: str, source: str, guest: str, clock: str) -> TraceOther:
        slices = Counter(s.cat for s in self.slices)
        return {
            "generator": "labctl.trace.perfetto",
            "source": source,
            "guest": guest,
            "clock": clock,
            "timestamps": _resolution(text),
            "cpus": len(self.cpus),
            "events": len(self.events),
            "lines_skipped": _skipped_lines(text, len(self.events)),
            "unparsed_event_lines": self.log.unparsed,
            "dropped_events": self.log.dropped_events,
            "drop_markers": len(self.log.drops),
            "slices": dict(sorted(slices.items())),
            "instants": len(self.instants),
            "unmatched_entry_exit": self.counts["unmatched"],
            "overlapping_slices_dropped": self.counts["overlapping_slices_dropped"],
            "flows": len(self.flows),
        }


def slice_order(s: Slice) -> tuple[int, int, int]:
    """Perfetto's order for slices: by start, the longest first at the same start, then file order."""
    return (s.ts, -s.dur, s.seq)


def _resolution(text: str) -> str:
    m = _TS_DIGITS.search(text)
    if m is None:
        return "unknown"
    return {6: "us", 9: "ns"}.get(len(m[1]), f"{len(m[1])} decimals")


def _skipped_lines(text: str, events: int) -> int:
    """Non-blank lines that are neither events (``events`` were read), drop markers nor trace-cmd headers."""
    lines = sum(1 for line in text.splitlines() if line.strip() and not _HEADER.match(line) and
                not _DROP_LINE.match(line))
    return lines - events
