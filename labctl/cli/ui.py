"""The UI layer: one rich Console, progress displays, tables, JSON output."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.segment import Segment
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from labctl.cli.jsonout import print_json as print_json  # noqa: PLC0414  (every command's --json)
from labctl.events import PrepareEvents, Reporter, UpEvents
from labctl.textsafe import safe_line, safe_text


class SafeConsole(Console):
    """A Console whose text never reaches the terminal as control sequences.

    Everything printed goes through :func:`labctl.textsafe.safe_text` on its way
    out: an ESC, a C0 or C1 control or a bidi override in any text (a guest's
    READY line, an oops title, a bundle's lab name, an error quoting a
    command's output) is shown as ``\\x1b`` and the like. Only rich's own
    control segments (cursor movement of live displays) and styles stay codes.
    A plain string is escaped before rich turns it into Text (which would drop
    BEL, BS, VT, FF and CR without a trace). Call sites that build a Text or a
    table cell from outside text still use :func:`safe` (or ``safe_text``)
    first, so that columns are measured on what is shown.
    """

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # Before rich's Text() silently drops BEL, BS, VT, FF and CR: a plain string shows them too.
        return super().render_str(safe_text(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(safe_text(seg.text), seg.style, seg.control) for seg in buffer)


# Markup is off: user and guest text (file names, command output, READY lines,
# oops titles) is always printed literally; styles come from Text objects, and
# control characters are shown escaped (SafeConsole).
console = SafeConsole(stderr=True, highlight=False, markup=False)
# Tables stay whole when stdout is a pipe or a file.
out = SafeConsole(highlight=False, markup=False, width=None if sys.stdout.isatty() else 160)


class SafeFormatter(logging.Formatter):
    """Log records (which may quote guest output) with control characters shown escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))


def safe(s: str, style: str = "", multiline: bool = True) -> Text:
    """Outside text (guest, console, file) as a rich Text, control characters shown escaped."""
    return Text(safe_text(s) if multiline else safe_line(s), style=style)


# Warnings, errors and hints are one line each whatever the terminal's width (soft_wrap: a terminal
# wraps them itself; a script or a test reading stderr sees the line whole, never cut at 80 columns).
def warn(message: str) -> None:
    console.print(Text("warning: ", style="bold yellow") + safe(message), soft_wrap=True)


def error(message: str, hint: str | None = None) -> None:
    console.print(Text("error: ", style="bold red") + safe(message), soft_wrap=True)
    if hint:
        console.print(Text("hint: ", style="cyan") + safe(hint), soft_wrap=True)


class PrepareDisplay(PrepareEvents):
    """The front of the pipeline drawn: slow work as a :class:`StepsReporter`, warnings as lines."""

    @contextlib.contextmanager
    def slow(self, title: str) -> Iterator[Reporter]:
        rep = StepsReporter(title)
        with rep.running():
            yield rep

    def warn(self, message: str) -> None:
        warn(message)


class StepsReporter:
    """A :class:`labctl.events.Reporter` drawing steps (which may overlap) with rich."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.steps: dict[str, tuple[float, float | None]] = {}
        self.lock = threading.Lock()
        self.live: Live | None = None
        self.warnings: list[str] = []

    def __rich__(self) -> Group:
        rows: list[Any] = [Text(self.title, style="bold")]
        now = time.monotonic()
        with self.lock:
            for name, (t0, t1) in self.steps.items():
                if t1 is None:
                    rows.append(Spinner("dots", text=Text(f"{name}  {now - t0:4.0f} s")))
                else:
                    rows.append(Text(f"✓ {name}  {t1 - t0:.1f} s", style="green"))
        return Group(*rows)

    @contextlib.contextmanager
    def running(self) -> Iterator[StepsReporter]:
        try:
            with Live(self, console=console, refresh_per_second=8, transient=False) as live:
                self.live = live
                yield self
        finally:
            if not console.is_terminal:  # rich leaves the last line open when it is not drawing on a terminal
                console.line()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        with self.lock:
            self.steps[name] = (time.monotonic(), None)
        try:
            yield
        finally:
            with self.lock:
                self.steps[name] = (self.steps[name][0], time.monotonic())

    def note(self, message: str) -> None:
        console.print(safe(message))

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        warn(message)


PHASE_STYLE = {"starting": "dim", "booting": "yellow", "ssh": "cyan", "ready": "green", "failed": "bold red"}


class UpDisplay(UpEvents):
    """Live per-guest phases during ``labctl up`` (implements UpEvents)."""

    def __init__(self, lab: str, guests: list[str]) -> None:
        self.lab = lab
        self.t0 = time.monotonic()
        self.phase = {g: ("waiting", self.t0) for g in guests}
        self.lock = threading.Lock()
        self.live: Live | None = None

    def __rich__(self) -> Table:
        t = Table(title=Text(f"bringing up {self.lab}"), title_justify="left", box=None)
        t.add_column("guest")
        t.add_column("phase")
        t.add_column("time", justify="right")
        now = time.monotonic()
        with self.lock:
            for g, (ph, since) in self.phase.items():
                end = since if ph in ("ready", "failed") else now
                t.add_row(g, Text(ph, style=PHASE_STYLE.get(ph, "")), f"{end - self.t0:.1f} s")
        return t

    def guest_phase(self, guest: str, phase: str) -> None:
        with self.lock:
            self.phase[guest] = (phase, time.monotonic())

    def warn(self, message: str) -> None:
        warn(message)

    def started(self) -> None:
        self.live = Live(self, console=console, refresh_per_second=8, transient=True)
        self.live.start()

    def finished(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
