"""Kernel debugging helpers: oops parsing (:mod:`.oops`) and symbolization (:mod:`.symbolize`).

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
