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

The documents follow the Trace Event Format rules of :mod:`labctl.trace.tef`,
whose :func:`~labctl.trace.tef.validate_trace` checks them.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Required, TypedDict

from labctl.trace.skbevents import parse_report
from labctl.trace.skblatency import MGMT_NIC, REPORT, why_not_followed
from labctl.trace.skbpath import RX_POINTS, RX_STAGES, RX_START, STAGE_TITLES, TX_POINTS, TX_STAGES, Packet, follow
from labctl.trace.tef import TraceArg
from labctl.trace.tracks import (
    FLOW_CAT,
    FLOW_NAME,
    IRQ,
    PID,
    POINT_MAX_NS,
    SOFTIRQ,
    TID_BASE,
    Builder,
    Flow,
    PairKind,
    Slice,
    TraceDoc,
    slice_order,
)

__all__ = ["FLOW_CAT", "FLOW_NAME", "FTRACE_REPORT", "PID", "POINT_MAX_NS", "TID_BASE", "TRACE_JSON", "TraceDoc",
           "TraceSummary", "ftrace_trace", "guest_trace", "skb_trace", "trace_summary"]

FTRACE_REPORT = "trace-report.txt"
TRACE_JSON = "trace.json.gz"  # gzipped: ui.perfetto.dev opens it as it is
SKB_CLOCK = "mono"  # skb_latency records with trace-cmd -C mono (labctl.trace.skbprobes)
FTRACE_CLOCK = "local"  # trace-cmd's default clock: per CPU, not comparable across CPUs

_STACK_PAIRS = (
    PairKind("napi_gro_receive_entry", "napi_gro_receive_exit", None, "skb.rx", "napi_gro_receive"),
    PairKind("napi_gro_frags_entry", "napi_gro_frags_exit", None, "skb.rx", "napi_gro_frags"),
    PairKind("netif_receive_skb_entry", "netif_receive_skb_exit", None, "skb.rx", "netif_receive_skb_entry"),
    PairKind("netif_rx_entry", "netif_rx_exit", None, "skb.rx", "netif_rx"),
    PairKind("skb_try_coalesce", "skb_try_coalesce_ret", None, "skb.rx", "skb_try_coalesce"),
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


# --------------------------------------------------------------------------- packets


class _Packets:
    """Where each packet's points are in the trace, and the flows of the followed ones."""

    def __init__(self, b: Builder, packets: list[Packet]) -> None:
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
        top: dict[tuple[int, int], Slice] = {}
        for s in sorted(self.b.slices, key=slice_order):
            top[(s.cpu, s.ts)] = s  # the one Perfetto has on top of the CPU's stack at that time
        for p in self.packets:
            if (p.dev == nic if nic is not None else p.dev != MGMT_NIC) and why_not_followed(p) is None:
                steps, reason = self._steps(p, top)
                if reason is None:
                    self.b.flows.append(Flow(p, steps))
                else:
                    self.b.not_drawn[reason] += 1

    def _steps(self, p: Packet, top: dict[tuple[int, int], Slice]) -> tuple[list[Slice], str | None]:
        steps: list[Slice] = []
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


def _packet_args(p: Packet, point: str) -> dict[str, TraceArg]:
    args: dict[str, TraceArg] = {"packet": p.id, "dir": p.dir, "point": point}
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


def skb_trace(text: str, *, guest: str, nic: str | None = None, source: str = REPORT) -> TraceDoc:
    """The ``skb_latency`` recording (``trace-cmd report -t`` text) as a Trace Event Format document.

    See the module docstring for what is drawn. ``nic`` picks the packets drawn
    as flows (None: all but ``mgmt0``). ``source`` is the file name reported in
    ``otherData``. Never raises on odd input.
    """
    log = parse_report(text)
    corr = follow(log)
    b = Builder(text, log)
    stack_entries = {k.entry: k for k in _STACK_PAIRS}
    for i, note in b.pair((IRQ, SOFTIRQ, *_STACK_PAIRS)):
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


def ftrace_trace(text: str, *, guest: str, source: str = FTRACE_REPORT, clock: str = FTRACE_CLOCK) -> TraceDoc:
    """A generic ``trace-cmd report`` as a Trace Event Format document.

    IRQ and softirq slices per CPU, and every other event as an instant on its CPU
    with its fields as args. ``source`` and ``clock`` go into ``otherData``. The
    default clock is trace-cmd's own, ``local``, when ``record`` got no ``-C``.
    Never raises on odd input.
    """
    log = parse_report(text)
    b = Builder(text, log)
    for i, note in b.pair((IRQ, SOFTIRQ)):
        b.instant(i, note)
    b.rest_as_instants()
    b.drop_markers()
    b.nest()
    return b.document(guest, b.other_data(text, source, guest, clock))


def guest_trace(guest_dir: Path, nic: str | None = None) -> TraceDoc | None:
    """The Trace Event Format document of a guest's step directory: its skb_latency recording, else its
    ftrace report; None when it has neither (the summary writes it to :data:`TRACE_JSON`).

    :raise OSError: when the report cannot be read.
    """
    skb, ftrace = guest_dir / REPORT, guest_dir / FTRACE_REPORT
    if skb.is_file():
        return skb_trace(skb.read_text(errors="replace"), guest=guest_dir.name, nic=nic)
    if ftrace.is_file():
        return ftrace_trace(ftrace.read_text(errors="replace"), guest=guest_dir.name)
    return None


class TraceSummary(TypedDict, total=False):
    """What a guest's figures keep of its trace document (``trace_json``; :func:`trace_summary`)."""

    file: Required[str]  # TRACE_JSON, beside the recording
    source: str
    clock: str
    cpus: int
    events: int
    slices: dict[str, int]
    instants: int
    flows: int
    dropped_events: int
    packets: dict[str, int]  # skb_latency's
    followed: dict[str, int]
    flows_not_drawn: dict[str, int]


def trace_summary(doc: TraceDoc) -> TraceSummary:
    """What the summary keeps of a trace document: the file, its source and counts from ``otherData``."""
    other = doc["otherData"]
    out: TraceSummary = {"file": TRACE_JSON, "source": other["source"], "clock": other["clock"],
                         "cpus": other["cpus"], "events": other["events"], "slices": other["slices"],
                         "instants": other["instants"], "flows": other["flows"],
                         "dropped_events": other["dropped_events"]}
    if "packets" in other:
        out["packets"] = other["packets"]
    if "followed" in other:
        out["followed"] = other["followed"]
    if "flows_not_drawn" in other:
        out["flows_not_drawn"] = other["flows_not_drawn"]
    return out
