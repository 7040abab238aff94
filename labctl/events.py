"""How slow library work reports progress without printing anything itself.

The library calls a :class:`Reporter`; the CLI passes one that draws with
rich, tests and scripts pass :class:`NullReporter` (which only logs).
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
