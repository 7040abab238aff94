"""A step's ``sysctls:`` kind, its lab-file side: sysctls set in some guests for the step's duration
and put back after (run by :mod:`labctl.steps.sysctl_kind`, shown by
:mod:`labctl.report.sysctls`); the example of docs/development.md's "Adding a step kind".

::

    steps:
      - name: reno
        sysctls:
          a: {net.ipv4.tcp_congestion_control: reno}     # GUEST: {NAME: VALUE}, names as sysctl(8) writes them
        run: [...]

Names and values are checked as a guest's own ``sysctls`` are (:func:`labctl.lab.netconf.parse_sysctls`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from labctl.lab.checker import Checker, close_match, join
from labctl.lab.ifaces import Sysctl
from labctl.lab.netconf import parse_sysctls as parse_guest_sysctls
from labctl.lab.specs import GuestSpec
from labctl.lab.yamlpos import YamlMap


@dataclass(frozen=True)
class StepSysctls:
    """``guest -> the sysctls set in it`` for the step's duration, in the lab file's order."""

    guests: tuple[tuple[str, tuple[Sysctl, ...]], ...]


class SysctlValue(TypedDict):
    """One sysctl of the step: its value before, the value set, the value read back after the step."""

    before: str | None
    set: str
    restored: bool


class SysctlRecord(TypedDict):
    """The step's sysctls: guest -> sysctl name -> :class:`SysctlValue`."""

    guests: dict[str, dict[str, SysctlValue]]


def parse_sysctls(c: Checker, m: YamlMap, path: str, guests: Mapping[str, GuestSpec]) -> StepSysctls | None:
    """The step's ``sysctls`` (None when it has none or it is wrong; problems reported with their lines)."""
    body = c.section(m, "sysctls", path)
    if body is None:
        return None
    where = join(path, "sysctls")
    out: list[tuple[str, tuple[Sysctl, ...]]] = []
    ok = True
    for guest in body:
        if guest not in guests:
            c.add(body.key_line(guest), f"{where}.{guest}", f"unknown guest '{guest}'{close_match(guest, guests)}")
            ok = False
            continue
        one = YamlMap(body.line)  # the guest's mapping as a guest's own ``sysctls`` key
        one["sysctls"] = body[guest]
        one.value_lines["sysctls"] = body.value_line(guest)
        gpath, before = f"{where}.{guest}", len(c.problems)
        found = parse_guest_sysctls(c, one, gpath)
        # its problems read at the step's path (GUEST.NAME), not at a guest's own (GUEST.sysctls.NAME)
        c.problems[before:] = [p._replace(path=p.path.replace(f"{gpath}.sysctls", gpath, 1))
                               for p in c.problems[before:]]
        ok = ok and len(c.problems) == before
        out.append((guest, tuple(s for s, _ in found)))
    return StepSysctls(tuple(out)) if ok else None
