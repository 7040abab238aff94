"""A step's ``gdb:`` kind, its lab-file side: a scripted breakpoint session that runs alongside the
step's commands (run by :mod:`labctl.steps.gdbstep`, shown by :mod:`labctl.report.gdbsession` in each step's
section), and its record in the step's result.

::

    gdb: {guest: a, break: ip_rcv, hits: 1, step: 0, step_mode: line,
          registers: [rip, rsp], backtrace: 10, timeout: 60}
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from labctl.lab.checker import Checker
from labctl.lab.templates import yaml_strings
from labctl.lab.yamlpos import YamlMap

_GDB_KEYS = ("guest", "break", "hits", "step", "step_mode", "registers", "backtrace", "timeout")
STEP_MODES = ("line", "into", "instruction")
_LOCATION = re.compile(r"[A-Za-z0-9_.:*+/-]{1,200}")
_REGISTER = re.compile(r"[a-z0-9]{2,8}")


@dataclass(frozen=True)
class GdbStep:
    """A scripted gdb breakpoint session that runs alongside the step's commands."""

    guest: str
    location: str  # template
    hits: int = 1
    step: int = 0
    step_mode: str = "line"
    registers: tuple[str, ...] = ("rip", "rsp", "rdi", "rsi")
    backtrace: int = 10
    timeout: float = 60.0


class GdbRecord(TypedDict):
    """The step's scripted gdb session: the breakpoint as gdb described it, its hits."""

    breakpoint: dict[str, Any]
    hits: int
    timed_out: bool
    message: str
    transcript: str


def check_location(value: str) -> str:
    """A gdb breakpoint location (a function, FILE:LINE or *ADDR) as filled in, checked.

    :raise ValueError: for anything else (it would be gdb syntax of its own).
    """
    if not _LOCATION.fullmatch(value):
        raise ValueError(f"invalid breakpoint location '{value}' (a function, FILE:LINE or *ADDR)")
    return value


def parse_gdb(c: Checker, m: YamlMap, path: str, templates: Callable[[str, int, str], None],
              each_row: Callable[[str, Callable[[str], object], int, str], bool],
              guest_of: Callable[[YamlMap, str, str], str | None]) -> GdbStep | None:
    """The step's ``gdb`` (None when it has none or it is wrong; problems reported with their lines)."""
    g = c.section(m, "gdb", path)
    if g is None:
        return None
    gpath = f"{path}.gdb"
    c.keys(g, gpath, _GDB_KEYS, ("guest", "break"))
    guest = guest_of(g, "guest", gpath)
    loc = c.string(g, "break", gpath, required=True)
    if loc is not None:
        templates(loc, g.value_line("break"), f"{gpath}.break")
        if not each_row(loc, check_location, g.value_line("break"), f"{gpath}.break"):
            loc = None
    mode = c.string(g, "step_mode", gpath) or "line"
    if mode not in STEP_MODES:
        c.add(g.value_line("step_mode"), f"{gpath}.step_mode", f"step_mode must be one of {', '.join(STEP_MODES)}")
    regs = yaml_strings(c, g, "registers", gpath, _REGISTER, "register") or ("rip", "rsp", "rdi", "rsi")
    hits = c.integer(g, "hits", gpath, (1, 1000))
    step = c.integer(g, "step", gpath, (0, 1000))
    bt = c.integer(g, "backtrace", gpath, (0, 100))
    timeout = c.integer(g, "timeout", gpath, (1, 3600), " s")
    if guest is None or loc is None:
        return None
    return GdbStep(guest, loc, hits or 1, step or 0, mode, regs, 10 if bt is None else bt, float(timeout or 60))
