"""Packets followed from the browser: one live follow per lab instance, started and stopped by its page.

A page with the ``lab.follow`` right (the owner; a class's trainer; a student when the trainer allows)
starts following a filter on its instance; the follow runs in a thread of the server exactly as
``labctl follow`` does (:class:`labctl.follow.LiveFollow` on every guest), and each packet's path is
kept in the lab's ``follow-recent.json`` (:mod:`labctl.follow.recent`), which ``labctl follow`` in a
terminal writes too: the page shows the last packets whichever started them. A follow stops when its
page stops it, after :data:`MAX_SECONDS`, when the lab goes down, or when the server stops.

Everything here blocks (SSH, QMP, files): the application calls it from worker threads.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

from labctl.backends import get_backend
from labctl.errors import LabctlError, UsageError
from labctl.follow import Follower, LiveFollow, Recent, libpcap_error, read_recent
from labctl.pktfilter import FilterError, parse
from labctl.state import LabState, run_dir

log = logging.getLogger(__name__)
MAX_SECONDS = 600.0
MAX_FILTER = 200
SHOWN = 10


class FollowView(TypedDict):
    """What a page shows of an instance's follow."""

    running: bool
    ready: bool
    filter: str
    error: str
    packets: list[dict[str, Any]]  # labctl.follow.recent's records


@dataclass
class Following:
    ident: str
    filter: str
    started: float = field(default_factory=time.time)
    stop: threading.Event = field(default_factory=threading.Event)
    error: str = ""
    packets: int = 0
    ready: bool = False  # the probes are on in every guest: a packet sent from now on is followed
    thread: threading.Thread | None = None


class Follows:
    """The follows this server runs, one per instance."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, Following] = {}
        self.last_error: dict[str, str] = {}

    def start(self, ident: str, text: object) -> FollowView:
        """Follow ``text`` on ``ident``: checked (libpcap, the subset), the guests checked, the probes on.

        :raise UsageError: for a bad filter, or a follow running already. :raise LabctlError: when a
            guest cannot follow or the lab is not up.
        """
        if not isinstance(text, str) or len(text) > MAX_FILTER:
            raise UsageError(f"say what to follow: {{\"filter\": \"icmp\"}} (at most {MAX_FILTER} characters)")
        why = libpcap_error(text) if text.strip() else None
        if why:
            raise UsageError(f"bad filter '{text}': {why}")
        try:
            node = parse(text)
        except FilterError as exc:
            raise UsageError(str(exc)) from exc
        with self.lock:
            if ident in self.running:
                raise UsageError(f"packets are being followed on {ident} already ('{self.running[ident].filter}')")
            run = self.running[ident] = Following(ident, text)
        try:
            state = LabState.load(ident)
            f = Follower(state, get_backend(state.backend), list(state.guests), node, purpose="web-follow")
            f.check()
            f.start()
            run.ready = True
        except BaseException:
            with self.lock:
                self.running.pop(ident, None)
            raise
        run.thread = threading.Thread(target=self._run, args=(run, f, state), daemon=True, name=f"follow-{ident}")
        run.thread.start()
        return self.view(ident)

    def _run(self, run: Following, f: Follower, state: LabState) -> None:
        keep = Recent(state)

        def show(j: Any) -> None:
            keep.add(j)
            run.packets += 1

        def done() -> bool:
            keep.tick()
            return (run.stop.is_set() or time.time() - run.started > MAX_SECONDS
                    or not run_dir(run.ident).is_dir())

        try:
            LiveFollow(f, show).run(done)
        except LabctlError as exc:
            run.error = exc.message
        except Exception as exc:  # noqa: BLE001 - a follow's end must be said on the page, never lost
            log.warning("follow on %s: %s", run.ident, exc)
            run.error = str(exc)
        finally:
            keep.flush()
            try:
                f.stop()
            finally:
                f.close()
                with self.lock:
                    if self.running.get(run.ident) is run:
                        del self.running[run.ident]
                    if run.error:
                        self.last_error[run.ident] = run.error

    def stop(self, ident: str) -> FollowView:
        """:raise UsageError: when no follow runs on ``ident``."""
        with self.lock:
            run = self.running.get(ident)
        if run is None:
            raise UsageError(f"no packets are being followed on {ident}")
        run.stop.set()
        if run.thread is not None:
            run.thread.join(timeout=30)
        return self.view(ident)

    def stop_all(self) -> None:
        with self.lock:
            runs = list(self.running.values())
        for run in runs:
            run.stop.set()
        for run in runs:
            if run.thread is not None:
                run.thread.join(timeout=30)

    def view(self, ident: str) -> FollowView:
        """What a page shows: whether a follow runs (its filter) and is ``ready`` (its probes on: until then
        a packet sent is not followed, and the page says so), the last packets of the instance."""
        with self.lock:
            run = self.running.get(ident)
            error = self.last_error.get(ident, "")
        try:
            packets = read_recent(run_dir(ident))[-SHOWN:]
        except LabctlError:
            packets = []
        return {"running": run is not None, "ready": run is not None and run.ready, "filter": run.filter if run else "",
                "error": run.error if run else error, "packets": packets}
