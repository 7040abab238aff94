"""Running graded checks (labctl.grading): what each outcome of the guest's command means, over one
connection per guest, with a fake session and a fake clock (real guests: test_training_class,
test_junit in tests/integration)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labctl.errors import GuestError
from labctl.grading import ERROR, FAIL, PASS, TIMEOUT, run_on_guest, summary
from labctl.lab.model import Check
from labctl.ssh import Result
from labctl.state.runstate import LabState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Guest:
    """Answers each check's command with (status, seconds it takes); status None: the SSH session fails."""

    def __init__(self, clock: Clock, answers: dict[str, tuple[int | None, float]]) -> None:
        self.clock, self.answers, self.sessions, self.commands = clock, answers, 0, []

    def connect(self, ep: Any) -> Any:
        self.sessions += 1
        return self

    def run(self, command: str, timeout: float) -> Result:
        self.commands.append(command)
        name = next(n for n in self.answers if f"check-{n}" in command)
        status, seconds = self.answers[name]
        self.clock.now += seconds
        if status is None:
            raise GuestError("the SSH connection was lost")
        return Result(status, b"out\n", b"", seconds)

    def close(self) -> None:
        pass


def _state(tmp_path: Path) -> LabState:
    state = LabState(lab="g", source="g.yaml", dir=str(tmp_path), backend="qemu", accel="tcg", image={},
                     started_at="now", guests={})
    state.endpoint = lambda guest: f"ep-{guest}"  # type: ignore[method-assign, assignment, return-value]
    return state


def _check(name: str, timeout: float = 20.0) -> Check:
    return Check(name, "a", f"echo check-{name}", timeout=timeout)


def test_each_outcome_of_a_check(tmp_path: Path) -> None:
    clock = Clock()
    guest = Guest(clock, {"ok": (0, 1.0), "no": (1, 1.0), "slow": (124, 20.2), "own124": (124, 3.0),
                          "lost-late": (None, 25.0), "lost": (None, 0.5), "after": (0, 1.0)})
    checks = [_check(n) for n in guest.answers]
    results = run_on_guest(_state(tmp_path), "a", checks, connect=guest.connect, clock=clock)
    assert [(r.name, r.status) for r in results] == [
        ("ok", PASS), ("no", FAIL), ("slow", TIMEOUT), ("own124", FAIL), ("lost-late", TIMEOUT), ("lost", ERROR),
        ("after", PASS)]
    assert [r.passed for r in results] == [True, False, False, False, False, False, True]
    assert summary(results) == {"passed": 2, "total": 7, "failing": ["no", "slow", "own124", "lost-late", "lost"]}
    assert results[2].summary() == "timeout (20 s)" and results[2].exit_status == 124
    assert guest.sessions == 3  # one connection, a new one after each lost one
    assert all(c.startswith("timeout -k 2 20 sh -c ") for c in guest.commands)  # bounded on the guest too
