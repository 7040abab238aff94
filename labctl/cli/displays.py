"""What the commands that run steps or a class draw: each step as it starts and ends, a run's
outcome, a class's instances coming up. Apart from :mod:`.ui` because it needs the steps, the
pipeline and training, which commands such as ``labctl exec`` never load."""

from __future__ import annotations

import threading

from rich.console import Group
from rich.live import Live
from rich.text import Text

from labctl.cli.ui import UpDisplay, console, out, print_json, warn
from labctl.events import UpEvents
from labctl.lab import Lab
from labctl.pipeline import RunOutcome
from labctl.steps import StepEvents, StepResult
from labctl.textsafe import safe_text
from labctl.training import Arrival, RoomEvents


class ClassUpDisplay(RoomEvents):
    """``labctl class up``: each instance's guests live as it comes up (one instance at a time,
    or, for a class spread over hosts, every instance being started in one live view), and a
    line for each instance once it is up (implements RoomEvents)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[str, UpDisplay] = {}
        self.live: Live | None = None

    def __rich__(self) -> Group:
        with self.lock:
            shown = list(self.active.values())
        return Group(*(d.__rich__() for d in shown))

    def started(self, side_by_side: bool) -> None:
        if side_by_side:
            self.live = Live(self, console=console, refresh_per_second=8, transient=True)
            self.live.start()

    def instance(self, student: str, lab: Lab) -> UpEvents:
        if self.live is None:
            return UpDisplay(lab.ident, list(lab.guests))
        return _InRoom(self, lab.ident, list(lab.guests))

    def arrived(self, arrival: Arrival) -> None:
        where = f" on {arrival.host}" if arrival.host else ""
        console.print(Text.assemble(("up ", "green"), arrival.lab,
                                    f"{where} ({arrival.accel}), handout {arrival.handout}"))

    def stopping(self, why: str) -> None:
        warn(f"{why}: no further instance starts (those being started finish first)")

    def finished(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


class _InRoom(UpDisplay):
    """One instance's phases, drawn by its class's live view instead of a live view of its own."""

    def __init__(self, room: ClassUpDisplay, lab: str, guests: list[str]) -> None:
        super().__init__(lab, guests)
        self.room = room

    def started(self) -> None:
        with self.room.lock:
            self.room.active[self.lab] = self

    def finished(self) -> None:
        with self.room.lock:
            self.room.active.pop(self.lab, None)


EXIT_STEP_FAILED = 6


class StepLines(StepEvents):
    """One line per step as it starts and ends."""

    def step_started(self, name: str, variant: str | None) -> None:
        console.print(Text.assemble(("step", "bold"), f" {name}", (f" {variant}" if variant else "", "cyan"), " ..."))

    def step_finished(self, r: StepResult) -> None:
        style = "green" if r.status == "ok" else "bold red"
        console.print(Text.assemble("  ", (r.status, style), f" in {r.duration_s:.1f} s",
                                    f": {safe_text(r.reason)}" if r.reason else ""))
        for w in r.warnings:  # guest and user text: printed literally, never as markup or controls
            console.print(Text.assemble("  ", ("warning:", "yellow"), f" {safe_text(w)}"))

    def step_progress(self, message: str) -> None:
        console.print(Text(f"  {safe_text(message)}", style="dim"), soft_wrap=True)



def report_outcome(o: RunOutcome, as_json: bool) -> int:
    if as_json:
        print_json({"bundle": str(o.bundle), "status": o.status, "reason": o.reason,
                    "reports": [str(p) for p in o.reports],
                    "steps": [{"name": r.name, "variant": r.variant, "repeat": r.repeat, "status": r.status,
                              "reason": r.reason} for r in o.results]})
    else:
        style = "green" if o.status == "ok" else "bold red"
        out.print(Text.assemble("run ", (o.status, style), f": {safe_text(o.reason)}" if o.reason else ""))
        out.print(Text(f"bundle: {o.bundle}"), soft_wrap=True)
        for p in o.reports:
            out.print(Text(f"report: {p}"), soft_wrap=True)
    return 0 if o.status == "ok" else EXIT_STEP_FAILED
