"""What the steps runner tells its caller as steps start and end, without printing anything itself."""

from __future__ import annotations

from labctl.steps.result import StepResult


class StepEvents:
    """What the steps runner tells its caller as steps start and end (the CLI prints a line each).

    This default does nothing; the CLI passes one that draws with rich.
    """

    def step_started(self, name: str, variant: str | None) -> None:
        """Step ``name`` (matrix row ``variant``) starts."""

    def step_finished(self, result: StepResult) -> None:
        """A step variant ended (ok, failed or skipped), with its result."""

    def step_progress(self, message: str) -> None:
        """What a running step is doing meanwhile (building the selftests, copying them...)."""
