"""XDP verdicts in a live follow: xdpdump on every followed guest's NICs that have an XDP program
(:mod:`.xdpwatch` starts them), read when a journey is handed over and might have met one, so the
packet's path has the verdict as a hop and, for DROP and ABORTED, as its end
(:mod:`labctl.trace.xdphops`).

Reading costs one SSH command per guest with programs, and only for a journey that ended without
being delivered, answered or consumed (what an XDP program could have ended): each reads what its
xdpdumps wrote since the last read (``tail -c +OFFSET``).
"""

from __future__ import annotations

import logging
import time

from labctl.errors import LabctlError
from labctl.follow.follower import Follower
from labctl.follow.xdpwatch import DIR, XdpWatch, start
from labctl.trace import XDP_CANDIDATE_ENDS, Journey, XdpVerdicts, parse_xdpdump

log = logging.getLogger(__name__)
RETRIES = 3  # reads (0.2 s apart) for a candidate journey: xdpdump's line may come after the journey ends


class XdpFollow:
    """The XDP side of a live follow on ``follower`` (started)."""

    def __init__(self, follower: Follower) -> None:
        self.f = follower
        self.watches: dict[str, XdpWatch] = {}
        self.offsets: dict[tuple[str, str], int] = {}
        self.verdicts = XdpVerdicts()
        self.warnings: list[str] = []

    def start(self) -> None:
        """xdpdump on every followed guest's XDP NICs (none: nothing to do)."""
        for g in self.f.guests:
            spec = self.f.state.guest_spec(g)
            nics = spec["nics"] if spec else []
            try:
                w = start(self.f.session(g), g, nics, tag="f", counters=False)
            except LabctlError as exc:
                self.warnings.append(f"{g}: XDP verdicts not followed: {exc.message}")
                continue
            if w is not None:
                self.watches[g] = w
                self.warnings += [f"{g}: {n}" for n in w.notes]

    def _read(self) -> None:
        for g, w in self.watches.items():
            cmd = "; ".join(f"echo labctl-xdp-nic {nic}; tail -c +{self.offsets.get((g, nic), 0) + 1} "
                            f"{w.file(nic, 'txt')} 2>/dev/null" for nic in w.nics)
            try:
                out = self.f.session(g).run(cmd, timeout=60).stdout
            except LabctlError as exc:
                log.debug("%s: %s", g, exc.message)
                continue
            for part in out.split(b"labctl-xdp-nic ")[1:]:
                head, _, body = part.partition(b"\n")
                nic = head.decode(errors="replace").strip()
                x = w.nics.get(nic)
                if x is None:
                    continue
                whole = body[:body.rfind(b"\n") + 1] if b"\n" in body else b""  # whole lines only
                self.offsets[(g, nic)] = self.offsets.get((g, nic), 0) + len(whole)
                self.verdicts.add(g, nic, x.program, x.mode, parse_xdpdump(whole.decode(errors="replace")).verdicts)

    def fix(self, j: Journey) -> None:
        """Put the XDP verdict on ``j``'s packet into its path, when one of the followed NICs saw it."""
        if not self.watches or j.end.kind not in XDP_CANDIDATE_ENDS:
            return
        for i in range(RETRIES):
            if self.verdicts.has(j):
                break
            self._read()
            if self.verdicts.has(j) or i == RETRIES - 1:
                break
            time.sleep(0.2)
        self.verdicts.apply(j, lambda ts: int(ts * 1e9) - self.f.wall_minus_mono)

    def stop(self) -> None:
        """The xdpdumps stopped and their files removed (best effort)."""
        for g, w in self.watches.items():
            cmd = "; ".join(f"kill -INT $(cat {w.file(n, 'pid')}) 2>/dev/null; rm -f {DIR}/dump-{w.tag}-{n}.*"
                            for n in w.nics)
            try:
                self.f.session(g).run(cmd + "; true", timeout=60)
            except LabctlError as exc:
                self.warnings.append(f"{g}: xdpdump could not be stopped: {exc.message}")
        self.watches.clear()
