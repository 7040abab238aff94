"""A package face that hands on names without loading them: its ``from X import name`` lines sit
under ``if TYPE_CHECKING:`` (what mypy and a reader see), and :func:`attach` gives the package the
module ``__getattr__`` (PEP 562) that imports a name's module the first time the name is asked for.

So ``import labctl.lab.ifaces`` (or ``from labctl.lab import guest_interfaces``) loads the lab
file's interface views and not its whole checker: a quick command (``status``, ``exec``) pays only
for what it uses. The names are read from the face's own source, once, at the first lookup: the
face lists each name once, in its import lines, as before.

Usage, at the end of a face::

    if TYPE_CHECKING:
        from labctl.lab.ifaces import guest_interfaces
    else:
        __getattr__, __dir__ = attach(__name__, __file__, globals())

Imports nothing of labctl's.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def lazy_names(source: str, package: str) -> dict[str, tuple[str, str]]:
    """``{name: (module, attribute)}`` for every ``from M import A [as N]`` under an
    ``if TYPE_CHECKING:`` at the top level of ``source`` (the face of ``package``); relative
    modules are resolved against ``package``.

    :raise ValueError: for a ``*`` import there (a face names what it hands on).
    """
    names: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.ImportFrom):
                continue
            module = stmt.module or ""
            if stmt.level:
                base = package.rsplit(".", stmt.level - 1)[0] if stmt.level > 1 else package
                module = f"{base}.{module}" if module else base
            for alias in stmt.names:
                if alias.name == "*":
                    raise ValueError(f"{package}: a face cannot hand on '*' from {module}")
                names[alias.asname or alias.name] = (module, alias.name)
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _load(module: str) -> ModuleType:
    """``module``, imported by the interpreter's own import statement (``__import__``), not
    ``importlib.import_module``: only the former is what ``-X importtime`` reports, which
    tests/unit/test_cli_budget.py reads."""
    __import__(module)
    return sys.modules[module]


def attach(package: str, file: str, namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the face ``package`` (its source at ``file``, its
    globals ``namespace``): a name is imported from its module at its first lookup and kept in
    ``namespace``, so later lookups are plain attribute reads."""
    table: dict[str, tuple[str, str]] | None = None

    def names() -> dict[str, tuple[str, str]]:
        nonlocal table
        if table is None:
            table = lazy_names(Path(file).read_text(encoding="utf-8"), package)
        return table

    def __getattr__(name: str) -> Any:
        where = names().get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = where
        if module == package:  # a submodule handed on by its name
            value = _load(f"{package}.{attr}")
        else:
            value = getattr(_load(module), attr)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names()))

    return __getattr__, __dir__
