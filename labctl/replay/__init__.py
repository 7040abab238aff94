"""Record and replay of a guest's execution (QEMU's ``-icount rr=record|replay``, TCG only).

Owns: the argv a recorded guest runs with and the argv of its replay (:mod:`.rrargv`, pure), what
cannot be recorded (:mod:`.refusals`), the recordings a run keeps in its bundle (:mod:`.keep`) and
running a replay from a bundle (:mod:`.replayer`). A recording holds the guest's non-deterministic
inputs (interrupts, clocks, console and network input, disk completions); its replay needs the same
QEMU, kernel, initrd and image, which its manifest names and :func:`.keep.load` checks.

Must not import the CLI, the steps runner or the report.

Imports never: labctl.cli, labctl.steps, labctl.report
"""

from __future__ import annotations

from labctl.replay.refusals import record_refusals
from labctl.replay.rrargv import RRFILE, recorded_argv, replay_argv

__all__ = ["RRFILE", "record_refusals", "recorded_argv", "replay_argv"]
