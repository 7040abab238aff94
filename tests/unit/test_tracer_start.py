"""A tracer that never says it records: the step's warning says why, in the guest's own words
when the tracer exited (bpftrace refusing a program the guest kernel's BTF types otherwise), and
that it timed out when it is still running."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from labctl.ssh import Result
from labctl.steps import tracers as tr
from labctl.steps.tracing import _not_recording

BPFTRACE = tr.Tracer("bpftrace", "bpftrace", ["bpftrace"], "bpftrace.json", signal="attached")
ERROR = ("bpftrace.bt:1:36-90: ERROR: str() expects an integer or a pointer type as first argument "
         "(string[16] provided)\n")


@dataclass
class Guest:
    answer: bytes
    asked: list[str]

    def run(self, command: str, timeout: float = 60) -> Result:
        self.asked.append(command)
        return Result(0, self.answer, b"", 0.0)


def _variant(answer: bytes) -> tuple[Any, Guest]:
    guest = Guest(answer, [])
    return SimpleNamespace(workdir="/tmp/labctl-step", sessions=SimpleNamespace(ssh=lambda g: guest)), guest


def test_an_exited_tracer_is_named_with_its_error() -> None:
    v, guest = _variant(ERROR.encode())
    said = _not_recording(v, "new", BPFTRACE)
    assert said.startswith("new: bpftrace exited before it recorded: bpftrace.bt:1:36-90: ERROR: str() expects"), said
    assert "(string[16] provided)" in said and "\n" not in said
    assert "bpftrace.pid" in guest.asked[0] and "bpftrace.log" in guest.asked[0] and "/tmp/labctl-step" in guest.asked[0]


def test_a_tracer_still_running_timed_out() -> None:
    v, _ = _variant(b"running\n")
    said = _not_recording(v, "new", BPFTRACE)
    assert said == (f"new: bpftrace did not start recording within {tr.READY_TIMEOUT} s (see bpftrace.log); "
                    "the step ran without it")


def test_the_guests_words_are_made_safe_to_print() -> None:
    v, _ = _variant(b"ERROR: \x1b]0;owned\x07 bad\n")
    said = _not_recording(v, "new", BPFTRACE)
    assert "\x1b" not in said and "\x07" not in said and "bad" in said
