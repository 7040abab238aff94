"""``labctl replay RUN GUEST``: a recorded guest's execution again, alone, from its run's bundle."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from labctl.backends import qemu_version
from labctl.cli.ui import console, out, safe
from labctl.errors import MachineError, UsageError
from labctl.replay import STALL, Replay, load

EXIT_DIFFERS = 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("replay", help="replay a recorded guest of a run alone; prints its console again",
                       description="Replay GUEST's recording from the run bundle RUN (labctl run --record) "
                                   "alone, to the recording's end, and print the replay's console; exit 1 "
                                   "when it differs from the recorded one.")
    p.add_argument("run", help="the run's bundle directory")
    p.add_argument("guest")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed for the replay (default 1800)")
    p.add_argument("--stall", type=float, default=STALL, metavar="SECONDS",
                   help=f"a replay whose instruction count stays this long has diverged (default {STALL:g})")
    p.add_argument("--console-out", metavar="FILE", help="also write the replay's console to FILE")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON (no console)")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    bundle = Path(args.run)
    if not bundle.is_dir():
        raise UsageError(f"{bundle}: no such run bundle")
    recording = load(bundle, args.guest, qemu_version())
    with Replay(recording) as replay, console.status(f"replaying guest {args.guest}"):
        replay.start()
        ended = replay.wait(args.timeout, args.stall)
        replay_log = replay.qemu_log()
    recorded = recording.console.read_bytes()
    same = ended.console == recorded
    if args.console_out:  # also when it diverged: what it replayed
        Path(args.console_out).write_bytes(ended.console)
    result = {"guest": args.guest, "end": ended.end, "instructions": ended.icount, "seconds": ended.seconds,
              "console_bytes": len(ended.console), "recorded_console_bytes": len(recorded), "identical": same,
              "recording": recording.manifest.get("covers", {})}
    if args.json:
        out.print(json.dumps(result, indent=2), soft_wrap=True)
    else:
        sys.stdout.flush()
        out.print(safe(ended.console.decode("utf-8", "replace")), end="", soft_wrap=True)
        console.print(f"replay of {args.guest}: {ended.end} after {ended.seconds:g} s, "
                      f"{ended.icount} instructions; console "
                      + ("identical to the recorded one" if same else
                         f"DIFFERS from the recorded one ({len(ended.console)} vs {len(recorded)} bytes)"))
    if ended.end == "stalled":
        raise MachineError(f"the replay stopped advancing at instruction {ended.icount} of "
                         f"{recording.manifest.get('covers', {}).get('instructions')}: it diverged from its recording",
                         hint="see docs/record-replay.md (what was seen on QEMU 7.2)")
    if ended.end == "died":
        raise MachineError(f"the replay's QEMU ended before the recording's end: {replay_log}")
    if ended.end == "timeout":
        raise UsageError(f"the replay did not reach the recording's end within {args.timeout:g} s",
                         hint="raise --timeout")
    return 0 if same else EXIT_DIFFERS
