"""A step's ``follow:``: packets to follow through the lab's kernels and wires while the step runs.

::

    follow:
      filter: "icmp and host {{a.eth1.ip}}"   # pcap-filter syntax, the subset labctl.pktfilter follows
      guests: [a, r, b]                       # default: every guest of the lab
      wire: true                              # the host side of each followed NIC (default true)

The filter is checked here with its line (syntax, the supported primitives) as every matrix row
fills it in; the guests must be the lab's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from labctl.lab.checker import Checker, close_match
from labctl.lab.specs import GuestSpec
from labctl.lab.templates import yaml_bool
from labctl.lab.yamlpos import YamlMap, YamlSeq
from labctl.pktfilter import FilterError, parse

_KEYS = ("filter", "guests", "wire")


@dataclass(frozen=True)
class FollowSpec:
    filter: str  # template
    guests: tuple[str, ...] = ()  # empty: every guest
    wire: bool = True


def check_filter(value: str) -> str:
    """A follow filter as filled in, checked.

    :raise ValueError: for a filter labctl does not follow by.
    """
    try:
        parse(value)
    except FilterError as exc:
        raise ValueError(str(exc)) from None
    return value


def parse_follow(check: Checker, m: YamlMap, path: str, guests: dict[str, GuestSpec],
                 templates: Callable[[str, int, str], None], each_row: Callable[[str, Any, int, str], bool]
                 ) -> FollowSpec | None:
    """The step's ``follow`` (None when it has none or it is wrong; problems reported with their lines)."""
    f = check.section(m, "follow", path)
    if f is None:
        return None
    fpath = f"{path}.follow"
    check.keys(f, fpath, _KEYS)
    filt = check.string(f, "filter", fpath) or ""
    ok = True
    if filt:
        templates(filt, f.value_line("filter"), f"{fpath}.filter")
        ok = each_row(filt, check_filter, f.value_line("filter"), f"{fpath}.filter")
    names: list[str] = []
    seq = f.get("guests")
    if seq is not None:
        if not isinstance(seq, YamlSeq) and not isinstance(seq, list):
            check.add(f.value_line("guests"), f"{fpath}.guests", "expected a list of guests")
            ok = False
        else:
            for i, g in enumerate(seq):
                if not isinstance(g, str) or g not in guests:
                    check.add(f.value_line("guests"), f"{fpath}.guests[{i}]",
                              f"unknown guest '{g}'{close_match(str(g), guests)}")
                    ok = False
                elif g not in names:
                    names.append(g)
    wire = yaml_bool(check, f, "wire", fpath, True)
    return FollowSpec(filt, tuple(names), wire) if ok else None
