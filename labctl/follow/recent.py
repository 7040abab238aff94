"""The last packets a live follow printed, kept in the lab's run directory for ``labctl serve``'s pages.

``<run dir>/follow-recent.json`` (0600): the filter-independent record of the last :data:`KEEP` journeys
(packet, hops with guest, point, device and times, end), written at most every :data:`EVERY` s (what
came since is written by the next :meth:`Recent.tick`, which the follow's loop calls) and when the follow
ends. The web pages draw them on the topology; ``down`` removes them with the run directory.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

from labctl.paths import atomic_write
from labctl.state import LabState
from labctl.trace import Journey

RECENT = "follow-recent.json"
KEEP = 20
EVERY = 0.25


def path_of(run_dir: Path) -> Path:
    return run_dir / RECENT


class Recent:
    """Journeys in, the file kept current."""

    def __init__(self, state: LabState, keep: int = KEEP) -> None:
        self.path = path_of(state.path)
        self.items: deque[dict[str, Any]] = deque(read(self.path.parent), maxlen=keep)  # an earlier follow's too
        self.written = 0.0
        self.dirty = False

    def add(self, j: Journey) -> None:
        self.items.append({**j.as_dict(), "at": time.time()})
        self.dirty = True
        self.tick()

    def tick(self) -> None:
        """Write what came since the last write, unless that was less than :data:`EVERY` s ago."""
        if self.dirty and time.monotonic() - self.written >= EVERY:
            self.flush()

    def flush(self) -> None:
        try:
            atomic_write(self.path, json.dumps({"packets": list(self.items)}) + "\n", 0o600)
        except OSError:
            return
        self.written, self.dirty = time.monotonic(), False


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The last followed packets of a lab (newest last; [] when none)."""
    try:
        data = json.loads(path_of(run_dir).read_text())
    except (OSError, ValueError):
        return []
    items = data.get("packets") if isinstance(data, dict) else None
    return [p for p in items if isinstance(p, dict)] if isinstance(items, list) else []
