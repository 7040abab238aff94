"""The language of a ``drgn:`` check: one Python expression on the guest's kernel, read with drgn.

A lab file never names a program that runs on the host, and a check's expression runs in labctl's
own process: so it is not Python run as such, but an expression of a small language with Python's
syntax that :mod:`labctl.inspect.evaluate` walks itself, node by node (nothing is compiled or
``eval``-ed). This module checks an expression's shape when the lab file is loaded; the names it
calls are checked against drgn's helpers when drgn is installed (else when the check runs).

What an expression may use:

* ``prog``: the guest's kernel (``prog['init_net']``, ``prog.constant('NR_CPUS')``,
  ``prog.variable(...)``, ``prog.object(...)``, ``prog.function(...)``, ``prog.type(...)``);
* a kernel object's members as attributes (``dev.stats.rx_dropped``, ``sk.__sk_common``), its
  elements by index, and its methods :data:`OBJECT_METHODS` (``value_()``, ``string_()``...);
* drgn's Linux helpers by name (``netdev_get_by_name``, ``for_each_netdev``, ``list_for_each_entry``,
  ``find_task``...), ``cast``, ``container_of``, ``sizeof``, and the builtins :data:`BUILTINS`;
* numbers, strings, ``and``/``or``/``not``, comparisons (``in`` too), arithmetic (no ``**``),
  ``x if c else y``, tuples and lists, and generator expressions or comprehensions
  (``sum(1 for dev in for_each_netdev(prog) if dev.qdisc.qstats.drops)``);
* string methods :data:`TEXT_METHODS` on text that was read (``.decode()``, ``.startswith(...)``).

Never: names of its own (no ``:=``), ``lambda``, f-strings, ``**``, ``*args``, keyword arguments
but for drgn's own, or any attribute with two leading and trailing underscores.
"""

from __future__ import annotations

import ast
import difflib

MAX_EXPRESSION = 4096
BUILTINS = ("abs", "all", "any", "bool", "hex", "int", "len", "list", "max", "min", "set", "sorted", "str",
            "sum", "tuple")
DRGN_FUNCTIONS = ("cast", "container_of", "reinterpret", "sizeof")
PROGRAM_METHODS = ("constant", "function", "object", "type", "variable")
OBJECT_METHODS = ("address_of_", "member_", "read_", "string_", "to_bytes_", "value_", "format_")
OBJECT_ATTRIBUTES = ("absent_", "address_", "type_")
TEXT_METHODS = ("decode", "endswith", "lower", "split", "startswith", "strip", "upper")
TYPE_ATTRIBUTES = ("name", "size", "tag")

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr, ast.BitXor,
           ast.LShift, ast.RShift)
_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, *_BINOPS, ast.UnaryOp, ast.Not, ast.USub,
            ast.UAdd, ast.Invert, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is,
            ast.IsNot, ast.In, ast.NotIn, ast.Call, ast.keyword, ast.Constant, ast.Name, ast.Load, ast.Store,
            ast.Attribute, ast.Subscript, ast.Slice, ast.IfExp, ast.Tuple, ast.List, ast.GeneratorExp,
            ast.ListComp, ast.SetComp, ast.comprehension)


class BadExpression(ValueError):
    """What is wrong with an expression, and where in it."""


def drgn_helper_names() -> frozenset[str] | None:
    """The public names of drgn's Linux helpers (None when drgn is not installed here)."""
    try:
        from drgn.helpers import linux
    except ImportError:
        return None
    return frozenset(n for n in getattr(linux, "__all__", dir(linux)) if not n.startswith(("_", "print_")))


def parse(text: str) -> ast.Expression:
    """The expression's tree, its shape checked (see the module docstring).

    :raise BadExpression: (a ValueError) saying what is wrong, and where in the expression.
    """
    if len(text) > MAX_EXPRESSION:
        raise BadExpression(f"an expression of {len(text)} characters: at most {MAX_EXPRESSION}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise BadExpression(f"not an expression: {exc.msg} (column {exc.offset})") from None
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension):
            bound |= _targets(node.target)
    for node in ast.walk(tree):
        _check_node(node)
    _check_names(tree, bound)
    return tree


def _targets(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return {e.id for e in target.elts if isinstance(e, ast.Name)}
    raise BadExpression(f"column {target.col_offset + 1}: a comprehension binds names (for x in ...), nothing else")


def _check_node(node: ast.AST) -> None:
    where = f"column {getattr(node, 'col_offset', 0) + 1}: "
    if not isinstance(node, _ALLOWED):
        raise BadExpression(where + f"{_what(node)} is not allowed in a drgn check")
    if isinstance(node, ast.Constant) and not isinstance(node.value, int | float | str | bytes | bool | type(None)):
        raise BadExpression(where + f"the constant {node.value!r} is not allowed")
    if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__"):
        raise BadExpression(where + f"the attribute '{node.attr}' is not allowed")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name | ast.Attribute):
            raise BadExpression(where + "only a function or a method named in the expression can be called")
        if any(k.arg is None for k in node.keywords):
            raise BadExpression(where + "** arguments are not allowed")
    if isinstance(node, ast.comprehension) and node.is_async:
        raise BadExpression(where + "async comprehensions are not allowed")


def _what(node: ast.AST) -> str:
    names = {ast.Pow: "'**'", ast.Lambda: "lambda", ast.NamedExpr: "':='", ast.JoinedStr: "an f-string",
             ast.Starred: "'*'", ast.Dict: "a dict", ast.DictComp: "a dict comprehension", ast.MatMult: "'@'"}
    return names.get(type(node), type(node).__name__)


def _check_names(tree: ast.Expression, bound: set[str]) -> None:
    helpers = drgn_helper_names()
    known = {"prog", "True", "False", "None", *BUILTINS, *DRGN_FUNCTIONS, *bound}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or node.id in known:
            continue
        if helpers is not None and node.id not in helpers:
            close = difflib.get_close_matches(node.id, sorted(known | helpers), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise BadExpression(f"column {node.col_offset + 1}: unknown name '{node.id}'{hint}: use prog, drgn's Linux "
                             f"helpers, {', '.join(DRGN_FUNCTIONS)} or {', '.join(BUILTINS)}")
