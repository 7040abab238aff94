"""Tracepoint counts: how often each traced event fired, per command and per CPU.

A tracepoint (``net:net_dev_queue``) or probe (``probe:tcp_v4_rcv``) that
``perf record`` records is recorded at *every* hit (perf's default period
for them is 1), so its samples are counts of events, not a sample of CPU
time: they answer "how many packets were queued, and by whom". Sampling
events (``cpu-clock``, ``cycles`` ...) answer "where did the CPU go"; the
two must never share a table (:func:`is_tracepoint`).

Sources, each giving ``{event: {"total", "rate_per_s", "by_comm", "by_cpu"}}``:

* ``perf-event-counts.txt``: ``perf script -F comm,cpu,event | sort | uniq -c``
  run in the guest, exact counts per (command, CPU, event) (:func:`parse_perf_event_counts`);
* ``trace-report.txt``: ftrace's events as ``trace-cmd report`` prints them (:func:`ftrace_counts`), with the events
  its ring buffer lost (``trace-stat.txt``, :func:`ftrace_lost`) as ``lost``: the counts are then lower bounds;
* ``perf-stat.txt``: ``perf stat``'s totals of tracepoint events (no command or CPU).

Which events are tracepoints: :func:`labctl.trace.parsers.is_tracepoint`.

Rates are per second of the step's window (its commands' run).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NotRequired, TypedDict

from labctl.trace.parsers import is_tracepoint, parse_perf_stat_csv, parse_trace_cmd_stat, read_or_none
from labctl.trace.skbevents import parse_line

PERF_COUNTS = "perf-event-counts.txt"
FTRACE_REPORT = "trace-report.txt"
FTRACE_STAT = "trace-stat.txt"
PERF_STAT = "perf-stat.txt"
MAX_COMMS = 12  # per event, the rest summed as "(other)"
OTHER = "(other)"

_COUNT_LINE = re.compile(r"^\s*(\d+)\s+(.*?)\s+\[(\d+)\]\s+(\S+?):?\s*$")



class EventCount(TypedDict):
    """One event's count over the window: its total and rate, by command and by CPU."""

    total: int
    rate_per_s: float | None
    by_comm: dict[str, int]  # the top MAX_COMMS commands, then OTHER
    by_cpu: dict[str, int]  # CPU number (as text) -> count


class CountSource(TypedDict):
    """One source of tracepoint counts in a guest's step directory (perf record, ftrace, perf stat)."""

    source: str
    file: str
    events: dict[str, EventCount]
    lost: NotRequired[int]  # ftrace's lost events: its counts are lower bounds


def parse_perf_event_counts(text: str) -> Counter[tuple[str, str, int]]:
    """``uniq -c`` lines of ``perf script -F comm,cpu,event`` as {(event, comm, cpu): count}.

    A line reads ``   3436             ping [000] net:net_dev_queue:``; the
    command may hold spaces. Other lines are skipped.
    """
    out: Counter[tuple[str, str, int]] = Counter()
    for line in text.splitlines():
        m = _COUNT_LINE.match(line)
        if m is not None:
            out[(m[4].rstrip(":"), m[2].strip() or "?", int(m[3]))] += int(m[1])
    return out


def ftrace_counts(text: str) -> Counter[tuple[str, str, int]]:
    """Events of a ``trace-cmd report`` as {(event, comm, cpu): count} (lines it cannot read are skipped)."""
    out: Counter[tuple[str, str, int]] = Counter()
    for line in text.splitlines():
        ev = parse_line(line)
        if ev is not None:
            out[(ev.name, ev.comm or "?", ev.cpu)] += 1
    return out


def _rate(n: int, seconds: float | None) -> float | None:
    return round(n / seconds, 2) if seconds else None


def tabulate(counts: Mapping[tuple[str, str, int], int], seconds: float | None,
             keep: Iterable[str] | None = None) -> dict[str, EventCount]:
    """{event: {total, rate_per_s, by_comm (top :data:`MAX_COMMS`, then "(other)"), by_cpu}}, events by total.

    ``keep`` limits the events (e.g. to tracepoints); ``seconds`` is the
    window for the rates (None: no rates).
    """
    wanted = set(keep) if keep is not None else None
    events: dict[str, dict[str, Counter[str]]] = {}
    for (event, comm, cpu), n in counts.items():
        if wanted is not None and event not in wanted:
            continue
        e = events.setdefault(event, {"comm": Counter(), "cpu": Counter()})
        e["comm"][comm] += n
        e["cpu"][str(cpu)] += n
    out: dict[str, EventCount] = {}
    for event, e in sorted(events.items(), key=lambda kv: (-sum(kv[1]["comm"].values()), kv[0])):
        total = sum(e["comm"].values())
        comms = sorted(e["comm"].items(), key=lambda kv: (-kv[1], kv[0]))
        by_comm = dict(comms[:MAX_COMMS])
        if len(comms) > MAX_COMMS:
            by_comm[OTHER] = sum(n for _, n in comms[MAX_COMMS:])
        out[event] = {"total": total, "rate_per_s": _rate(total, seconds), "by_comm": by_comm,
                      "by_cpu": dict(sorted(e["cpu"].items(), key=lambda kv: int(kv[0])))}
    return out


def ftrace_lost(stat_text: str) -> int:
    """Events ftrace's ring buffer lost (overwritten before trace-cmd read them, or refused when full),
    from ``trace-cmd report --stat``; 0 when it says nothing."""
    stat = parse_trace_cmd_stat(stat_text)
    return int(stat.get("overrun", 0)) + int(stat.get("dropped_events", 0))


def guest_tracepoints(guest_dir: Path, seconds: float | None) -> list[CountSource]:
    """Every tracepoint count source found in ``guest_dir``: [{"source", "file", "events"}]; [] if none.

    perf's counts keep tracepoints only (a recording that mixes ``cpu-clock``
    with tracepoints has its CPU samples in the symbol tables instead).
    """
    out: list[CountSource] = []
    text = read_or_none(guest_dir / PERF_COUNTS)
    if text is not None:
        counts = parse_perf_event_counts(text)
        events = tabulate(counts, seconds, keep={e for e, _, _ in counts if is_tracepoint(e)})
        if events:
            out.append({"source": "perf record", "file": PERF_COUNTS, "events": events})
    text = read_or_none(guest_dir / FTRACE_REPORT)
    if text is not None:
        events = tabulate(ftrace_counts(text), seconds)
        if events:
            ftrace: CountSource = {"source": "ftrace", "file": FTRACE_REPORT, "events": events}
            lost = ftrace_lost(read_or_none(guest_dir / FTRACE_STAT) or "")
            if lost:
                ftrace["lost"] = lost  # its counts are lower bounds
            out.append(ftrace)
    text = read_or_none(guest_dir / PERF_STAT)
    if text is not None:
        stat = {ev: int(v) for ev, v in parse_perf_stat_csv(text).items() if is_tracepoint(ev)}
        if stat:
            out.append({"source": "perf stat", "file": PERF_STAT, "events": {
                ev: {"total": n, "rate_per_s": _rate(n, seconds), "by_comm": {}, "by_cpu": {}}
                for ev, n in sorted(stat.items(), key=lambda kv: (-kv[1], kv[0]))}})
    return out
