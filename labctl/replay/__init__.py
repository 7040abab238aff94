"""Record and replay of a guest's execution (QEMU's ``-icount rr=record|replay``, TCG only).

Owns: the recordings a run keeps in its bundle (:mod:`.keep`),
a recorded run's guests (:mod:`.runrec`) and running a replay from a bundle (:mod:`.replayer`); the
argv a recorded guest runs with and the argv of its replay are the QEMU backend's
(``labctl.backends.qemu.rrargv``, pure, handed on by :mod:`labctl.backends`). A recording holds the guest's non-deterministic
inputs (interrupts, clocks, console and network input, disk completions); its replay needs the same
QEMU, kernel, initrd and image, which its manifest names and :func:`.keep.load` checks.

Must not import the CLI, the steps runner or the report.

Imports never: labctl.cli, labctl.steps, labctl.report
"""

from __future__ import annotations

from labctl.replay.keep import load
from labctl.replay.replayer import STALL, Replay
from labctl.replay.runrec import Recorder, check, failed_guests, recorded_lab

__all__ = ["STALL", "Recorder", "Replay", "check", "failed_guests", "load", "recorded_lab"]
