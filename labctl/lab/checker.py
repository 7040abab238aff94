"""Checking lab data: problems collected with their line, typed accessors, did-you-mean hints.

Shared by the lab file's sections (:mod:`.validate`, :mod:`.stepspec`,
:mod:`.addresses`): every check adds a :class:`~labctl.errors.Problem` and
carries on, so a file gets all its problems at once.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.errors import Problem
from labctl.lab.yamlpos import YamlMap, YamlSeq


@dataclass
class Checker:
    """Collects problems for one file; small typed accessors for YamlMaps."""

    file: str
    problems: list[Problem] = field(default_factory=list)
    owner: int | None = None  # the uid that owns the file (None: text given, not a file)
    remote: str | None = None  # the URL, git repository or pack the file came from (None: this host's)
    remote_root: Path | None = None  # a git lab's checkout: the only host files it may name

    def add(self, line: int, path: str, message: str) -> None:
        """Record one problem."""
        self.problems.append(Problem(self.file, line, path, message))

    def keys(
        self, m: YamlMap, path: str, allowed: tuple[str, ...],
        required: tuple[str, ...] = (), line: int | None = None,
    ) -> None:
        """Report keys of ``m`` not in ``allowed`` and missing ``required`` ones.

        Missing keys are reported at ``line`` (default: the mapping's line).
        """
        for key in m:
            if key not in allowed:
                hint = did_you_mean(key, allowed, "expected one of")
                self.add(m.key_line(key), join(path, key), f"unknown key '{key}'{hint}")
        for key in required:
            if key not in m:
                self.add(m.line if line is None else line, path, f"missing required key '{key}'")

    def string(self, m: YamlMap, key: str, path: str, required: bool = False) -> str | None:
        """``m[key]`` if it is a string; None if absent/null or wrong type (reported).

        With ``required``, a null value is reported too (absence is left to ``keys``).
        """
        value = m.get(key)
        if isinstance(value, str) or (value is None and not (required and key in m)):
            return value
        self.add(m.value_line(key), join(path, key), f"expected a string, got {describe(value)}")
        return None

    def boolean(self, m: YamlMap, key: str, path: str) -> bool | None:
        """``m[key]`` if it is true or false; None if absent/null or of another type (reported)."""
        value = m.get(key)
        if value is None or isinstance(value, bool):
            return value
        self.add(m.value_line(key), join(path, key), f"expected true or false, got {describe(value)}")
        return None

    def matching(
        self, m: YamlMap, key: str, path: str, pattern: re.Pattern[str], what: str, rule: str,
        required: bool = False,
    ) -> str | None:
        """``m[key]`` if it is a string matching ``pattern``; else None (reported)."""
        value = self.string(m, key, path, required)
        if value is not None and not pattern.fullmatch(value):
            self.add(m.value_line(key), join(path, key), f"invalid {what} '{value}' ({rule})")
            return None
        return value

    def integer(
        self, m: YamlMap, key: str, path: str, bounds: tuple[int, int], unit: str = "",
    ) -> int | None:
        """``m[key]`` if it is an int within ``bounds``; None if absent/null or bad (reported)."""
        if m.get(key) is None:
            return None
        value = m[key]
        line, where = m.value_line(key), join(path, key)
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(line, where, f"expected an integer, got {describe(value)}")
            return None
        low, high = bounds
        if not low <= value <= high:
            self.add(line, where, f"{key} {value}{unit} is out of range ({low}..{high})")
            return None
        return value

    def mapping(self, value: Any, line: int, path: str, allow_null: bool = True) -> YamlMap | None:
        """``value`` as a YamlMap (null gives an empty one); None if wrong type (reported)."""
        if isinstance(value, YamlMap):
            return value
        if value is None and allow_null:
            return YamlMap(line)
        self.add(line, path, f"expected a mapping, got {describe(value)}")
        return None

    def section(self, m: YamlMap, key: str, path: str) -> YamlMap | None:
        """``m[key]``, a mapping that may be left out: None when it is absent or null, or when it is
        not a mapping (reported at ``path.key``)."""
        if m.get(key) is None:
            return None
        return self.mapping(m[key], m.value_line(key), join(path, key), allow_null=False)

    def entries(self, m: YamlMap, key: str, path: str) -> Iterator[tuple[str, Any, str, int, int]]:
        """Each entry of ``m[key]``, a mapping that may be left out (:meth:`section`): its key, its
        value, its path (``path.key.k``), the key's line and the value's line."""
        items = self.section(m, key, path)
        if items is None:
            return
        where = join(path, key)
        for k, value in items.items():
            yield k, value, f"{where}.{k}", items.key_line(k), items.value_line(k)

    def mappings(self, items: YamlSeq, path: str) -> Iterator[tuple[YamlMap, str, int]]:
        """Each item of the list ``items`` (at ``path``) that is a mapping, with its path ``path[i]``
        and its line; an item that is not a mapping is reported and skipped."""
        for i, item in enumerate(items):
            where, line = f"{path}[{i}]", items.item_line(i)
            m = self.mapping(item, line, where, allow_null=False)
            if m is not None:
                yield m, where, line

    def sequence(self, m: YamlMap, key: str, path: str) -> YamlSeq:
        """``m[key]`` as a YamlSeq (absent/null gives an empty one; wrong type reported)."""
        value = m.get(key)
        if isinstance(value, YamlSeq):
            return value
        if value is not None:
            self.add(m.value_line(key), join(path, key), f"expected a list, got {describe(value)}")
        return YamlSeq(m.value_line(key))


def host_address(check: Checker, text: str, line: int, where: str, invalid: str,
                 role: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as one host's address (not multicast, unspecified or loopback): a gateway, a NAT
    target. None when it is not (reported: ``invalid`` says what a wrong text should be, ``role``
    what a reserved address cannot be)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        check.add(line, where, invalid)
        return None
    if ip.is_multicast or ip.is_unspecified or ip.is_loopback:
        check.add(line, where, f"{ip} cannot be {role}")
        return None
    return ip


def close_match(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when ``word`` is close to one of ``choices``, else ''."""
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def did_you_mean(word: str, choices: Iterable[str], label: str) -> str:
    """`` (did you mean 'x'?)`` if ``word`` is close to a choice, else `` (label: a, b)``."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1)
    if close:
        return f" (did you mean '{close[0]}'?)"
    return f" ({label}: {', '.join(choices)})"


def join(path: str, key: str) -> str:
    """Data path of ``key`` inside ``path``."""
    return f"{path}.{key}" if path else key


def describe(value: Any) -> str:
    """Short user-facing rendering of a YAML value for 'got ...' messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)
