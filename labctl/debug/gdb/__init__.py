"""gdb against a guest's QEMU gdbstub: an init script for interactive use, and
scripted breakpoint sessions over gdb/MI for lab steps.

Every guest's QEMU listens for gdb on a unix socket in the guest's 0700
directory (``gdb`` in the lab state) of the machine that runs it
(:class:`GdbStub`), never on a TCP port. Connecting
*pauses the whole guest*; it runs again only when gdb resumes or detaches. A gdb that dies without detaching leaves the guest
paused (QEMU does not resume on disconnect), which is why
:func:`run_breakpoint_session` always detaches and, as a last resort, resumes
the guest through QMP. QMP goes through the guest's backend
(:class:`BackendMonitor`: the qemu backend's monitor socket, libvirt's
monitor passthrough), so libvirt guests are handled the same way. A guest on
a remote libvirt host has its gdbstub's socket on that host: gdb reaches it
through an OpenSSH stream-local forward to a 0600 socket in the guest's
directory here, logged in as the host's ``qemu+ssh://`` URI is, so nothing
listens on any TCP port for it.

Interactive (``labctl gdb``)::

    target = gdb_target(state, "a")             # socket, vmlinux, module commands...
    with target.stub.local(scratch) as sock:    # the socket here (an SSH forward if remote)
        text = init_script(sock, module_cmds)   # written 0600 by write_init_script

Scripted (lab steps, tests)::

    spec = GdbSpec("e1000_xmit_frame", hits=2, step=3)
    t = run_breakpoint_session(target.stub, vmlinux, module_cmds, spec, out_dir, monitor=target.monitor)
    t.hits, t.timed_out, t.message, t.stops        # + gdb-transcript.{json,txt}

Under TCG both software (``Z0``) and hardware (``Z1``) breakpoints are
QEMU-side breakpoints: nothing is written into guest memory, so module text
works like any other. Breakpoints are hardware ones by default (they also
behave under KVM, up to four at a time).

The package: :mod:`.transcript` (what to do, what happened, MI records),
:mod:`.mi` (one gdb/MI process), :mod:`.stub` (where the gdbstub is, who
holds it, QMP around a session), :mod:`.session` (the scripted breakpoint
session) and :mod:`.target` (a lab guest's gdb view and the init script).
Must not import the CLI or the steps runner.

Imports never: labctl.cli, labctl.steps.runner
"""

from __future__ import annotations

from labctl.backends import BackendMonitor, Monitor, SocketMonitor, as_monitor, ensure_resumed, qmp_running
from labctl.debug.gdb.mi import MiResult, MiSession
from labctl.debug.gdb.session import attach, insert_breakpoint, leave_running, load_symbols, run_breakpoint_session
from labctl.debug.gdb.stub import GdbStub, ensure_gdbstub_free, gdbstub_clients, target_remote
from labctl.debug.gdb.target import (
    NO_KILL_HOOK,
    GdbTarget,
    build_paths,
    find_source_dir,
    gdb_target,
    guest_module_commands,
    init_script,
    source_commands,
    write_init_script,
)
from labctl.debug.gdb.transcript import (
    TRANSCRIPT_JSON,
    TRANSCRIPT_TXT,
    ArgValue,
    FrameInfo,
    GdbSpec,
    StopRecord,
    Transcript,
    format_stop,
    format_transcript,
    is_breakpoint_hit,
    mi_quote,
    parse_arg,
    parse_frame,
    parse_register_names,
    parse_register_values,
    parse_stack,
    parse_stack_args,
    stop_reason,
    write_transcript,
)
from labctl.errors import DebugError, MiTimeout

__all__ = [
    "NO_KILL_HOOK", "TRANSCRIPT_JSON", "TRANSCRIPT_TXT", "ArgValue", "BackendMonitor", "DebugError", "FrameInfo",
    "GdbSpec", "GdbStub", "GdbTarget", "MiResult", "MiSession", "MiTimeout", "Monitor", "SocketMonitor",
    "StopRecord", "Transcript", "as_monitor", "attach", "build_paths", "ensure_gdbstub_free", "ensure_resumed",
    "find_source_dir", "format_stop", "format_transcript", "gdb_target", "gdbstub_clients", "guest_module_commands",
    "init_script", "insert_breakpoint", "is_breakpoint_hit", "leave_running", "load_symbols", "mi_quote",
    "parse_arg", "parse_frame", "parse_register_names", "parse_register_values", "parse_stack",
    "parse_stack_args", "qmp_running", "run_breakpoint_session", "source_commands", "stop_reason",
    "target_remote", "write_init_script", "write_transcript",
]
