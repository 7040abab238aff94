"""Kernel debugging: oopses found in console text (:mod:`.oops`), decoded to
source lines (:mod:`.symbolize`, :mod:`.elf`), shown as text
(:mod:`.oops_text`), crash detection for a lab (:mod:`.crash`), module
symbols from a running guest (:mod:`.modsyms`) and gdb against a guest's
gdbstub (:mod:`.gdb`).

Must not import steps, bundles, reports or the CLI.

Imports never: labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.state, labctl.live, labctl.training

Typical use::

    from labctl.debug import parse_oopses, Symbolizer

    oopses = parse_oopses(console_text)
    decoded = Symbolizer(vmlinux, modules_dir).decode(oopses)
    for d in decoded:
        print(d.oops.title)
        for f in d.frames:
            print(f.frame.symbol, f.file, f.line)
"""

from __future__ import annotations

from labctl.debug.crash import (
    CRASH_MARKERS,
    PANIC,
    console_crashed,
    console_end,
    crashed,
    decode_console,
    oops_titles,
    panicked,
)
from labctl.debug.gdb import (
    DebugError,
    GdbSpec,
    GdbTarget,
    Transcript,
    ensure_gdbstub_free,
    ensure_resumed,
    find_source_dir,
    gdb_target,
    guest_module_commands,
    init_script,
    qmp_running,
    run_breakpoint_session,
    source_commands,
    write_init_script,
)
from labctl.debug.oops import Frame, Oops, make_title, parse_oopses
from labctl.debug.oops_text import render_oops
from labctl.debug.symbolize import DecodedFrame, DecodedOops, ModuleIndex, SourceLocation, Symbolizer

__all__ = [
    "CRASH_MARKERS",
    "PANIC",
    "DebugError",
    "DecodedFrame",
    "DecodedOops",
    "Frame",
    "GdbSpec",
    "GdbTarget",
    "ModuleIndex",
    "Oops",
    "SourceLocation",
    "Symbolizer",
    "Transcript",
    "console_crashed",
    "console_end",
    "crashed",
    "decode_console",
    "ensure_gdbstub_free",
    "ensure_resumed",
    "find_source_dir",
    "gdb_target",
    "guest_module_commands",
    "init_script",
    "make_title",
    "oops_titles",
    "panicked",
    "parse_oopses",
    "qmp_running",
    "render_oops",
    "run_breakpoint_session",
    "source_commands",
    "write_init_script",
]
