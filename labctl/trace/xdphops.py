"""A followed packet's XDP verdict as its hop and its end: the program's verdict on a NIC
(:mod:`.xdpverdicts`, what xdpdump saw) matched to the packet by its identity (the header key every
kernel and the wire use, :meth:`labctl.trace.hops.Header.key`).

Without it a packet an XDP program dropped in native mode ends "lost on the wire ... reached b.eth1's
NIC on the host side, never its driver" (no skb, so no probe saw it), and one dropped in generic
mode "dropped on b at do_xdp_generic for XDP". With it the path has the hop ``XDP xdp_drop_icmp
(xdp-drop.c, native) on b.eth1: DROP`` and ends "dropped on b by XDP program xdp_drop_icmp
(xdp-drop.c, native) on eth1: XDP_DROP". A TX or REDIRECT verdict is a hop (the packet goes on, sent
back out of the NIC or elsewhere); ABORTED ends it as a drop too (the program failed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from labctl.trace.hops import parse_frame
from labctl.trace.pathmodel import End, Hop, Journey
from labctl.trace.xdpverdicts import DROPPING, Verdict, parse_dump

__all__ = ["XDP_FILE", "XDP_POINT", "XdpVerdicts", "apply_step", "step_verdicts"]

XDP_POINT = "xdp"  # a Hop's point for an XDP verdict
PLAUSIBLE_NS = 5_000_000_000  # a verdict's own time is used when within this of the hop before it


@dataclass
class _Seen:
    guest: str
    nic: str
    program: str
    mode: str
    verdict: Verdict
    used: bool = False


@dataclass
class XdpVerdicts:
    """The verdicts seen so far on the followed guests' NICs, by packet identity."""

    by_key: dict[tuple[object, ...], list[_Seen]] = field(default_factory=dict)

    def add(self, guest: str, nic: str, program: str, mode: str, verdicts: list[Verdict]) -> None:
        for v in verdicts:
            h = parse_frame(v.data) if v.data else None
            if h is not None and v.action != "PASS":
                self.by_key.setdefault(h.key(), []).append(_Seen(guest, nic, program, mode, v))

    def has(self, j: Journey) -> bool:
        return any(not s.used for s in self.by_key.get(j.header.key(), ()))

    def apply(self, j: Journey, host_ns: Callable[[float], int] | None = None) -> bool:
        """Put the first unused verdict on ``j``'s packet into its path (a hop, and its end when the verdict
        ends it); ``host_ns``: a verdict's guest time (realtime, s) on the host's clock. False: none."""
        seen = next((s for s in self.by_key.get(j.header.key(), ()) if not s.used), None)
        if seen is None:
            return False
        seen.used = True
        v = seen.verdict
        last = j.hops[-1].t if j.hops else 0
        t = host_ns(v.ts) if host_ns is not None else last + 1000
        if not last <= t <= last + PLAUSIBLE_NS:
            t = last + 1000
        what = f"XDP {v.func} ({seen.program}, {seen.mode})"
        j.hops.append(Hop(seen.guest, XDP_POINT, what, seen.nic, t, note=v.action))
        if v.action in DROPPING:
            why = "the program failed (XDP_ABORTED)" if v.action == "ABORTED" else "XDP_DROP"
            j.end = End("dropped", seen.guest, f"dropped on {seen.guest} by XDP program {v.func} ({seen.program}, "
                        f"{seen.mode}) on {seen.nic}: {why}", where=f"xdp:{v.func}", reason=f"XDP_{v.action}")
        return True


# --------------------------------------------------------------------------- a step's files

XDP_FILE = "xdp-{guest}.json"  # in a step's follow/: {"wall_minus_mono": NS, "nics": {NIC: {program, mode, text}}}
CANDIDATE_ENDS = ("lost", "dropped", "open", "left")  # what an XDP verdict could have ended


def step_verdicts(follow_dir: Path, guests: list[str]) -> tuple[XdpVerdicts, dict[str, int]]:
    """The verdicts a step's follow recorded (``xdp-GUEST.json``), and each guest's realtime-to-host offset."""
    out, offsets = XdpVerdicts(), {}
    for g in guests:
        try:
            data = json.loads((follow_dir / XDP_FILE.format(guest=g)).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        offsets[g] = int(data.get("wall_minus_mono") or 0)
        for nic, d in (data.get("nics") or {}).items():
            if isinstance(d, dict):
                out.add(g, str(nic), str(d.get("program")), str(d.get("mode")),
                        parse_dump(str(d.get("text") or "")).verdicts)
    return out, offsets


def apply_step(follow_dir: Path, guests: list[str], journeys: list[Journey]) -> None:
    """A step's journeys with the XDP verdicts its follow recorded (nothing without them)."""
    verdicts, offsets = step_verdicts(follow_dir, guests)
    if not verdicts.by_key:
        return
    shift = next(iter(offsets.values()), 0)
    for j in journeys:
        if j.end.kind in CANDIDATE_ENDS:
            verdicts.apply(j, lambda ts: int(ts * 1e9) - shift)
