"""What a step's bpftrace program left (``bpftrace -f json``, one JSON object a line): its maps and histograms.

bpftrace prints every map when it stops (SIGINT): ``{"type": "map", "data": {"@name": value}}`` for a
scalar, ``{"@name": {"key": value, ...}}`` for a keyed map, ``"hist"`` for ``hist()``/``lhist()``
(``[{"min": 64, "max": 127, "count": 3}, ...]``, keyed ones as a mapping of those), ``"stats"`` for
``stats()``/``avg()`` ({"count", "average", "total"}), ``"printf"`` lines, ``"lost_events"``.
:func:`summary` keeps each map's value (keyed maps: the biggest :data:`TOP` entries and how many
there were), each histogram's buckets, and counts the rest.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

TOP = 20
BPFTRACE_JSON = "bpftrace.json"


class Bucket(TypedDict):
    """One bucket of a ``hist()``/``lhist()`` (``min`` or ``max`` None: an open end)."""

    min: float | None
    max: float | None
    count: int


class MapValue(TypedDict, total=False):
    """A map's last value: a number, a text, or a keyed map's biggest entries and how many it had."""

    value: float
    text: str
    entries: list[list[Any]]  # [key, number], the TOP biggest
    count: int


class BpftraceSummary(TypedDict):
    """What a bpftrace program left (:func:`summary`; summary.json's ``bpftrace.GUEST``)."""

    probes: int
    maps: dict[str, MapValue]
    hists: dict[str, dict[str, list[Bucket]]]  # histogram -> key ('' for an unkeyed one) -> buckets
    stats: dict[str, dict[str, object]]  # bpftrace's own: {"count", "average", "total"}, or those per key
    printf_lines: int
    lost: int


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bins(raw: Any) -> list[Bucket]:
    out: list[Bucket] = []
    for b in raw if isinstance(raw, list) else []:
        if isinstance(b, dict) and _number(b.get("count")) is not None:
            out.append({"min": b.get("min"), "max": b.get("max"), "count": int(b["count"])})
    return out


def summary(text: str) -> BpftraceSummary:
    """Maps, histograms and stats of bpftrace's JSON output (later values of a map replace earlier ones)."""
    maps: dict[str, MapValue] = {}
    hists: dict[str, dict[str, list[Bucket]]] = {}
    stats: dict[str, dict[str, object]] = {}
    printed = lost = probes = 0
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        kind, data = obj.get("type"), obj.get("data")
        if kind == "attached_probes" and isinstance(data, dict):
            probes = int(_number(data.get("probes")) or 0)
        elif kind == "printf":
            printed += 1
        elif kind == "lost_events" and isinstance(data, dict):
            lost += int(_number(data.get("events")) or 0)
        elif isinstance(data, dict):
            for name, value in data.items():
                if kind == "map":
                    maps[str(name)] = _map(value)
                elif kind == "hist":
                    hists[str(name)] = ({"": _bins(value)} if isinstance(value, list)
                                        else {str(k): _bins(v) for k, v in value.items()} if isinstance(value, dict)
                                        else {})
                elif kind == "stats" and isinstance(value, dict):
                    stats[str(name)] = value
    return {"probes": probes, "maps": maps, "hists": hists, "stats": stats, "printf_lines": printed, "lost": lost}


def _map(value: Any) -> MapValue:
    if isinstance(value, dict):
        entries = [(str(k), v) for k, v in value.items()]
        nums = sorted(((k, n) for k, v in entries if (n := _number(v)) is not None), key=lambda e: -e[1])
        return {"entries": [[k, n] for k, n in nums[:TOP]], "count": len(entries)}
    n = _number(value)
    return {"value": n} if n is not None else {"text": str(value)[:200]}


def bucket_label(b: Bucket) -> str:
    lo, hi = b.get("min"), b.get("max")
    if lo is None:
        return f"< {hi}" if hi is not None else "?"
    if hi is None:
        return f"≥ {lo}"
    return str(lo) if lo == hi else f"{lo}–{hi}"
