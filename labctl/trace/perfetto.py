"""Recorded traces as Trace Event Format JSON, for ui.perfetto.dev: per-CPU slices and per-packet flows.

:func:`skb_trace` turns the ``skb_latency`` recording (``skb-report.txt``,
``trace-cmd report -t``) into a waterfall of the network stack. There is one
process, ``<guest> CPUs``, with one thread track per CPU, and these slices on
each track:

* **hard IRQs** (``irq_handler_entry`` → ``irq_handler_exit``, named after the
  handler, e.g. ``eth2``) and **softirqs** (``softirq_entry`` → ``softirq_exit``,
  named after the vector's action: ``NET_RX``, ``NET_TX``, ``TIMER`` ...);
* **NAPI polls**: ``napi:napi_poll`` fires when a poll *returns*, and the
  start of a poll is not traced. Inside a ``NET_RX`` softirq, net_rx_action
  runs the polls one after another, so a poll is drawn from the softirq's
  entry (first poll) or from the previous poll's end, up to its own event.
  That is an upper bound: it includes net_rx_action's own work between
  polls (``args.start`` says which bound was used). A ``napi_poll`` outside
  any ``NET_RX`` softirq, such as busy polling, or one whose softirq entry
  was not traced, cannot be given a start and is an instant event;
* **functions whose entry and exit are both traced**: ``napi_gro_receive``
  (``ret`` is GRO's verdict), ``napi_gro_frags``, ``netif_rx``,
  ``netif_receive_skb`` called by a driver (``netif_receive_skb_entry``/``_exit``),
  and ``skb_try_coalesce`` (kprobe + kretprobe);
* **stack points traced at one moment** (``netif_receive_skb``, ``ip_rcv_core``,
  ``tcp_v4_rcv``, ``skb_copy_datagram_iovec``, ``tcp_sendmsg``, ``__tcp_transmit_skb``,
  ``__ip_queue_xmit``, ``ip_output``, ``__dev_queue_xmit``, ``net_dev_queue``,
  ``net_dev_xmit``, and an entry event whose exit is missing). Only their
  start is known, so each slice runs until the next event recorded on
  the same CPU, and ``args.until`` says where it ends. The slice then covers
  the CPU's time up to the next traced thing, which is not the function's
  duration. It is cut at :data:`POINT_MAX_NS` (``until: "cap"``), so a point
  followed by an idle gap does not look like work. A point right before a
  ring-buffer gap, or the last event of its CPU, gets 1 ns (``until:
  "events lost"`` / ``"end of trace"``).

A slice of a packet's point carries the skb address, the length and the
packet's id (:mod:`labctl.trace.skbpath` numbering), whether the packet was
followed end to end (or why not), and for a followed packet the latency of
the stage that ends at this point (``stage``, ``stage_us``; the first point
has ``end_to_end_us``). Other packets that pass through the same event
(frames GRO merged into this head, segments coalesced into this skb, the
segments of one ``tcp_sendmsg``) are listed in ``other_packets``.

Every packet followed end to end (:func:`labctl.trace.skblatency.why_not_followed`
is None) becomes one flow: ``s`` at its first point, ``t`` at each middle point and
``f`` at its last, each on the CPU where that point was traced, so the UI
draws arrows across CPUs. Receive: driver/GRO entry → netif_receive_skb →
ip_rcv_core → tcp_v4_rcv → the copy to the reader. Transmit: tcp_sendmsg →
__tcp_transmit_skb → __ip_queue_xmit → __dev_queue_xmit → net_dev_xmit. Packets
that were not followed get no flow. Their point slices still say ``followed:
false`` and why. If a followed packet's flow cannot be bound to its slices
(a slice was dropped for overlapping, or another slice starts at the same
nanosecond on that CPU), the flow is left out and counted in
``otherData.flows_not_drawn``, so no flow is ever drawn where the trace
does not show one. ``nic`` picks the packets that become flows: those on
that NIC, or, when None, those on any NIC but labctl's ``mgmt0``. The slices
show everything.

:func:`ftrace_trace` turns a generic ``trace-cmd report`` (``trace-report.txt``,
micro- or nanosecond timestamps) into the same per-CPU tracks with IRQ and
softirq slices, and every other event as an instant on its CPU with its
fields as args.

In both, ring-buffer gaps (``[N EVENTS DROPPED]``) are instants named
``events lost``. No slice is paired across a gap: an entry whose exit may have
been lost becomes an instant (IRQ/softirq) or a point (stack function).
Nothing raises on odd input. Lines that are neither events, drop markers nor
``trace-cmd`` headers are skipped and counted in ``otherData``, together with
the source file, the clock and the number of events, slices, instants and flows.
The same input always gives the same document.

The Trace Event Format rules followed here, and checked by :func:`validate_trace`.
They come from the format's definition (Google's "Trace Event Format" document)
and from how Perfetto's JSON importer reads it (``json_trace_parser``,
``slice_tracker``, ``flow_tracker`` and ``trace_sorter`` in Perfetto's trace
processor):

* The document is a JSON object. Its events are in ``traceEvents``; the optional
  ``displayTimeUnit`` (``"ms"`` or ``"ns"``) only changes how times are shown, and
  ``otherData`` holds free-form metadata about the trace.
* Each event names its phase in ``ph``, its track in ``pid``/``tid`` and its time in
  ``ts``, a number of microseconds that may have a fraction. A complete event
  (``X``) also has ``dur``, again in microseconds. Events need not be sorted.
* ``B``/``E`` pairs open and close a slice on one thread, innermost first.
* On one thread, slices (``X`` or ``B``/``E``) either nest completely or do not
  overlap. Perfetto treats a slice as ``[ts, ts + dur)`` and drops a slice that
  starts inside another and ends after it.
* An instant event (``i``) has no duration. Its scope ``s`` is ``g`` (global),
  ``p`` (process) or ``t`` (thread, the default).
* Flow events ``s`` (start), ``t`` (step) and ``f`` (end) belong together when
  they have the same ``id``. Perfetto also matches ``cat`` and ``name``, so a
  flow keeps all three. A start or a step binds to the slice that encloses
  its ``ts`` on its own thread. An end binds to the next slice that begins on
  its thread, unless ``bp: "e"`` binds it to the enclosing slice.
* Metadata events (``M``) name things: ``process_name`` and ``thread_name`` take
  ``args.name``; ``process_sort_index`` and ``thread_sort_index`` take
  ``args.sort_index``.
* Perfetto reads a numeric ``ts``/``dur`` as ``int(value * 1000.0)`` nanoseconds
  (truncated). The exporter nudges a microsecond value up by a float ulp
  where that truncation would lose a nanosecond (:func:`_us`). The validator
  compares times as Perfetto reads them.
* Perfetto processes events in time order. At the same ``ts``, ``E`` events come
  first, then ``X`` slices longest first, then the other events in file order. A flow event binds to
  the slice on top of its thread's stack, and that stack is not trimmed
  for the flow event. So every flow event here sits exactly at the start of
  its slice, after the slices and before the instants in the file.
"""

from __future__ import annotations

import json
import math
import os
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

from labctl.errors import LabctlError
from labctl.trace.skbevents import Event, TraceLog, parse_report
from labctl.trace.skblatency import MGMT_NIC, REPORT, why_not_followed
from labctl.trace.skbpath import RX_POINTS, RX_STAGES, RX_START, STAGE_TITLES, TX_POINTS, TX_STAGES, Packet, follow

FTRACE_REPORT = "trace-report.txt"
TRACE_JSON = "trace.json"
PID = 1  # the guest's "<guest> CPUs" process
TID_BASE = 1000  # CPU n is thread TID_BASE + n
POINT_MAX_NS = 100_000  # a point slice ends at the next event on its CPU, or after this
FLOW_CAT = "skb.flow"
FLOW_NAME = "packet"
SKB_CLOCK = "mono"  # skb_latency records with trace-cmd -C mono (labctl.trace.skbprobes)
FTRACE_CLOCK = "local"  # trace-cmd's default clock: per CPU, not comparable across CPUs
MAX_PROBLEMS = 200
MAX_CPUS = 1024  # a larger cpus=N header is not believed: only CPUs with events get a track

_HEADER = re.compile(r"^\s*(?:cpus=\d+|version\s*=\s*\S+|CPU\s*\d+ is empty|trace-cmd:.*)\s*$")
_CPUS = re.compile(r"^\s*cpus=(\d+)\s*$", re.MULTILINE)
_DROP_LINE = re.compile(r"^\s*CPU:\s*\d+\s+\[(?:\d+\s+)?EVENTS DROPPED\]")
_TS_DIGITS = re.compile(r"\[\d+\]\s+(?:\S+\s+)?\d+\.(\d+):")
_DECIMAL = re.compile(r"-?\d+")


# --------------------------------------------------------------------------- what becomes a slice


@dataclass(frozen=True)
class _PairKind:
    """Events that open and close one slice on a CPU (``key``: a field both must agree on)."""

    entry: str
    exit: str
    key: str | None
    cat: str
    title: str | None  # the slice name; None: from the entry's fields (IRQ handler, softirq action)


_IRQ = _PairKind("irq_handler_entry", "irq_handler_exit", "irq", "irq", None)
_SOFTIRQ = _PairKind("softirq_entry", "softirq_exit", "vec", "softirq", None)
_STACK_PAIRS = (
    _PairKind("napi_gro_receive_entry", "napi_gro_receive_exit", None, "skb.rx", "napi_gro_receive"),
    _PairKind("napi_gro_frags_entry", "napi_gro_frags_exit", None, "skb.rx", "napi_gro_frags"),
    _PairKind("netif_receive_skb_entry", "netif_receive_skb_exit", None, "skb.rx", "netif_receive_skb_entry"),
    _PairKind("netif_rx_entry", "netif_rx_exit", None, "skb.rx", "netif_rx"),
    _PairKind("skb_try_coalesce", "skb_try_coalesce_ret", None, "skb.rx", "skb_try_coalesce"),
)
# events traced at one moment that become short slices in skb_trace: event -> (slice name, category)
_POINT_SLICES = {
    "netif_receive_skb": ("netif_receive_skb", "skb.rx"),
    "ip_rcv_core": ("ip_rcv_core", "skb.rx"),
    "tcp_v4_rcv": ("tcp_v4_rcv", "skb.rx"),
    "skb_copy_datagram_iovec": ("skb_copy_datagram_iovec", "skb.rx"),
    "tcp_sendmsg": ("tcp_sendmsg", "skb.tx"),
    "tcp_transmit_skb": ("__tcp_transmit_skb", "skb.tx"),
    "ip_queue_xmit": ("__ip_queue_xmit", "skb.tx"),
    "ip_output": ("ip_output", "skb.tx"),
    "dev_queue_xmit": ("__dev_queue_xmit", "skb.tx"),
    "net_dev_queue": ("net_dev_queue", "skb.tx"),
    "net_dev_xmit": ("net_dev_xmit", "skb.tx"),
}
# skbpath's points -> the events that record them
_POINT_EVENTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("rx", "entry"): RX_START, ("rx", "netif"): ("netif_receive_skb",), ("rx", "ip"): ("ip_rcv_core",),
    ("rx", "tcp"): ("tcp_v4_rcv",), ("rx", "copy"): ("skb_copy_datagram_iovec",),
    ("tx", "app"): ("tcp_sendmsg",), ("tx", "tcp"): ("tcp_transmit_skb",), ("tx", "ip"): ("ip_queue_xmit",),
    ("tx", "dev"): ("dev_queue_xmit",), ("tx", "xmit"): ("net_dev_xmit",),
}


# --------------------------------------------------------------------------- time


def _us(ns: int) -> int | float:
    """``ns`` as microseconds, exact as Perfetto reads them back (``int(us * 1000.0)`` == ``ns``).

    Whole microseconds are ints. Otherwise ``ns / 1000`` goes up by one float ulp at
    a time (at most 4) while the truncating read would give one nanosecond less.
    """
    if ns % 1000 == 0:
        return ns // 1000
    us = ns / 1000
    for _ in range(4):
        if math.trunc(us * 1000.0) >= ns:
            break
        us = math.nextafter(us, math.inf)
    return us


def _read_ns(value: Any) -> int | None:
    """A ``ts``/``dur`` as Perfetto's importer reads it, in integer ns (None: not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value * 1000
    if not math.isfinite(value):
        return None
    return math.trunc(value * 1000.0)


# --------------------------------------------------------------------------- building


@dataclass
class _Slice:
    cpu: int
    ts: int  # ns
    dur: int  # ns
    name: str
    cat: str
    args: dict[str, Any]
    seq: int

    @property
    def end(self) -> int:
        return self.ts + self.dur


@dataclass
class _Instant:
    cpu: int
    ts: int
    name: str
    cat: str
    args: dict[str, Any]
    seq: int


@dataclass
class _Flow:
    packet: Packet
    steps: list[_Slice]


def _value(text: str) -> str | int:
    """A trace field as an arg: decimal numbers as ints, everything else (hex addresses too) as text."""
    return int(text) if _DECIMAL.fullmatch(text) and len(text) < 16 else text


def _fields(ev: Event) -> dict[str, Any]:
    args: dict[str, Any] = {k: _value(v) for k, v in ev.fields.items()}
    args["task"] = f"{ev.comm}-{ev.pid}"
    return args


class _Builder:
    """Slices, instants and flows of one trace, per CPU, in the order Perfetto will read them."""

    def __init__(self, text: str, log: TraceLog) -> None:
        self.log = log
        self.events = log.events
        self.used = [False] * len(log.events)
        self.slices: list[_Slice] = []
        self.instants: list[_Instant] = []
        self.flows: list[_Flow] = []
        self.of_event: dict[int, _Slice] = {}  # event index -> the slice it starts
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

    def slice(self, cpu: int, ts: int, dur: int, name: str, cat: str, args: dict[str, Any],
              event: int | None = None) -> _Slice:
        s = _Slice(cpu, ts, dur, name, cat, args, self._next_seq())
        self.slices.append(s)
        if event is not None:
            self.of_event[event] = s
            self.used[event] = True
        return s

    def instant(self, i: int, note: str | None = None) -> None:
        ev = self.events[i]
        args = _fields(ev)
        if note:
            args["unmatched"] = note
            self.counts["unmatched"] += 1
        self.instants.append(_Instant(ev.cpu, ev.ts, ev.name, "ftrace", args, self._next_seq()))
        self.used[i] = True

    # -- entry/exit pairs ------------------------------------------------------
    def pair(self, kinds: Iterable[_PairKind]) -> list[tuple[int, str]]:
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

    def _pair_slice(self, kind: _PairKind, start: int, end: int) -> None:
        entry, exit_ = self.events[start], self.events[end]
        args = _fields(entry)
        for k, v in exit_.fields.items():
            if args.get(k) != _value(v):
                args[k if k not in args else f"exit_{k}"] = _value(v)
        if kind is _IRQ:
            name = entry.fields.get("name") or f"irq {entry.fields.get('irq', '?')}"
        elif kind is _SOFTIRQ:
            name = entry.fields.get("action") or f"softirq {entry.fields.get('vec', '?')}"
        else:
            name = kind.title or entry.name
        self.slice(entry.cpu, entry.ts, exit_.ts - entry.ts, name, kind.cat, args, start)
        self.used[end] = True
        self.counts[f"slices.{kind.cat}"] += 1

    # -- NAPI polls --------------------------------------------------------------
    def napi_polls(self) -> None:
        """A poll slice for each ``napi_poll`` inside a NET_RX softirq (see the module docstring)."""
        net_rx: dict[int, list[_Slice]] = {}
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
            args = _fields(ev)
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
        args = _fields(ev)
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
            args: dict[str, Any] = {"count": d.count if d.count is not None else "unknown"}
            self.instants.append(_Instant(d.cpu, d.ts, "events lost", "ftrace.loss", args, self._next_seq()))

    # -- nesting -------------------------------------------------------------------
    def nest(self) -> None:
        """Drop (and count) every slice that would partially overlap one before it on its CPU."""
        kept: list[_Slice] = []
        stacks: dict[int, list[_Slice]] = {}
        for s in sorted(self.slices, key=_slice_order):
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
    def document(self, guest: str, other: dict[str, Any]) -> dict[str, Any]:
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": f"{guest} CPUs"}},
            {"name": "process_sort_index", "ph": "M", "pid": PID, "args": {"sort_index": 0}},
        ]
        for cpu in sorted(self.cpus):
            meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": TID_BASE + cpu,
                         "args": {"name": f"CPU {cpu}"}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": TID_BASE + cpu,
                         "args": {"sort_index": cpu}})
        timed: list[tuple[tuple[int, int, int, int], dict[str, Any]]] = []
        for s in self.slices:
            timed.append(((s.ts, 0, -s.dur, s.seq), {
                "name": s.name, "cat": s.cat, "ph": "X", "ts": _us(s.ts), "dur": _us(s.dur),
                "pid": PID, "tid": TID_BASE + s.cpu, "args": s.args}))
        seq = self._seq
        for flow in self.flows:
            last = len(flow.steps) - 1
            for k, step in enumerate(flow.steps):
                seq += 1
                ev: dict[str, Any] = {"name": FLOW_NAME, "cat": FLOW_CAT, "ph": "s" if k == 0 else "f" if k == last
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

    def other_data(self, text: str, source: str, guest: str, clock: str) -> dict[str, Any]:
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


def _slice_order(s: _Slice) -> tuple[int, int, int]:
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


# --------------------------------------------------------------------------- packets


class _Packets:
    """Where each packet's points are in the trace, and the flows of the followed ones."""

    def __init__(self, b: _Builder, packets: list[Packet]) -> None:
        self.b = b
        self.packets = sorted(packets, key=lambda p: p.id)
        self.at: dict[tuple[str, int], list[int]] = {}
        for i, ev in enumerate(b.events):
            self.at.setdefault((ev.name, ev.ts), []).append(i)
        self._events: dict[tuple[int, str], int | None] = {}

    def event_of(self, p: Packet, point: str) -> int | None:
        """The index of the event that recorded ``p``'s ``point`` (its own, its GRO head's or its target's)."""
        if (p.id, point) not in self._events:
            self._events[(p.id, point)] = self._find(p, point)
        return self._events[(p.id, point)]

    def _find(self, p: Packet, point: str) -> int | None:
        ts = p.point(point)
        if ts is None:
            return None
        cands = [i for name in _POINT_EVENTS[(p.dir, point)] for i in self.at.get((name, ts), [])]
        if len(cands) > 1:
            addrs = {q.addr for q in (p, p.head, p.into) if q is not None}
            match = [i for i in cands if (self.b.events[i].addr("skbaddr") or self.b.events[i].addr("skb")) in addrs]
            cands = match or cands
        return min(cands) if cands else None

    def annotate(self) -> None:
        """Packet ids, followed or why not, and stage latency in the args of the point slices."""
        users: dict[int, list[tuple[Packet, str]]] = {}
        for p in self.packets:
            for point in _points(p):
                i = self.event_of(p, point)
                if i is not None:
                    users.setdefault(i, []).append((p, point))
        for i, use in sorted(users.items()):
            s = self.b.of_event.get(i)
            if s is None:
                continue
            own = [u for u in use if u[1] in u[0].t]
            p, point = (own or use)[0]
            s.args.update(_packet_args(p, point))
            others = sorted({q.id for q, _ in use} - {p.id})
            if others:
                s.args["other_packets"] = others

    def flows(self, nic: str | None) -> None:
        """One flow per packet followed end to end on ``nic`` (None: every NIC but mgmt0)."""
        top: dict[tuple[int, int], _Slice] = {}
        for s in sorted(self.b.slices, key=_slice_order):
            top[(s.cpu, s.ts)] = s  # the one Perfetto has on top of the CPU's stack at that time
        for p in self.packets:
            if (p.dev == nic if nic is not None else p.dev != MGMT_NIC) and why_not_followed(p) is None:
                steps, reason = self._steps(p, top)
                if reason is None:
                    self.b.flows.append(_Flow(p, steps))
                else:
                    self.b.not_drawn[reason] += 1

    def _steps(self, p: Packet, top: dict[tuple[int, int], _Slice]) -> tuple[list[_Slice], str | None]:
        steps: list[_Slice] = []
        for point in _points(p):
            i = self.event_of(p, point)
            s = self.b.of_event.get(i) if i is not None else None
            if s is None:
                return steps, f"no slice for its {point} point"
            if top.get((s.cpu, s.ts)) is not s or s.dur <= 0:
                return steps, "another slice starts at the same time on its CPU"
            steps.append(s)
        if any(b.ts < a.ts for a, b in pairwise(steps)):
            return steps, "its points are out of order"
        return steps, None


def _points(p: Packet) -> tuple[str, ...]:
    return RX_POINTS if p.dir == "rx" else TX_POINTS


def _packet_args(p: Packet, point: str) -> dict[str, Any]:
    args: dict[str, Any] = {"packet": p.id, "dir": p.dir, "point": point}
    if p.dev is not None:
        args["nic"] = p.dev
    reason = why_not_followed(p)
    args["followed"] = reason is None
    if reason is not None:
        args["not_followed"] = reason
        return args
    points = _points(p)
    if point == points[0]:
        first, last = p.point(points[0]), p.point(points[-1])
        if first is not None and last is not None:
            args["end_to_end_us"] = round((last - first) / 1000, 3)
    for name, a, b in RX_STAGES if p.dir == "rx" else TX_STAGES:
        if b == point:
            ta, tb = p.point(a), p.point(b)
            if ta is not None and tb is not None:
                args["stage"] = STAGE_TITLES[name]
                args["stage_us"] = round((tb - ta) / 1000, 3)
    return args


# --------------------------------------------------------------------------- public API


def skb_trace(text: str, *, guest: str, nic: str | None = None, source: str = REPORT) -> dict[str, Any]:
    """The ``skb_latency`` recording (``trace-cmd report -t`` text) as a Trace Event Format document.

    See the module docstring for what is drawn. ``nic`` picks the packets drawn
    as flows (None: all but ``mgmt0``). ``source`` is the file name reported in
    ``otherData``. Never raises on odd input.
    """
    log = parse_report(text)
    corr = follow(log)
    b = _Builder(text, log)
    stack_entries = {k.entry: k for k in _STACK_PAIRS}
    for i, note in b.pair((_IRQ, _SOFTIRQ, *_STACK_PAIRS)):
        kind = stack_entries.get(b.events[i].name)
        if kind is not None:
            b.point(i, kind.title or kind.entry, kind.cat, note)
        else:
            b.instant(i, note)
    b.napi_polls()
    for i, ev in enumerate(b.events):
        if not b.used[i] and ev.name in _POINT_SLICES:
            b.point(i, *_POINT_SLICES[ev.name])
    b.rest_as_instants()
    b.drop_markers()
    b.nest()
    packets = _Packets(b, corr.rx + corr.tx)
    packets.annotate()
    packets.flows(nic)
    other = b.other_data(text, source, guest, SKB_CLOCK)
    followed = [p for p in packets.packets if why_not_followed(p) is None]
    other.update({
        "nic": nic if nic is not None else f"all but {MGMT_NIC}",
        "packets": {"rx": len(corr.rx), "tx": len(corr.tx)},
        "followed": {"rx": sum(p.dir == "rx" for p in followed), "tx": sum(p.dir == "tx" for p in followed)},
        "flows_not_drawn": dict(sorted(b.not_drawn.items())),
    })
    return b.document(guest, other)


def ftrace_trace(text: str, *, guest: str, source: str = FTRACE_REPORT, clock: str = FTRACE_CLOCK) -> dict[str, Any]:
    """A generic ``trace-cmd report`` as a Trace Event Format document.

    IRQ and softirq slices per CPU, and every other event as an instant on its CPU
    with its fields as args. ``source`` and ``clock`` go into ``otherData``. The
    default clock is trace-cmd's own, ``local``, when ``record`` got no ``-C``.
    Never raises on odd input.
    """
    log = parse_report(text)
    b = _Builder(text, log)
    for i, note in b.pair((_IRQ, _SOFTIRQ)):
        b.instant(i, note)
    b.rest_as_instants()
    b.drop_markers()
    b.nest()
    return b.document(guest, b.other_data(text, source, guest, clock))


def write_trace(doc: dict[str, Any], path: Path) -> Path:
    """Write ``doc`` as compact JSON to ``path`` atomically (temporary file + rename); returns ``path``.

    :raise LabctlError: the document is not JSON-serialisable or the file cannot be written.
    """
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise LabctlError(f"cannot write {path}: the trace is not JSON: {exc}") from exc
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise LabctlError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


# --------------------------------------------------------------------------- validation

_PHASES = frozenset("BEXiICbneSTpFstfPNODMVvRc()")
_META_ARGS = {"process_name": ("name", str), "process_labels": ("labels", str), "thread_name": ("name", str),
              "process_sort_index": ("sort_index", int), "thread_sort_index": ("sort_index", int)}
_Track = tuple[Any, Any]


@dataclass
class _Checked:
    """An event that passed the per-event checks, with its times as Perfetto reads them."""

    idx: int
    ph: str
    name: str
    track: _Track
    ts: int
    dur: int = 0
    ev: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"traceEvents[{self.idx}] {self.ph} {self.name!r}"


def _where(track: _Track) -> str:
    return f"pid {track[0]} tid {track[1]}"


def _event_problems(idx: int, ev: Any) -> tuple[list[str], _Checked | None]:
    """The problems of one event on its own, and the event when it can take part in the track checks."""
    if not isinstance(ev, dict):
        return [f"traceEvents[{idx}] is not a JSON object"], None
    ph = ev.get("ph")
    if not isinstance(ph, str) or ph not in _PHASES:
        return [f"traceEvents[{idx}]: ph {ph!r} is not a phase of the format"], None
    name = ev.get("name")
    label = f"traceEvents[{idx}] {ph} {name!r}"
    out: list[str] = []
    if ph != "E" and not isinstance(name, str):
        out.append(f"{label}: name is missing or not a string")
    if "args" in ev and not isinstance(ev["args"], dict):
        out.append(f"{label}: args is not an object")
    if ph == "M":
        return out + _meta_problems(label, ev), None
    for key in ("pid", "tid"):
        if isinstance(ev.get(key), bool) or not isinstance(ev.get(key), int):
            out.append(f"{label}: {key} is missing or not an integer")
    ts = _read_ns(ev.get("ts"))
    if ts is None:
        out.append(f"{label}: ts is missing or not a finite number of microseconds")
    dur = 0
    if ph == "X":
        d = _read_ns(ev.get("dur"))
        if d is None:
            out.append(f"{label}: dur is missing or not a finite number of microseconds")
        elif d < 0:
            out.append(f"{label}: dur {ev['dur']} is negative")
        dur = d if d is not None else 0
    if ph in ("i", "I") and ev.get("s", "t") not in ("g", "p", "t"):
        out.append(f"{label}: instant scope s {ev.get('s')!r} is not g, p or t")
    if ph in ("s", "t", "f"):
        if "id" not in ev or isinstance(ev["id"], bool) or not isinstance(ev["id"], (int, str)):
            out.append(f"{label}: flow event without an id")
        if not isinstance(ev.get("cat"), str):
            out.append(f"{label}: flow event without a cat")
        if "bp" in ev and ev["bp"] != "e":
            out.append(f"{label}: bp {ev['bp']!r} is not 'e'")
    if out or ts is None:
        return out, None
    return out, _Checked(idx, ph, str(name) if name is not None else "", (ev["pid"], ev["tid"]), ts, dur, ev)


def _meta_problems(label: str, ev: dict[str, Any]) -> list[str]:
    name = ev.get("name")
    if name not in _META_ARGS:
        return [f"{label}: unknown metadata event (known: {', '.join(sorted(_META_ARGS))})"]
    out = []
    if isinstance(ev.get("pid"), bool) or not isinstance(ev.get("pid"), int):
        out.append(f"{label}: pid is missing or not an integer")
    if str(name).startswith("thread_") and (isinstance(ev.get("tid"), bool) or not isinstance(ev.get("tid"), int)):
        out.append(f"{label}: tid is missing or not an integer")
    key, typ = _META_ARGS[str(name)]
    args = ev.get("args")
    value = args.get(key) if isinstance(args, dict) else None
    if not isinstance(value, typ) or isinstance(value, bool):
        out.append(f"{label}: args.{key} is missing or not a{'n integer' if typ is int else ' string'}")
    return out


def _begin_end(events: list[_Checked]) -> tuple[list[str], list[tuple[int, int, str]]]:
    """B/E balance per track; returns the problems and the slices (start, end, label) B/E pairs make."""
    out: list[str] = []
    slices: list[tuple[int, int, str]] = []
    stack: list[_Checked] = []
    for e in sorted(events, key=lambda e: (e.ts, 0 if e.ph == "E" else 1, e.idx)):
        if e.ph == "B":
            stack.append(e)
            continue
        if not stack:
            out.append(f"{e.label} on {_where(e.track)}: E without an open B")
            continue
        b = stack.pop()
        if e.name and e.name != b.name:
            out.append(f"{e.label} on {_where(e.track)} ends {b.label}, whose name differs")
        slices.append((b.ts, e.ts, b.label))
    out += [f"{b.label} on {_where(b.track)}: B never ended by an E" for b in stack]
    return out, slices


def _nesting(track: _Track, slices: list[tuple[int, int, str]]) -> list[str]:
    out: list[str] = []
    stack: list[tuple[int, int, str]] = []
    for s in sorted(slices, key=lambda s: (s[0], s[0] - s[1])):
        while stack and stack[-1][1] <= s[0]:
            stack.pop()
        if stack and s[1] > stack[-1][1]:
            out.append(f"{s[2]} on {_where(track)} [{s[0] / 1000}, {s[1] / 1000}) µs partially overlaps "
                       f"{stack[-1][2]} [{stack[-1][0] / 1000}, {stack[-1][1] / 1000}) µs")
            continue
        stack.append(s)
    return out


class _Enclosing:
    """Whether a time falls inside a slice of a track, or a slice begins at or after it."""

    def __init__(self, slices: list[tuple[int, int, str]]) -> None:
        ordered = sorted(slices)
        self.starts = [s[0] for s in ordered]
        self.max_end = list(accumulate((s[1] for s in ordered), max))

    def inside(self, ts: int) -> bool:
        k = bisect_right(self.starts, ts)
        return k > 0 and self.max_end[k - 1] > ts

    def next_begins(self, ts: int) -> bool:
        return bisect_left(self.starts, ts) < len(self.starts)


def _flow_problems(flows: dict[tuple[str, Any], list[_Checked]],
                   enclosing: dict[_Track, _Enclosing]) -> list[str]:
    out: list[str] = []
    for (cat, fid), evs in sorted(flows.items(), key=lambda kv: kv[1][0].idx):
        what = f"flow id {fid!r} cat {cat!r}"
        starts = [e for e in evs if e.ph == "s"]
        ends = [e for e in evs if e.ph == "f"]
        if not starts:
            out.append(f"{what}: no start (s) for {evs[0].label}")
        elif len(starts) > 1:
            out.append(f"{what}: {len(starts)} starts (s)")
        if not ends:
            out.append(f"{what}: no end (f)")
        elif len(ends) > 1:
            out.append(f"{what}: {len(ends)} ends (f)")
        if len({e.name for e in evs}) > 1:
            out.append(f"{what}: its events have different names ({', '.join(sorted({e.name for e in evs}))})")
        for s in starts[:1]:
            out += [f"{what}: {e.label} comes before its start {s.label}" for e in evs
                    if e.ph != "s" and e.ts < s.ts]
        for f in ends[:1]:
            out += [f"{what}: {e.label} comes after its end {f.label}" for e in evs if e.ph == "t" and e.ts > f.ts]
        for e in evs:
            enc = enclosing.get(e.track)
            if e.ph == "f" and e.ev.get("bp") != "e":
                if enc is None or not enc.next_begins(e.ts):
                    out.append(f"{what}: {e.label} on {_where(e.track)} has no slice after it to bind to")
            elif enc is None or not enc.inside(e.ts):
                out.append(f"{what}: {e.label} at {e.ts / 1000} µs is not inside a slice on {_where(e.track)}")
    return out


def validate_trace(doc: dict[str, Any]) -> list[str]:
    """Problems of ``doc`` against the Trace Event Format rules in the module docstring ([] when valid).

    Checks the document's shape and that it serialises to JSON (no NaN); per
    event the keys each phase needs, numeric ``ts``/``dur`` and ``dur`` >= 0,
    flow ``id``/``cat``, metadata ``args``; per track balanced ``B``/``E`` and
    slices that nest (times as Perfetto reads them); per flow (same ``cat`` and
    ``id``) one ``s`` before every ``t`` and one ``f``, the same name, and each step
    inside a slice of its own track (an ``f`` without ``bp: "e"``: a slice begins
    after it). At most :data:`MAX_PROBLEMS` are listed.
    """
    if not isinstance(doc, dict):
        return ["the document is not a JSON object"]
    out: list[str] = []
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        out.append(f"the document is not JSON-serialisable: {exc}")
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return out + ["traceEvents is missing or not a list"]
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        out.append(f"displayTimeUnit {doc['displayTimeUnit']!r} is not 'ms' or 'ns'")
    if "otherData" in doc and not isinstance(doc["otherData"], dict):
        out.append("otherData is not an object")
    slices: dict[_Track, list[tuple[int, int, str]]] = {}
    begin_end: dict[_Track, list[_Checked]] = {}
    flows: dict[tuple[str, Any], list[_Checked]] = {}
    for idx, ev in enumerate(events):
        problems, e = _event_problems(idx, ev)
        out += problems
        if e is None:
            continue
        if e.ph == "X" and e.dur >= 0:
            slices.setdefault(e.track, []).append((e.ts, e.ts + e.dur, e.label))
        elif e.ph in ("B", "E"):
            begin_end.setdefault(e.track, []).append(e)
        elif e.ph in ("s", "t", "f"):
            flows.setdefault((e.ev["cat"], e.ev["id"]), []).append(e)
    for track, evs in sorted(begin_end.items(), key=lambda kv: kv[1][0].idx):
        problems, made = _begin_end(evs)
        out += problems
        slices.setdefault(track, []).extend(made)
    for track, lst in sorted(slices.items(), key=lambda kv: str(kv[0])):
        out += _nesting(track, lst)
    out += _flow_problems(flows, {track: _Enclosing(lst) for track, lst in slices.items()})
    if len(out) > MAX_PROBLEMS:
        out = out[:MAX_PROBLEMS] + [f"... and {len(out) - MAX_PROBLEMS} more problems"]
    return out
