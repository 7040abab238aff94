"""``labctl run --record``: which guests are recorded, the refusals before anything starts, and
after the steps, the recordings a run keeps.

A recorded guest boots (never restored from a post-boot snapshot: a recording starts at the
machine's reset) on single-threaded TCG. When the steps are over, each recorded guest's QEMU is
ended (its recording with it); the recording of a guest that failed (it crashed, or a failed step
involved it; every recorded guest when the failure names none) is kept in the bundle, the others
dropped unless ``keep_all``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.backends import GuestRecord
from labctl.errors import UsageError
from labctl.lab import Lab, record_refusals
from labctl.paths import atomic_write
from labctl.replay.keep import Kept, end_recording, keep

RECORDINGS_JSON = "recordings.json"  # at the bundle's top: which guests were recorded, which kept


def recorded_lab(lab: Lab, every_guest: bool) -> Lab:
    """``lab`` with every guest recorded when ``every_guest`` (``--record``), else as its file says."""
    if not every_guest:
        return lab
    return dataclasses.replace(lab, guests={n: dataclasses.replace(g, record=True) for n, g in lab.guests.items()})


def recorded(lab: Lab) -> list[str]:
    return [n for n, g in lab.guests.items() if g.record]


def check(lab: Lab, accel: str, backend: str | None) -> str:
    """The accelerator the run uses (``auto`` becomes ``tcg`` when a guest is recorded).

    :raise UsageError: (exit 2, before anything starts) with every reason a recorded guest cannot be recorded.
    """
    names = recorded(lab)
    if not names:
        return accel
    why = [w for n in names for w in record_refusals(lab, n, accel, backend or lab.backend)]
    if why:
        raise UsageError("; ".join(why), hint="record only the guests that can be (record: true in the lab "
                         "file), or change what is refused")
    return "tcg"


@dataclass
class Recorder:
    """The recorded guests of one run, from its start."""

    lab: Lab
    qemu: str
    started: float = dataclasses.field(default_factory=time.time)

    def finish(self, records: dict[str, GuestRecord], bundle: Path, failed: dict[str, str],
               keep_all: bool) -> list[Kept]:
        """End every recorded guest's recording; keep those of the guests in ``failed`` (guest ->
        why) or all when ``keep_all``; write ``recordings.json``; the kept ones."""
        kept: list[Kept] = []
        entries: list[dict[str, Any]] = []
        for name in recorded(self.lab):
            rec = records.get(name)
            if rec is None:
                continue
            icount = end_recording(rec)
            why = failed.get(name)
            entry: dict[str, Any] = {"guest": name, "instructions": icount, "kept": False}
            if why is not None or keep_all:
                k = keep(rec, bundle / "guests" / name, self.lab.ident, self.qemu, icount, self.started,
                         why or "the end of the run (it passed)")
                kept.append(k)
                entry.update(kept=True, dir=str(k.dir.relative_to(bundle)), bytes=k.bytes, seconds=k.seconds,
                             reason=why)
            entries.append(entry)
        atomic_write(bundle / RECORDINGS_JSON, json.dumps({"recorded": entries}, indent=2) + "\n")
        return kept


def failed_guests(lab: Lab, status: str, reason: str | None, results: list[Any]) -> dict[str, str]:
    """The recorded guests that failed in a run: those of its failed steps (guest -> the step's
    reason); every recorded guest when the run failed and no failed step names one."""
    if status == "ok":
        return {}
    names = set(recorded(lab))
    out: dict[str, str] = {}
    for r in results:
        if r.status == "failed":
            for g in r.guests:
                if g in names:
                    out.setdefault(g, f"step {r.name}: {r.reason}")
    return out or dict.fromkeys(names, reason or "the run failed")
