"""How the library tells its caller what happens, without printing anything itself.

Two kinds of news here: slow work's progress (:class:`Reporter`, e.g. an
image build) and guests coming up (:class:`UpEvents`); steps running are the
steps stage's own (:class:`labctl.steps.result.StepEvents`), so that this
module, which every stage uses, imports none of them. The CLI passes implementations that draw
with rich; tests and scripts pass the defaults here, which only log or do
nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Protocol

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



class PrepareEvents:
    """What the front of the pipeline (:func:`labctl.pipeline.prepare`) tells its caller."""

    @contextlib.contextmanager
    def slow(self, title: str) -> Iterator[Reporter]:
        """Slow work begins (an image to build, kernels to prepare); its steps go to the reporter
        yielded, until the block ends. Not called when everything is in the cache."""
        yield NullReporter()

    def warn(self, message: str) -> None:
        """A warning worth one line (the preflight's, about a guest's kernel)."""
        log.warning("%s", message)
