"""``labctl gdb LAB GUEST [--batch CMD...]``: gdb attached to a guest's kernel.

gdb starts with the image's ``vmlinux.debug``, the debug symbols of every
module loaded in the guest, the kernel source (when the image has
``source/``) and ``target remote`` to the guest's gdbstub. The guest is
paused while gdb holds it; ``continue`` resumes it, ``detach`` or ``quit``
leave it running.
"""

from __future__ import annotations

import argparse
import shutil
import signal

from labctl.cli.ui import console, out, safe
from labctl.debug import (
    DebugError,
    GdbTarget,
    ensure_gdbstub_free,
    ensure_resumed,
    gdb_target,
    guest_module_commands,
    init_script,
    qmp_running,
    source_commands,
    write_init_script,
)
from labctl.errors import HostError, ProcessError
from labctl.proc import foreground, run
from labctl.state import LabState

SCRIPT_NAME = "gdb-init.gdb"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("gdb", help="gdb attached to a guest's kernel (symbols, modules, source)",
                       description="Start gdb attached to the guest's kernel through QEMU's gdbstub. "
                                   "The guest is paused while gdb holds it; 'detach' or 'quit' leave it running.")
    p.add_argument("lab", help="the lab (with --replay: a run's bundle)")
    p.add_argument("guest")
    p.add_argument("--replay", action="store_true",
                   help="gdb on a replay of the guest's recording in the run bundle LAB (labctl run --record)")
    p.add_argument("--batch", metavar="CMD", nargs="+", action="extend",
                   help="run these gdb commands non-interactively, print their output, detach")
    p.add_argument("--no-modules", action="store_true",
                   help="do not load module symbols (skips reading section addresses over SSH)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for --batch (default 300)")
    p.set_defaults(func=cmd_gdb)


def prepare(state: LabState, guest: str, modules: bool) -> tuple[GdbTarget, list[str]]:
    """Resolve the guest's gdb target and its module commands.

    Module addresses are read over SSH *before* gdb attaches: the guest is paused afterwards.
    """
    if shutil.which("gdb") is None:
        raise HostError("gdb is not installed", hint="run setup.sh (or apt-get install gdb)")
    target = gdb_target(state, guest)
    ensure_gdbstub_free(target.stub)
    module_cmds = guest_module_commands(state, guest, target.debug_modules) if modules else []
    return target, module_cmds


def cmd_gdb(args: argparse.Namespace) -> int:
    if args.replay:
        from labctl.cli.gdb_replay import cmd_gdb_replay

        return cmd_gdb_replay(args)
    state = LabState.load(args.lab)
    target, module_cmds = prepare(state, args.guest, not args.no_modules)
    with target.stub.local(target.run_dir) as local:  # a remote stub: an SSH forward for as long as gdb runs
        text = init_script(local, module_cmds, source_commands(target.source_dir, target.manifest),
                           interactive=not args.batch)
        script = str(write_init_script(target.run_dir / SCRIPT_NAME, text))
        if args.batch:
            return run_batch(target, script, args.batch, args.timeout)
        return run_interactive(target, script)


def run_interactive(target: GdbTarget, script: str) -> int:
    """gdb on this terminal until the user quits; Ctrl-C belongs to gdb (it stops the guest)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return foreground(["gdb", "-q", "-x", script, str(target.vmlinux)])
    finally:
        signal.signal(signal.SIGINT, previous)


def run_batch(target: GdbTarget, script: str, commands: list[str], timeout: float) -> int:
    """Run ``commands`` in gdb -batch after the init script, detach, print the output.

    :raise DebugError: when gdb fails or runs out of time (the guest is resumed then).
    """
    argv = ["gdb", "-q", "-nx", "-batch", "-x", script]
    for cmd in commands:
        argv += ["-ex", cmd]
    argv += ["-ex", "detach", str(target.vmlinux)]
    was_running = qmp_running(target.monitor)
    try:
        done = run(argv, timeout, check=False)
    except ProcessError as exc:  # the timeout (gdb's group was killed)
        ensure_resumed(target.monitor, was_running, False)
        raise DebugError(f"gdb did not finish within {timeout:g} s", hint="raise --timeout") from exc
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    if stdout:
        out.print(safe(stdout.rstrip("\n")), soft_wrap=True)
    if done.returncode != 0:
        ensure_resumed(target.monitor, was_running, False)
        last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
        raise DebugError(f"gdb failed (exit status {done.returncode}): {last}",
                         hint=f"init script: {script}")
    if stderr.strip():
        console.print(safe(stderr.rstrip("\n")), soft_wrap=True)
    return 0
