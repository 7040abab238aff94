"""Per-stage packet latency from followed packets: statistics, CSV, histograms, a timeline.

Input is the ``trace-cmd report -t`` text the ``skb_latency`` tracer leaves
in a guest's step directory (``skb-report.txt``); :func:`analyze_dir`
writes ``skb-latency-rx.csv``, ``skb-latency-tx.csv`` and
``skb-timeline.txt`` next to it and returns the summary that goes into
``summary.json``.

A packet is *followed end to end* when every point of its direction was
seen (through its GRO head or the skb it was coalesced into where that
applies), no trace events were lost while it was in flight, and its times
never go backwards. Only followed packets enter the stage figures, so for
each of them every stage is >= 0 and the stages add up to the end-to-end
time exactly (times are integer nanoseconds).

The share that answers "how complete is the picture" is
``followed / data_segments``: TCP segments carrying payload whose first
event lies inside the trace. Packets that were already in flight when
tracing started (or right after a gap) have no start event, and those
still in flight when it stopped have no end; both are counted apart, as
``fragments``.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from labctl.trace.skbevents import TraceLog, parse_report
from labctl.trace.skbpath import (
    RX_POINTS,
    RX_STAGES,
    STAGE_TITLES,
    TX_POINTS,
    TX_STAGES,
    Correlation,
    Packet,
    follow,
)

REPORT = "skb-report.txt"
MGMT_NIC = "mgmt0"  # labctl's own SSH traffic: reported per NIC, left out of the totals
TIMELINE_SAMPLE = 12
HIST_BINS_US = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


def percentile(sorted_values: list[int], pct: float) -> int:
    """Nearest-rank percentile of a sorted, non-empty list."""
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


class Latency(TypedDict):
    """How many, and their percentiles, max and mean in microseconds (None when there are none)."""

    count: int
    p50_us: float | None
    p90_us: float | None
    p99_us: float | None
    max_us: float | None
    mean_us: float | None


class Bin(TypedDict):
    """One bin of a latency histogram (``to_us`` None: the last, open one)."""

    from_us: float
    to_us: float | None
    count: int


class GroupFigures(TypedDict):
    """The data segments of one group of packets (a direction, a NIC, a process) and their latency."""

    data_segments: int
    followed: int
    followed_pct: float | None
    not_followed: dict[str, int]  # reason -> packets
    stages: dict[str, Latency]
    end_to_end: Latency


class DirectionFigures(GroupFigures, total=False):
    """One direction's figures (:func:`summarize`'s ``rx`` and ``tx``)."""

    packets: int
    fragments: int
    not_data: int
    unknown_kind: int
    histograms: dict[str, list[Bin]]
    by_nic: dict[str, GroupFigures]
    by_process: dict[str, GroupFigures]
    gro_merged: int  # rx
    coalesced: int  # rx
    retransmits: int  # tx
    gso_skbs: int  # tx
    segmented_in_software: int  # tx


class Lost(TypedDict):
    """What the trace lost or could not place."""

    dropped_events: int
    drop_markers: int
    drop_count_unknown: bool
    packets_in_flight_at_drops: int
    kprobe_misses: dict[str, int]
    unparsed_lines: int
    events_without_packet: dict[str, int]
    gro_merges_unattributed: int


class SkbLatency(TypedDict):
    """One guest's per-packet stage latency (:func:`summarize`; its figures' ``skb_latency``)."""

    rx: DirectionFigures
    tx: DirectionFigures
    stage_titles: dict[str, str]
    lost: Lost
    events: int
    files: NotRequired[list[str]]  # the derived files analyze_dir wrote beside the trace


def describe(values_ns: list[int]) -> Latency:
    """count, p50/p90/p99/max/mean in microseconds (None when empty)."""
    if not values_ns:
        return {"count": 0, "p50_us": None, "p90_us": None, "p99_us": None, "max_us": None, "mean_us": None}
    v = sorted(values_ns)
    return {"count": len(v), "p50_us": _us(percentile(v, 50)), "p90_us": _us(percentile(v, 90)),
            "p99_us": _us(percentile(v, 99)), "max_us": _us(v[-1]), "mean_us": _us(round(sum(v) / len(v)))}


def histogram(values_ns: list[int]) -> list[Bin]:
    """Counts per microsecond bin (edges in :data:`HIST_BINS_US`, the last bin open)."""
    edges = list(HIST_BINS_US)
    counts = [0] * len(edges)
    for ns in values_ns:
        us = ns / 1000
        i = len(edges) - 1
        while i > 0 and us < edges[i]:
            i -= 1
        counts[i] += 1
    out: list[Bin] = []
    for i, c in enumerate(counts):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        out.append({"from_us": edges[i], "to_us": hi, "count": c})
    return out


def _points(p: Packet) -> tuple[str, ...]:
    return RX_POINTS if p.dir == "rx" else TX_POINTS


def _stages(p: Packet) -> tuple[tuple[str, str, str], ...]:
    return RX_STAGES if p.dir == "rx" else TX_STAGES


def why_not_followed(p: Packet) -> str | None:
    """None when the packet is followed end to end, else the reason."""
    if p.disturbed:
        return "trace events were lost while it was in flight"
    if p.unverified:
        return p.problem
    if p.dir == "tx" and p.retransmit:
        return "retransmission"
    times = [p.point(x) for x in _points(p)]
    missing = [x for x, t in zip(_points(p), times) if t is None]
    if missing:
        return p.problem or f"no {missing[0]} event"
    if any(b < a for a, b in itertools.pairwise(times)):  # type: ignore[operator]
        return "its events are out of order"
    return None


def stage_times(p: Packet) -> dict[str, int]:
    """Stage name -> ns, for a followed packet."""
    return {name: p.point(b) - p.point(a) for name, a, b in _stages(p)}  # type: ignore[operator]


def end_to_end(p: Packet) -> int:
    pts = _points(p)
    return p.point(pts[-1]) - p.point(pts[0])  # type: ignore[operator]


def _group_figures(packets: list[Packet], direction: str) -> GroupFigures:
    stages = RX_STAGES if direction == "rx" else TX_STAGES
    data = [p for p in packets if p.is_data() and not _fragment(p)]
    followed = [p for p in data if why_not_followed(p) is None]
    per_stage = {name: describe([stage_times(p)[name] for p in followed]) for name, _, _ in stages}
    reasons = Counter(why_not_followed(p) for p in data)
    reasons.pop(None, None)
    return {
        "data_segments": len(data),
        "followed": len(followed),
        "followed_pct": round(100 * len(followed) / len(data), 1) if data else None,
        "not_followed": {str(why): n for why, n in reasons.most_common()},
        "stages": per_stage,
        "end_to_end": describe([end_to_end(p) for p in followed]),
    }


def _fragment(p: Packet) -> bool:
    """A packet the trace window cut: its start is not in the trace (in flight when tracing began
    or right after a gap), or it was still in flight when tracing stopped."""
    first = _points(p)[0] if p.dir == "rx" else "tcp"
    return p.point(first) is None or p.truncated


def _direction(packets: list[Packet], direction: str) -> DirectionFigures:
    lab = [p for p in packets if p.dev != MGMT_NIC]
    out = cast("DirectionFigures", _group_figures(lab, direction))  # its keys, then a direction's own
    out["packets"] = len(lab)
    out["fragments"] = sum(1 for p in lab if _fragment(p))
    out["not_data"] = sum(1 for p in lab if p.is_data() is False)
    out["unknown_kind"] = sum(1 for p in lab if p.is_data() is None and not _fragment(p))
    followed = [p for p in lab if p.is_data() and not _fragment(p) and why_not_followed(p) is None]
    out["histograms"] = {name: histogram([stage_times(p)[name] for p in followed])
                         for name, _, _ in (RX_STAGES if direction == "rx" else TX_STAGES)}
    out["histograms"]["end_to_end"] = histogram([end_to_end(p) for p in followed])
    by_nic: dict[str, list[Packet]] = {}
    by_proc: dict[str, list[Packet]] = {}
    for p in packets:
        by_nic.setdefault(p.dev or "?", []).append(p)
        if p.dev != MGMT_NIC and not _fragment(p):
            comm, pid = p.reader() if direction == "rx" else (p.comm, p.pid)
            if comm is not None:
                by_proc.setdefault(f"{comm}-{pid}", []).append(p)
    out["by_nic"] = {k: _group_figures(v, direction) for k, v in sorted(by_nic.items())}
    out["by_process"] = {k: _group_figures(v, direction) for k, v in sorted(by_proc.items())}
    if direction == "rx":
        out["gro_merged"] = sum(1 for p in lab if p.gro == "merged")
        out["coalesced"] = sum(1 for p in lab if p.into is not None)
    else:
        out["retransmits"] = sum(1 for p in lab if p.retransmit)
        out["gso_skbs"] = sum(1 for p in lab if (p.len or 0) > 1514)
        out["segmented_in_software"] = sum(1 for p in lab if p.segments)
    return out


def summarize(log: TraceLog, corr: Correlation, kprobe_misses: dict[str, int] | None = None) -> SkbLatency:
    """The JSON-able figures of one guest's trace."""
    return {
        "rx": _direction(corr.rx, "rx"),
        "tx": _direction(corr.tx, "tx"),
        "stage_titles": dict(STAGE_TITLES),
        "lost": {
            "dropped_events": log.dropped_events,
            "drop_markers": len(log.drops),
            "drop_count_unknown": any(d.count is None for d in log.drops),
            "packets_in_flight_at_drops": corr.disturbed_by_drops,
            "kprobe_misses": kprobe_misses or {},
            "unparsed_lines": log.unparsed,
            "events_without_packet": dict(sorted(corr.orphan_events.items())),
            "gro_merges_unattributed": corr.gro_ambiguous,
        },
        "events": len(log.events),
    }


_CSV_COLUMNS = ("id", "dir", "nic", "process", "pid", "len", "payload", "kind", "gro", "followed", "reason")


def packets_csv(packets: list[Packet], direction: str, t0: int) -> str:
    """One row per packet: identity, every point (µs since the trace start), every stage, end to end."""
    points = RX_POINTS if direction == "rx" else TX_POINTS
    stages = RX_STAGES if direction == "rx" else TX_STAGES
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*_CSV_COLUMNS, *(f"t_{x}_us" for x in points), *(f"{s}_us" for s, _, _ in stages),
                "end_to_end_us"])
    for p in packets:
        reason = why_not_followed(p)
        comm, pid = p.reader() if direction == "rx" else (p.comm, p.pid)
        kind = {True: "data", False: "other", None: "unknown"}[p.is_data()]
        row: list[Any] = [p.id, p.dir, p.dev or "", comm or "", pid if pid is not None else "", p.len or "",
                          "" if p.payload is None else p.payload, "fragment" if _fragment(p) else kind,
                          p.gro or "", "yes" if reason is None else "no", reason or ""]
        row += ["" if p.point(x) is None else _us(p.point(x) - t0) for x in points]  # type: ignore[operator]
        if reason is None:
            st = stage_times(p)
            row += [_us(st[s]) for s, _, _ in stages] + [_us(end_to_end(p))]
        else:
            row += [""] * (len(stages) + 1)
        w.writerow(row)
    return buf.getvalue()


def _line(label: str, ts: int | None, t0: int, note: str = "") -> str:
    if ts is None:
        return f"    {label:<34} {'-':>12}"
    return f"    {label:<34} {(ts - t0) / 1e6:>+12.3f} ms  {note}".rstrip()


def timeline(corr: Correlation, sample: int = TIMELINE_SAMPLE) -> str:
    """netdev-times style: irq -> softirq -> napi -> stack -> copy for a sample of received packets,
    and sendmsg -> ... -> driver for sent ones (the first followed ones and the slowest)."""
    out: list[str] = []
    for direction, packets in (("rx", corr.rx), ("tx", corr.tx)):
        followed = [p for p in packets if p.dev != MGMT_NIC and p.is_data() and not _fragment(p)
                    and why_not_followed(p) is None]
        slow = sorted(followed, key=end_to_end, reverse=True)[: sample // 3]
        chosen = sorted({p.id: p for p in [*followed[: sample - len(slow)], *slow]}.values(), key=lambda p: p.id)
        title = "received" if direction == "rx" else "sent"
        out.append(f"== {title} packets: {len(chosen)} of {len(followed)} followed "
                   f"(the first ones and the slowest) ==")
        for p in chosen:
            out += _packet_timeline(p)
        out.append("")
    return "\n".join(out)


def _packet_timeline(p: Packet) -> list[str]:
    comm, pid = p.reader() if p.dir == "rx" else (p.comm, p.pid)
    head = f"  #{p.id} {p.dir} {p.dev or '?'} len={p.len} payload={p.payload} process={comm}-{pid} " \
           f"end-to-end {end_to_end(p) / 1000:.1f} us"
    if p.head is not None:
        head += f" (GRO merged into #{p.head.id})"
    if p.into is not None:
        head += f" (coalesced into #{p.into.id})"
    if p.dir == "rx":
        t0 = min(x for x in (p.irq_ts, p.softirq_ts, p.point("entry")) if x is not None)
        lines = [head, _line("irq_handler_entry", p.irq_ts, t0), _line("softirq_entry NET_RX", p.softirq_ts, t0),
                 _line("napi_gro_receive / netif_receive", p.point("entry"), t0),
                 _line("napi_poll done", p.napi_poll_ts, t0),
                 _line("netif_receive_skb", p.point("netif"), t0), _line("ip_rcv_core", p.point("ip"), t0),
                 _line("tcp_v4_rcv", p.point("tcp"), t0),
                 _line("skb_copy_datagram_iovec", p.point("copy"), t0, f"{comm}-{pid}")]
    else:
        t0 = p.point("app")  # type: ignore[assignment]
        lines = [head, _line("tcp_sendmsg", p.point("app"), t0, f"{comm}-{pid}"),
                 _line("__tcp_transmit_skb", p.point("tcp"), t0), _line("__ip_queue_xmit", p.point("ip"), t0),
                 _line("__dev_queue_xmit", p.point("dev"), t0), _line("net_dev_queue", p.t.get("queue"), t0),
                 _line("net_dev_xmit", p.point("xmit"), t0)]
    return lines


def analyze_text(text: str, kprobe_misses: dict[str, int] | None = None) -> tuple[SkbLatency, dict[str, str]]:
    """The summary and the derived files (name -> text) for one trace report."""
    log = parse_report(text)
    corr = follow(log)
    t0 = log.events[0].ts if log.events else 0
    files = {"skb-latency-rx.csv": packets_csv(corr.rx, "rx", t0),
             "skb-latency-tx.csv": packets_csv(corr.tx, "tx", t0),
             "skb-timeline.txt": timeline(corr)}
    return summarize(log, corr, kprobe_misses), files


def analyze_dir(guest_dir: Path) -> SkbLatency | None:
    """Analyse ``skb-report.txt`` in ``guest_dir`` (None when absent); writes the derived files there."""
    from labctl.trace.parsers import parse_kprobe_profile

    path = guest_dir / REPORT
    if not path.is_file():
        return None
    misses = None
    profile = guest_dir / "skb-kprobe-profile.txt"
    if profile.is_file():
        misses = {k: v["misses"] for k, v in parse_kprobe_profile(profile.read_text()).items()}
    summary, files = analyze_text(path.read_text(errors="replace"), misses)
    for name, text in files.items():
        (guest_dir / name).write_text(text)
    summary["files"] = sorted(files)
    return summary
