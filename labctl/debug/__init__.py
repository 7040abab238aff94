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

from labctl.debug.oops import Frame, Oops, parse_oopses
from labctl.debug.symbolize import DecodedFrame, DecodedOops, SourceLocation, Symbolizer

__all__ = [
    "DecodedFrame",
    "DecodedOops",
    "Frame",
    "Oops",
    "SourceLocation",
    "Symbolizer",
    "parse_oopses",
]
