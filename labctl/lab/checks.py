"""The training sections of a lab file: each guest's ``setup`` commands and the lab's graded ``checks``.

::

    guests:
      b:
        setup:                        # run once the guest is up, before its post-boot snapshot
          - sysctl -w net.ipv4.conf.all.rp_filter=1
    checks:                           # labctl check LAB: each command exits 0 when that part is done
      - name: pings-again
        guest: a
        command: ping -c 2 -W 2 -I 10.80.9.1 10.80.1.2
        hint: which counter rises on b while the pings fail?
        timeout: 30                   # seconds (default 30)
      - name: ttl-64                  # or an expression on the guest's running kernel, read with drgn
        guest: b
        drgn: prog['init_net'].ipv4.sysctl_ip_default_ttl == 64

A check has a ``command`` (a shell command on the guest) or a ``drgn`` expression (true when that
part is done: :mod:`.drgnexpr` says what it may use), not both.
"""

from __future__ import annotations

import re

import labctl.lab.drgnexpr as drgnexpr  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.lab.checker import Checker, describe, did_you_mean, join
from labctl.lab.model import Check
from labctl.lab.yamlpos import YamlMap, YamlSeq

CHECK_KEYS = ("name", "guest", "command", "drgn", "hint", "timeout")
CHECK_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
CHECK_NAME_RULE = "use 1-48 of a-z, 0-9, '_', '-', starting with a letter or digit"
MAX_CHECKS = 64
MAX_SETUP = 64
MAX_COMMAND = 4096


def parse_setup(check: Checker, body: YamlMap, path: str) -> tuple[str, ...]:
    """A guest's ``setup``: a list of non-empty shell command strings (or one string)."""
    value, where = body.get("setup"), join(path, "setup")
    if value is None:
        return ()
    if isinstance(value, str):
        value_list: list[tuple[object, int, str]] = [(value, body.value_line("setup"), where)]
    elif isinstance(value, YamlSeq):
        if len(value) > MAX_SETUP:
            check.add(body.value_line("setup"), where, f"{len(value)} commands: at most {MAX_SETUP}")
            return ()
        value_list = [(item, value.item_line(i), f"{where}[{i}]") for i, item in enumerate(value)]
    else:
        check.add(body.value_line("setup"), where, f"expected a string or a list of strings, got {describe(value)}")
        return ()
    out = []
    for item, line, at in value_list:
        command = _command(check, item, line, at)
        if command is not None:
            out.append(command)
    return tuple(out)


def _command(check: Checker, item: object, line: int, where: str) -> str | None:
    if not isinstance(item, str):
        check.add(line, where, f"expected a string, got {describe(item)}")
        return None
    if not item.strip():
        check.add(line, where, "empty command")
        return None
    if len(item) > MAX_COMMAND:
        check.add(line, where, f"command of {len(item)} characters: at most {MAX_COMMAND}")
        return None
    return item


def parse_checks(check: Checker, data: YamlMap, guests: set[str]) -> tuple[Check, ...]:
    """The lab's ``checks``: unique names, an existing guest, a command, an optional hint and timeout."""
    seq = check.sequence(data, "checks", "")
    if len(seq) > MAX_CHECKS:
        check.add(data.value_line("checks"), "checks", f"{len(seq)} checks: at most {MAX_CHECKS}")
        return ()
    out: list[Check] = []
    seen: dict[str, int] = {}
    for m, path, line in check.mappings(seq, "checks"):
        check.keys(m, path, CHECK_KEYS, ("name", "guest"))
        name = check.matching(m, "name", path, CHECK_NAME, "check name", CHECK_NAME_RULE, True)
        if name is not None:
            if name in seen:
                check.add(m.value_line("name"), join(path, "name"),
                          f"duplicate check name '{name}' (first at line {seen[name]})")
            seen.setdefault(name, m.value_line("name"))
        guest = check.string(m, "guest", path, True)
        if guest is not None and guest not in guests:
            check.add(m.value_line("guest"), join(path, "guest"),
                      f"unknown guest '{guest}'{did_you_mean(guest, sorted(guests), 'guests')}")
            guest = None
        kind, command = _what_it_runs(check, m, path, line)
        hint = check.string(m, "hint", path) or ""
        timeout = check.integer(m, "timeout", path, (1, 3600), " s")
        if name and guest and command:
            out.append(Check(name, guest, command, hint, float(timeout or 30), line, kind))
    return tuple(out)


def _what_it_runs(check: Checker, m: YamlMap, path: str, line: int) -> tuple[str, str | None]:
    """The check's kind (``shell`` or ``drgn``) and its command or expression (None when bad)."""
    given = [k for k in ("command", "drgn") if k in m]
    if len(given) != 1:
        check.add(line, path, "give one of 'command' (a shell command on the guest) or 'drgn' (an expression "
                              "on its kernel)" + (", not both" if given else ""))
        return "shell", None
    key = given[0]
    text = _command(check, m.get(key), m.value_line(key), join(path, key))
    if key == "drgn" and text is not None:
        try:
            drgnexpr.parse(text)
        except ValueError as exc:
            check.add(m.value_line(key), join(path, key), str(exc))
            return "drgn", None
    return ("drgn" if key == "drgn" else "shell"), text
