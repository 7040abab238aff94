"""Trace Event Format (the JSON that ui.perfetto.dev and chrome://tracing open): times, writing, validation.

:func:`us` turns integer nanoseconds into the format's microseconds exactly
as Perfetto reads them back, :func:`write_trace` writes a document and
:func:`validate_trace` checks one against the rules below (the exporter is
:mod:`labctl.trace.perfetto`).

The Trace Event Format rules, checked by :func:`validate_trace`.
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
  where that truncation would lose a nanosecond (:func:`us`). The validator
  compares times as Perfetto reads them.
* Perfetto processes events in time order. At the same ``ts``, ``E`` events come
  first, then ``X`` slices longest first, then the other events in file order. A flow event binds to
  the slice on top of its thread's stack, and that stack is not trimmed
  for the flow event. So every flow event here sits exactly at the start of
  its slice, after the slices and before the instants in the file.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Required, TypedDict

from labctl.errors import LabctlError

MAX_PROBLEMS = 200

TraceArg = str | int | float | bool | list[int]  # a value of an event's ``args``


class TraceEvent(TypedDict, total=False):
    """One event of ``traceEvents`` as the exporters write it (the rules below say which keys a phase needs)."""

    name: Required[str]
    ph: Required[str]
    pid: Required[int]
    tid: int
    ts: int | float  # µs (:func:`us`)
    dur: int | float
    cat: str
    s: str  # an instant's scope
    id: int  # a flow's
    bp: str  # a flow end's binding point
    args: dict[str, TraceArg]


def us(ns: int) -> int | float:
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


def read_ns(value: object) -> int | None:
    """A ``ts``/``dur`` as Perfetto's importer reads it, in integer ns (None: not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value * 1000
    if not math.isfinite(value):
        return None
    return math.trunc(value * 1000.0)



def write_trace(doc: Mapping[str, object], path: Path) -> Path:
    """Write ``doc`` (any Trace Event Format document) as compact JSON to ``path`` atomically (temporary file + rename); returns ``path``.

    A path ending in ``.gz`` is gzipped (ui.perfetto.dev and chrome://tracing
    open such files as they are; a trace of a few seconds of packets is tens
    of MB of JSON, a tenth of that gzipped). The gzip header has no time
    stamp, so one document always gives the same bytes.

    :raise LabctlError: the document is not JSON-serialisable or the file cannot be written.
    """
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise LabctlError(f"cannot write {path}: the trace is not JSON: {exc}") from exc
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        data = text.encode("utf-8")
        if path.suffix == ".gz":
            data = gzip.compress(data, compresslevel=6, mtime=0)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise LabctlError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


# --------------------------------------------------------------------------- validation

_PHASES = frozenset("BEXiICbneSTpFstfPNODMVvRc()")
_META_ARGS = {"process_name": ("name", str), "process_labels": ("labels", str), "thread_name": ("name", str),
              "process_sort_index": ("sort_index", int), "thread_sort_index": ("sort_index", int)}
_Track = tuple[object, object]  # (pid, tid)


@dataclass
class _Checked:
    """An event that passed the per-event checks, with its times as Perfetto reads them."""

    idx: int
    ph: str
    name: str
    track: _Track
    ts: int
    dur: int = 0
    ev: Mapping[str, object] = field(default_factory=dict)  # as read: any JSON object

    @property
    def label(self) -> str:
        return f"traceEvents[{self.idx}] {self.ph} {self.name!r}"


def _where(track: _Track) -> str:
    return f"pid {track[0]} tid {track[1]}"


def _event_problems(idx: int, ev: object) -> tuple[list[str], _Checked | None]:
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
    ts = read_ns(ev.get("ts"))
    if ts is None:
        out.append(f"{label}: ts is missing or not a finite number of microseconds")
    dur = 0
    if ph == "X":
        d = read_ns(ev.get("dur"))
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


def _meta_problems(label: str, ev: Mapping[str, object]) -> list[str]:
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


def _flow_problems(flows: dict[tuple[object, object], list[_Checked]],
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


def validate_trace(doc: object) -> list[str]:
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
    flows: dict[tuple[object, object], list[_Checked]] = {}
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
