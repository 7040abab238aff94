"""``{{name}}`` templates of a lab file's steps, filled in from a matrix row and the lab's addresses,
and the two small readers of a step's YAML values that every part of a step uses."""

from __future__ import annotations

import re
import shlex

from labctl.lab.checker import Checker
from labctl.lab.yamlpos import YamlMap

TEMPLATE = re.compile(r"\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}")


def render(template: str, row: dict[str, str], addresses: dict[str, str], quote: bool) -> str:
    """Replace ``{{var}}`` from the matrix row and ``{{g.nic.ip}}`` from addresses.

    Unknown names are left as they are (validation reported them already).
    Values are shell-quoted when ``quote`` (commands).
    """

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        value = row.get(key, addresses.get(key))
        if value is None:
            return m.group(0)
        return shlex.quote(value) if quote else value

    return TEMPLATE.sub(sub, template)


def yaml_bool(check: Checker, m: YamlMap, key: str, path: str, default: bool) -> bool:
    value = m.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        check.add(m.value_line(key), f"{path}.{key}", "expected true or false")
        return default
    return value


def yaml_strings(check: Checker, m: YamlMap, key: str, path: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    value = m.get(key)
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if value is None:
        return ()
    if items is None or not all(isinstance(v, str) for v in items):
        check.add(m.value_line(key), f"{path}.{key}", "expected a list of strings")
        return ()
    bad = [v for v in items if not pattern.fullmatch(v)]
    for v in bad:
        check.add(m.value_line(key), f"{path}.{key}", f"invalid {what} '{v}'")
    return tuple(v for v in items if v not in bad)
