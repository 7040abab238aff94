"""``labctl gdb --replay RUN GUEST``: gdb on a replay of a recorded guest (labctl run --record).

The replay starts paused before the machine's first instruction, with gdb holding it; the kernel's
symbols and source are those of ``labctl gdb`` (module symbols are not loaded: they come from the
running guest over SSH, which a replay has not). A replay is deterministic: every ``continue`` from
the same point reaches the same instruction. QEMU's gdbstub offers reverse execution in a replay
(``reverse-stepi``, ``reverse-continue``) by loading a snapshot of the replay and replaying forward;
see docs/record-replay.md for what QEMU 7.2 does with it here.
"""

from __future__ import annotations

import argparse
import shutil
import signal
from pathlib import Path

from labctl.backends import qemu_version
from labctl.cli.ui import console, out, safe
from labctl.debug import DebugError, find_source_dir, init_script, source_commands, write_init_script
from labctl.errors import HostError, ProcessError, UsageError
from labctl.kernel import Kernel
from labctl.proc import foreground, run
from labctl.replay import Replay, load


def replay_kernel(argv: list[str]) -> Kernel:
    """The prepared kernel a recording's ``-kernel`` is in."""
    path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-kernel"), None)
    if path is None:
        raise UsageError("the recording's QEMU argv has no -kernel")
    return Kernel.at(Path(path).parent)


def cmd_gdb_replay(args: argparse.Namespace) -> int:
    if shutil.which("gdb") is None:
        raise HostError("gdb is not installed", hint="run setup.sh (or apt-get install gdb)")
    bundle = Path(args.lab)
    if not bundle.is_dir():
        raise UsageError(f"{bundle}: no such run bundle", hint="labctl gdb --replay RUN GUEST: RUN is a run's bundle")
    recording = load(bundle, args.guest, qemu_version())
    kernel = replay_kernel(recording.argv)
    vmlinux = kernel.vmlinux_debug
    if not vmlinux.is_file():
        raise DebugError(f"the recording's kernel {kernel.name} has no vmlinux with debug info ({vmlinux})")
    with Replay(recording, paused=True) as replay:
        replay.start()
        source = find_source_dir(kernel.dir)
        text = init_script(str(replay.files.gdb), [], source_commands(source, kernel.manifest),
                           interactive=not args.batch)
        script = str(write_init_script(replay.dir / "gdb-init.gdb", text))
        if not args.batch:
            console.print(f"labctl: gdb on the replay of {args.guest} (paused before its first instruction; "
                          "reverse-stepi and reverse-continue need QEMU's replay snapshots)")
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                return foreground(["gdb", "-q", "-x", script, str(vmlinux)])
            finally:
                signal.signal(signal.SIGINT, previous)
        argv = ["gdb", "-q", "-nx", "-batch", "-x", script]
        for cmd in args.batch:
            argv += ["-ex", cmd]
        try:
            done = run([*argv, "-ex", "detach", str(vmlinux)], args.timeout, check=False)
        except ProcessError as exc:
            raise DebugError(f"gdb did not finish within {args.timeout:g} s", hint="raise --timeout") from exc
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    if stdout:
        out.print(safe(stdout.rstrip("\n")), soft_wrap=True)
    if stderr.strip():
        console.print(safe(stderr.rstrip("\n")), soft_wrap=True)
    if done.returncode != 0:
        raise DebugError(f"gdb failed (exit status {done.returncode})")
    return 0
