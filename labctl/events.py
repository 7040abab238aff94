"""How the library tells its caller what happens, without printing anything itself.

Three kinds of news, one module: slow work's progress (:class:`Reporter`,
e.g. an image build), guests coming up (:class:`UpEvents`) and steps
running (:class:`StepEvents`). The CLI passes implementations that draw
with rich; tests and scripts pass the defaults here, which only log or do
nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from labctl.steps.result import StepResult

log = logging.getLogger("labctl")


class Reporter(Protocol):
    def step(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Bracket one named step of a slow operation."""

    def note(self, message: str) -> None:
        """Say something worth a line (e.g. 'image is up to date')."""

    def warn(self, message: str) -> None:
        """Say something the user should act on or know."""


class NullReporter:
    """A reporter that only logs, with each step's duration."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.durations: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        log.info("%s ...", name)
        try:
            yield
        finally:
            self.durations[name] = time.monotonic() - t0
            log.info("%s: %.1f s", name, self.durations[name])

    def note(self, message: str) -> None:
        log.info("%s", message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning("%s", message)


class UpEvents:
    """What ``up`` tells its caller as it goes (the CLI draws these)."""

    def started(self) -> None:
        """``up`` begins starting guests (a display may open)."""

    def finished(self) -> None:
        """``up`` is done, whether the lab came up or not (a display closes)."""

    def guest_phase(self, guest: str, phase: str) -> None:
        """``guest`` entered ``phase``: starting, booting, ssh, ready, failed."""

    def warn(self, message: str) -> None:
        """A warning worth one line."""


class StepEvents:
    """What the steps runner tells its caller as steps start and end (the CLI prints a line each)."""

    def step_started(self, name: str, variant: str | None) -> None:
        """Step ``name`` (matrix row ``variant``) starts."""

    def step_finished(self, result: StepResult) -> None:
        """A step variant ended (ok, failed or skipped), with its result."""
