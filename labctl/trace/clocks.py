"""Guest clocks on the host's: each guest's trace clock mapped from marker round trips, then aligned by
the packets that cross the wire both ways.

**Rounds** (:class:`Clock`): the host writes ``R.I`` on one SSH channel, the guest writes the marker
``labctl-sync R.I`` into its trace and answers; the marker's guest time lies between the host's send
and receive times, so each sample bounds the offset (host − guest) and a round's samples together
bound it tighter (the intersection of their intervals). Rounds at different times give the guest
clock's drift (a TCG guest's calibrated clock runs a few hundred ppm off); between rounds the offset
is interpolated, beyond them extrapolated from the first and last.

**Alignment** (:class:`Alignment`): within those bounds, the offsets are still uncertain by more
than a packet's time on the wire under TCG (a busy host: RTTs of 2-30 ms). Packets that cross a
link both ways pin the difference of the two guests' offsets, as NTP does: with ``min_xy`` the
smallest (receive on y − send on x) and ``min_yx`` the other way, shifting y by
``(min_yx − min_xy) / 2`` makes both directions' fastest packets take equal times. Each guest's shift
is kept within the round trips' bounds (relative to the guest with the tightest bound), so a
mapping never leaves what the round trips proved.

Both drift: a guest's rate is known only as well as its rounds' bounds over their span allow, so a
time mapped past the last round (a live follow maps each event as it comes, up to a round's period
later) is known within the round's bound plus that rate's uncertainty times the distance
(:meth:`Clock.bound_at`); and the alignment is learned per half second (:data:`BUCKET_NS`) and each
packet shifted by the crossings of the seconds around it (:data:`WINDOW_BUCKETS`), not by the whole
run's fastest ones, which a drifting mapping had made 14-20 ms wrong by the end of a 1,000-ping run.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from labctl.trace.hops import Event


@dataclass(frozen=True)
class Round:
    """One round of clock samples: at guest time ``at``, host = guest + ``offset`` within ±``half``."""

    at: int
    offset: float
    half: float


MAX_DRIFT = 1e-3  # a guest clock off by more than 1000 ppm is a wrong estimate, not a clock
BUCKET_NS = 500_000_000  # the alignment's crossings are kept per half second
WINDOW_BUCKETS = 4  # ... and a packet aligned by those of the 2 s before and after it


def _round(items: list[tuple[int, int, int]]) -> Round:
    """A round from its samples (guest time, lowest and highest offset each allows): where most samples
    agree (a sample the guest answered late, or a moment the host stalled, may disagree with the rest),
    at the mean guest time."""
    edges = sorted([(lo, 0) for _, lo, _ in items] + [(hi, 1) for _, _, hi in items])  # opens before closes
    depth = best = 0
    lo = hi = 0.0
    for i, (x, kind) in enumerate(edges):
        depth += 1 if kind == 0 else -1
        if kind == 0 and depth > best:
            best, lo = depth, x
            hi = next(y for y, k in edges[i + 1:] if k == 1)
    return Round(round(statistics.fmean(i[0] for i in items)), (lo + hi) / 2, (hi - lo) / 2)


class ClockFit(TypedDict):
    """A guest clock's fit as a step's follow reports it (:meth:`Clock.as_dict`)."""

    rounds: int  # the sync rounds
    bound_us: float | None  # how far a mapped time may be off (None: no rounds)
    drift_ppm: float | None


@dataclass
class Clock:
    """A guest's trace clock mapped onto the host's monotonic clock (ns)."""

    rounds: list[Round] = field(default_factory=list)
    _good: tuple[int, int, list[Round]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_samples(cls, samples: Mapping[str, tuple[int, int]], markers: Iterable[Event]) -> Clock:
        """``samples``: marker text ``R.I`` (round R, sample I) -> host ns before sending and after the
        answer; ``markers``: the guest's marker events. Each round intersects its samples' intervals."""
        by_round: dict[str, list[tuple[int, int, int]]] = {}
        for ev in markers:
            mark = ev.fields.get("marker", "")
            if mark in samples:
                h1, h2 = samples[mark]
                by_round.setdefault(mark.partition(".")[0], []).append((ev.ts, h1 - ev.ts, h2 - ev.ts))
        rounds = [_round(items) for items in by_round.values()]
        return cls(sorted(rounds, key=lambda r: r.at))

    @property
    def known(self) -> bool:
        return bool(self.rounds)

    def good(self) -> list[Round]:
        """The rounds the mapping uses: a round taken on a busy moment (its bound more than three times the
        best round's, and a millisecond more) would only blur the others."""
        if not self.rounds:
            return []
        if self._good is not None and self._good[:2] == (id(self.rounds), len(self.rounds)):
            return self._good[2]  # every mapped time asks: once per set of rounds
        best = min(r.half for r in self.rounds)
        good = [r for r in self.rounds if r.half <= max(3 * best, best + 1_000_000)]
        self._good = (id(self.rounds), len(self.rounds), good)
        return good

    @property
    def bound_ns(self) -> float:
        return max((r.half for r in self.good()), default=float("inf"))

    def bound_at(self, host_ns: int) -> float:
        """How well a time mapped at ``host_ns`` is known: :attr:`bound_ns`, and past the good rounds'
        span, the uncertainty of the rate (:meth:`rate`) times the distance to the nearest."""
        r = self.good()
        if not r:
            return float("inf")
        first, last = r[0].at + r[0].offset, r[-1].at + r[-1].offset
        beyond = max(0.0, first - host_ns, host_ns - last)
        span = r[-1].at - r[0].at
        unsure = (r[0].half + r[-1].half) / span if len(r) >= 2 and span >= 1_000_000_000 else MAX_DRIFT
        return self.bound_ns + min(unsure, 2 * MAX_DRIFT) * beyond

    def rate(self) -> float:
        """The guest clock's drift against the host's (host ns per guest ns, minus 1) from the first and the
        last good rounds, once they are a second apart; within ±MAX_DRIFT."""
        r = self.good()
        if len(r) < 2 or r[-1].at - r[0].at < 1_000_000_000:
            return 0.0
        drift = (r[-1].offset - r[0].offset) / (r[-1].at - r[0].at)
        return max(-MAX_DRIFT, min(MAX_DRIFT, drift))

    def host(self, guest_ns: int) -> int:
        """The host time of guest time ``guest_ns``: the offset interpolated between the good rounds around
        it; before the first and after the last, that round's offset moved by the drift."""
        r = self.good()
        if not r:
            return guest_ns
        if guest_ns <= r[0].at or guest_ns >= r[-1].at:
            edge = r[0] if guest_ns <= r[0].at else r[-1]
            return round(guest_ns + edge.offset + self.rate() * (guest_ns - edge.at))
        i = next(i for i in range(1, len(r)) if guest_ns <= r[i].at)
        a, b = r[i - 1], r[i]
        off = a.offset + (b.offset - a.offset) * (guest_ns - a.at) / (b.at - a.at)
        return round(guest_ns + off)

    def as_dict(self) -> ClockFit:
        return {"rounds": len(self.rounds), "bound_us": round(self.bound_ns / 1000, 1) if self.rounds else None,
                "drift_ppm": self.drift_ppm()}

    def drift_ppm(self) -> float | None:
        r = self.good()
        if len(r) < 2 or r[-1].at == r[0].at:
            return None
        return round((r[-1].offset - r[0].offset) / (r[-1].at - r[0].at) * 1e6, 1)


@dataclass
class Alignment:
    """Shifts of guests' mapped clocks learned from packets crossing links (see the module docstring)."""

    mins: dict[tuple[str, str], int] = field(default_factory=dict)  # (sender, receiver) -> smallest raw delta
    shift: dict[str, float] = field(default_factory=dict)
    buckets: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)  # pair -> half second -> min
    bounds: dict[str, float] = field(default_factory=dict)
    _near: dict[int, dict[str, float]] = field(default_factory=dict)  # each half second's shifts, as solved

    def learn(self, sender: str, receiver: str, delta_ns: int, t: int | None = None) -> None:
        """A crossing from ``sender`` to ``receiver`` that took ``delta_ns`` on the mapped clocks, sent at
        host time ``t`` (None: counted in the whole run's only)."""
        key = (sender, receiver)
        if key not in self.mins or delta_ns < self.mins[key]:
            self.mins[key] = delta_ns
        if t is not None:
            per = self.buckets.setdefault(key, {})
            b = t // BUCKET_NS
            if b not in per or delta_ns < per[b]:
                per[b] = delta_ns
                self._near.clear()

    def at(self, guest: str, t: int | None = None) -> float:
        """``guest``'s shift: by the crossings around host time ``t`` where some were learned with their time,
        else by the whole run's."""
        if t is None or not self.buckets:
            return self.shift.get(guest, 0.0)
        b = t // BUCKET_NS
        if b not in self._near:
            mins = {}
            for pair, per in self.buckets.items():
                near = [per[i] for i in range(b - WINDOW_BUCKETS, b + WINDOW_BUCKETS + 1) if i in per]
                if near:
                    mins[pair] = min(near)
            self._near[b] = _solve(mins, self.bounds) or self.shift
        return self._near[b].get(guest, self.shift.get(guest, 0.0))

    def solve(self, bounds: Mapping[str, float]) -> None:
        """Each guest's shift from the pairs seen, anchored at the guest with the tightest bound."""
        self.bounds = dict(bounds)
        self._near.clear()
        shift = _solve(self.mins, bounds)
        if shift:
            self.shift = shift

    def as_dict(self) -> dict[str, float]:
        """Each guest's shift in µs."""
        return {g: round(s / 1000, 1) for g, s in self.shift.items()}


def _solve(mins: Mapping[tuple[str, str], int], bounds: Mapping[str, float]) -> dict[str, float]:
    """Each guest's shift from the smallest deltas of the pairs in ``mins``, anchored at the guest with
    the tightest bound, each within the bounds of it and the anchor ({}: no pair)."""
    edges: dict[str, dict[str, float]] = {}
    for (x, y), m in mins.items():
        back = mins.get((y, x))
        d = (back - m) / 2 if back is not None else max(0.0, -float(m))  # y relative to x
        edges.setdefault(x, {})[y] = d
        edges.setdefault(y, {})[x] = -d
    if not edges:
        return {}
    anchor = min(edges, key=lambda g: (bounds.get(g, float("inf")), g))
    shift = {anchor: 0.0}
    todo = deque([anchor])
    while todo:
        x = todo.popleft()
        for y, d in sorted(edges[x].items()):
            if y in shift:
                continue
            limit = bounds.get(y, 0.0) + bounds.get(anchor, 0.0)
            shift[y] = max(-limit, min(limit, shift[x] + d))
            todo.append(y)
    return shift
