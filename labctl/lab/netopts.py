"""The lab file's network options, checked with their lines: what is captured and what is impaired.

::

    networks:
      lan: {capture: true}                 # every member NIC, during every step
      wan: {capture: [a.eth2]}             # or some of its members
    guests:
      a:
        nics:
          - {name: eth1, ..., impair: {delay: 20ms, loss: 1%}}   # from up to down
    steps:
      - name: lossy
        matrix: [{label: p5, loss: 5%}]
        impair: {a.eth1: {loss: "{{loss}}"}}   # for the step's duration ({} or null: none)
        run:
          - {link: a.eth1, state: down}      # QMP set_link, in order with the commands
        trace:
          b: {capture: [eth1]}               # or true: all of b's lab NICs

Impairment values follow :mod:`labctl.lab.impair`. Templates in a step's
``impair`` are filled in from every matrix row and checked here, and again
where they are used.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from labctl.lab.checker import Checker, close_match, did_you_mean, join
from labctl.lab.impair import IMPAIR_KEYS, Impairment, needs_delay, parse_impairment, parse_value
from labctl.lab.specs import GuestSpec, NetSpec
from labctl.lab.yamlpos import YamlMap, YamlSeq

LINK_STATES = ("up", "down")
_MEMBER = re.compile(r"([a-z][a-z0-9-]{0,30})\.([A-Za-z][A-Za-z0-9_.-]{0,14})")


@dataclass(frozen=True)
class StepImpair:
    """A step's impairment of one NIC (``GUEST.NIC``, maybe a template); values are templates too."""

    nic: str
    values: tuple[tuple[str, str], ...]
    line: int


@dataclass(frozen=True)
class LinkSpec:
    """A step's ``{link: GUEST.NIC, state: up|down}`` entry, run in order with its commands."""

    nic: str  # template GUEST.NIC
    up: bool
    line: int


def nic_impairment(check: Checker, m: YamlMap, path: str) -> Impairment | None:
    """A NIC's ``impair`` mapping, checked (None when absent or empty)."""
    body = check.section(m, "impair", path)
    if body is None:
        return None
    where = join(path, "impair")
    check.keys(body, where, IMPAIR_KEYS)
    imp, problems = parse_impairment(body)
    for key, message in problems:
        check.add(body.value_line(key), join(where, key), message)
    return None if problems or imp.empty else imp


def network_capture(check: Checker, body: YamlMap, path: str) -> tuple[bool, tuple[str, ...]]:
    """A network's ``capture``: (every member?, the members listed as GUEST.NIC)."""
    value = body.get("capture")
    if value is None or value is False:
        return False, ()
    if value is True:
        return True, ()
    items = _strings(check, body, "capture", path, "true, false or a list of GUEST.NIC")
    return False, items


def check_captures(check: Checker, networks: dict[str, NetSpec], guests: dict[str, GuestSpec]) -> None:
    """Every NIC a network's ``capture`` lists is one of its members."""
    for net in networks.values():
        for item in net.capture:
            m = _MEMBER.fullmatch(item)
            nic = None
            if m is not None and m[1] in guests:
                nic = next((n for n in guests[m[1]].nics if n.name == m[2]), None)
            if nic is None or nic.network != net.name:
                members = [f"{g.name}.{n.name}" for g in guests.values() for n in g.nics if n.network == net.name]
                hint = close_match(item, members) or f" (its members: {', '.join(members) or 'none'})"
                check.add(net.capture_line, f"networks.{net.name}.capture",
                          f"'{item}' is not a NIC on network {net.name}{hint}")


def trace_capture(check: Checker, body: YamlMap, path: str, guest: GuestSpec) -> tuple[str, ...]:
    """A step's ``trace.GUEST.capture``: the guest's NIC names it captures (``true``: all)."""
    value = body.get("capture")
    if value is None or value is False:
        return ()
    names = [n.name for n in guest.nics if n.name]
    if value is True:
        if not names:
            check.add(body.value_line("capture"), join(path, "capture"), f"guest {guest.name} has no lab NIC")
        return tuple(names)
    items = _strings(check, body, "capture", path, "true, false or a list of NIC names")
    for item in items:
        if item not in names:
            hint = did_you_mean(item, names, "its NICs") if names else " (it has no lab NIC)"
            check.add(body.value_line("capture"), join(path, "capture"),
                      f"guest {guest.name} has no lab NIC '{item}'{hint}")
    return tuple(i for i in items if i in names)


def _strings(check: Checker, m: YamlMap, key: str, path: str, expected: str) -> tuple[str, ...]:
    value = m[key]
    if not isinstance(value, YamlSeq) or not all(isinstance(v, str) for v in value):
        check.add(m.value_line(key), join(path, key), f"expected {expected}")
        return ()
    seen: set[str] = set()
    for i, v in enumerate(value):
        if v in seen:
            check.add(value.item_line(i), f"{join(path, key)}[{i}]", f"'{v}' is listed twice")
        seen.add(v)
    return tuple(dict.fromkeys(value))


def step_impairs(check: Checker, m: YamlMap, path: str, templates: Callable[[str, int, str], None],
                 each_row: Callable[[str, Callable[[str], object], int, str], bool],
                 nic_ok: Callable[[str, int, str], None]) -> tuple[StepImpair, ...]:
    """A step's ``impair`` mapping: GUEST.NIC -> impairment values ({} or null: none), templates
    checked by ``templates`` (unknown variables), ``each_row`` (every matrix row's value) and
    ``nic_ok`` (the NIC exists for every row)."""
    body = check.section(m, "impair", path)
    if body is None:
        return ()
    where = join(path, "impair")
    out = []
    for nic, value in body.items():
        npath = f"{where}.{nic}"
        templates(nic, body.key_line(nic), npath)
        nic_ok(nic, body.key_line(nic), npath)
        values = check.mapping(value, body.value_line(nic), npath) if value is not None else YamlMap(body.line)
        if values is None:
            continue
        check.keys(values, npath, IMPAIR_KEYS)
        texts: dict[str, str] = {}
        for key in IMPAIR_KEYS:
            if values.get(key) is None:
                continue
            raw = values[key] if isinstance(values[key], str) else str(values[key])
            templates(raw, values.value_line(key), join(npath, key))
            if each_row(raw, _one_value(key), values.value_line(key), join(npath, key)):
                texts[key] = raw
        if not _combination_ok(check, values, texts, npath):
            continue
        out.append(StepImpair(nic, tuple(texts.items()), body.key_line(nic)))
    return tuple(out)


def _one_value(key: str) -> Callable[[str], object]:
    """A check of one filled-in value of ``key`` (raises ValueError with the reason)."""
    return lambda text: parse_value(key, _typed(key, text))


def _typed(key: str, text: str) -> object:
    """A filled-in template as the lab file would have typed it (``limit`` is a number)."""
    if key == "limit" and text.strip().isdigit():
        return int(text)
    return 0 if text.strip() == "0" else text


def _combination_ok(check: Checker, values: YamlMap, texts: dict[str, str], path: str) -> bool:
    """jitter and reorder need a delay, whatever the matrix row (checked on the values without templates)."""
    for key in ("jitter", "reorder"):
        if key in texts and "delay" not in texts:
            check.add(values.value_line(key), join(path, key), needs_delay(key))
            return False
    return True


def render_impairment(spec: StepImpair, fill: Callable[[str], str]) -> Impairment:
    """A step's impairment with its templates filled in by ``fill``, checked again.

    :raise ValueError: when a filled-in value is not allowed.
    """
    return Impairment.from_dict({k: _typed(k, fill(v)) for k, v in spec.values})


def link_spec(check: Checker, r: YamlMap, path: str, templates: Callable[[str, int, str], None],
              nic_ok: Callable[[str, int, str], None]) -> LinkSpec | None:
    """A run entry ``{link: GUEST.NIC, state: up|down}``."""
    check.keys(r, path, ("link", "state"), ("link", "state"))
    nic = check.string(r, "link", path, required=True)
    state = check.string(r, "state", path, required=True)
    if nic is not None:
        templates(nic, r.value_line("link"), join(path, "link"))
        nic_ok(nic, r.value_line("link"), join(path, "link"))
    if state is not None and state not in LINK_STATES:
        check.add(r.value_line("state"), join(path, "state"), f"state must be up or down, got '{state}'")
        return None
    if nic is None or state is None:
        return None
    return LinkSpec(nic, state == "up", r.line)
