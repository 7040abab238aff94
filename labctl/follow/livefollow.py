"""``labctl follow``: packets followed live, each path handed over as soon as it ended.

One reader thread per guest reads its instance's ``trace_pipe`` over SSH (events as they happen,
the clock markers among them); the caller's thread turns lines into events, maps them onto the
host's clock once the guest's first clock round is in, feeds the correlator
(:class:`labctl.trace.journey.Correlator`; only the journeys on the filter's ``vlan [ID]`` when it has
one) and hands each finished journey to ``on_journey``: at once
when a process read the packet, else once nothing came for :data:`QUIET` (a drop, a packet lost
on the wire, one the kernel consumed). Clock rounds are repeated every :data:`RESYNC` seconds while
packets are followed (guest clocks drift), every :data:`IDLE_RESYNC` seconds while none is; the wire
captures are read as they grow.

What it costs the guests is what it sends through their sshd: each heartbeat and each clock sample
wakes sshd, a shell and the trace reader. An idle TCG guest spent 6-10% of its CPU on the 5 heartbeats a
second and 1-4% on the rounds when both ran all the time; so heartbeats go only while a followed
packet is in flight (then they tell how far each stream has come), and rounds slow down while
nothing is followed: unrelated traffic costs the guests nothing of this.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from labctl.errors import GuestError
from labctl.follow.follower import Follower
from labctl.pktfilter import vlan_of
from labctl.trace import Clock, Correlator, Event, Journey, netfilter_note, parse_line

log = logging.getLogger(__name__)
QUIET = 0.5  # s without news before a journey ends by absence
RESYNC = 5.0  # s between clock rounds while packets are followed
IDLE_RESYNC = 30.0  # s between clock rounds while none is
HEARTBEAT = 0.2  # s between markers that show how far each guest's stream has come (while one is in flight)
TICK = 0.1


@dataclass
class LiveStats:
    """What a live follow saw: journeys handed over, events lost in a guest's buffer, guests whose
    stream ended."""

    journeys: int = 0
    lost: dict[str, int] = field(default_factory=dict)
    ended: list[str] = field(default_factory=list)
    clocks: dict[str, Clock] = field(default_factory=dict)


MAX_LINE = 64 << 10  # a trace_pipe event line is a few hundred bytes


class LineSplitter:
    """Lines out of a byte stream, none longer than :data:`MAX_LINE`: a guest that never sends a
    newline holds at most that much of labctl's memory; a longer line is dropped whole (counted in
    ``dropped``), up to its newline."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.parts: list[bytes] = []
        self.size = 0
        self.skipping = False
        self.dropped = 0

    def feed(self, data: bytes) -> list[bytes]:
        """The whole lines that ``data`` ends (without their newline)."""
        out = []
        *done, rest = data.split(b"\n")
        for piece in done:
            if not self.skipping and self.size + len(piece) <= self.max_line:
                out.append(b"".join([*self.parts, piece]))
            elif not self.skipping:
                self.dropped += 1
            self.parts, self.size, self.skipping = [], 0, False
        if not self.skipping:
            if self.size + len(rest) > self.max_line:
                self.parts, self.size, self.skipping = [], 0, True
                self.dropped += 1
            elif rest:
                self.parts.append(rest)
                self.size += len(rest)
        return out


def _reader(follower: Follower, guest: str, out: queue.Queue[tuple[str, str | None]],
            stop: threading.Event) -> None:
    """Lines of ``guest``'s trace_pipe into ``out`` (None at its end) until ``stop``."""
    try:
        pipe = follower.pipe(guest)
    except GuestError as exc:
        log.warning("%s: %s", guest, exc.message)
        out.put((guest, None))
        return
    lines = LineSplitter()
    try:
        while not stop.is_set():
            data = pipe.recv(0.2)
            if data is None:
                continue
            if data == b"":
                break
            for line in lines.feed(data):
                out.put((guest, line.decode(errors="replace")))
            if lines.dropped:
                log.warning("%s: a trace_pipe line over %d bytes dropped", guest, MAX_LINE)
                lines.dropped = 0
    except GuestError as exc:
        log.warning("%s: %s", guest, exc.message)
    finally:
        pipe.close()
        out.put((guest, None))


class LiveFollow:
    """A live follow over ``follower`` (started); :meth:`run` until ``done()`` or ``count`` journeys."""

    def __init__(self, follower: Follower, on_journey: Callable[[Journey], None]) -> None:
        self.f, self.on_journey = follower, on_journey
        self.clocks: dict[str, Clock] = {g: Clock() for g in follower.guests}
        self.markers: dict[str, list[Event]] = {g: [] for g in follower.guests}
        self.pending: dict[str, list[Event]] = {g: [] for g in follower.guests}
        self.marks: dict[str, int] = {}
        self.rulesets = {g: p.ruleset for g, p in follower.probes.items()}
        self.corr = Correlator(follower.topology(), self.clocks, follower.wire, reasons=follower.reasons,
                               rulesets=dict(self.rulesets), vlan=vlan_of(follower.node))
        self.stats = LiveStats(clocks=self.clocks)
        self.followed = 0  # events of followed packets seen (the clock rounds' pace)

    def _line(self, guest: str, line: str) -> None:
        if "LOST" in line and "EVENTS" in line:
            digits = [w for w in line.replace("[", " ").split() if w.isdigit()]
            self.stats.lost[guest] = self.stats.lost.get(guest, 0) + (int(digits[-1]) if digits else 0)
            return
        ev = parse_line(line, guest)
        if ev is None:
            return
        clock = self.clocks[guest]
        if ev.point == "marker":
            if ev.fields.get("marker") != "hb":
                self.markers[guest].append(ev)
                clock.rounds = self.f.clock(guest, self.markers[guest]).rounds
                for held in self.pending[guest] if clock.known else []:
                    self.corr.add(held)
                self.pending[guest].clear()
        elif clock.known:
            self.followed += 1
            self.corr.add(ev)
        else:
            self.followed += 1
            self.pending[guest].append(ev)
        if clock.known:
            self.marks[guest] = max(self.marks.get(guest, 0), clock.host(ev.ts))

    def _hand_over(self, journeys: list[Journey], count: int | None) -> bool:
        for j in journeys:
            if j.end.reason == "NETFILTER_DROP":
                self._netfilter(j)
            self.on_journey(j)
            self.stats.journeys += 1
            if count is not None and self.stats.journeys >= count:
                return True
        return False

    def _netfilter(self, j: Journey) -> None:
        """Which rule dropped, where the chain that dropped did not say (:mod:`labctl.trace.nfhops`): the
        counters now against the last listing of that guest."""
        if " handle " in j.end.text:
            return
        g = j.end.guest
        now = self.f.ruleset(g)
        note = netfilter_note(self.rulesets.get(g, ""), now)
        self.rulesets[g] = now
        if note:
            j.end.text += f" by {note}"

    def _resync(self, stop: threading.Event) -> None:
        """A clock round every :data:`RESYNC` s while packets are followed, every :data:`IDLE_RESYNC` s while
        none is; beside the main loop (a round takes up to 2 s on a busy host)."""
        seen, last = self.followed, time.monotonic()
        while not stop.wait(RESYNC):
            if self.followed == seen and time.monotonic() - last < IDLE_RESYNC:
                continue
            seen, last = self.followed, time.monotonic()
            try:
                self.f.sync()
            except GuestError as exc:
                log.warning("clock round: %s", exc.message)

    def run(self, done: Callable[[], bool], count: int | None = None) -> LiveStats:
        lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        stop = threading.Event()
        threads = [threading.Thread(target=_reader, args=(self.f, g, lines, stop), daemon=True, name=f"follow-{g}")
                   for g in self.f.guests]
        threads.append(threading.Thread(target=self._resync, args=(stop,), daemon=True, name="follow-clocks"))
        for t in threads:
            t.start()
        next_beat = 0.0
        try:
            while not done() and len(self.stats.ended) < len(self.f.guests):
                deadline = time.monotonic() + TICK
                while (left := deadline - time.monotonic()) > 0:
                    try:
                        guest, line = lines.get(timeout=left)
                    except queue.Empty:
                        break
                    if line is None:
                        self.stats.ended.append(guest)
                        self.marks.pop(guest, None)
                    else:
                        self._line(guest, line)
                if self.corr.clusters and time.monotonic() >= next_beat:
                    self.f.heartbeat()
                    next_beat = time.monotonic() + HEARTBEAT
                self.f.read_wire(look=bool(self.corr.clusters))
                live = [g for g in self.f.guests if g not in self.stats.ended]
                if live and all(g in self.marks for g in live) and self._hand_over(
                        self.corr.settle({g: self.marks[g] for g in live}, int(QUIET * 1e9)), count):
                    return self.stats
            self._hand_over(self.corr.settle(None), count)  # what was in flight, ended by the stop
            return self.stats
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=2)
