"""A ``drgn:`` check's expression evaluated on a guest's kernel: its tree (:mod:`labctl.lab.drgnexpr`,
checked again here) walked node by node, never compiled, with only what that module allows.

Every name, attribute and call is looked up here: ``prog``'s methods, a kernel object's members
(``member_``, never ``getattr`` on a name from the expression) and methods, drgn's Linux helpers,
the allowed builtins. A step budget and the check's timeout bound the walk (a helper's loop over
a list the guest changes meanwhile included), and a byte budget (:data:`MAX_BYTES`) what it may
read and make: every ``prog.read`` counts its size before it reads, every text or bytes a call or
an operator makes its length; ``<<`` past :data:`MAX_SHIFT` bits is refused::

    with open_live(state, "b") as k:
        value = evaluate(k.prog, "netdev_get_by_name(prog['init_net'], 'eth1').mtu == 1500", deadline)
"""

from __future__ import annotations

import ast
import operator
import time
from collections.abc import Callable, Iterator
from typing import Any

from labctl.errors import DebugError
from labctl.inspect.program import require_drgn
from labctl.lab import (
    DRGN_BUILTINS,
    DRGN_FUNCTIONS,
    DRGN_OBJECT_ATTRIBUTES,
    DRGN_OBJECT_METHODS,
    DRGN_PROGRAM_METHODS,
    DRGN_TEXT_METHODS,
    DRGN_TYPE_ATTRIBUTES,
    drgn_helper_names,
    parse_drgn,
)

MAX_STEPS = 2_000_000
MAX_BYTES = 64 << 20  # text and memory an expression may hold in all (prog.read's sizes counted before reading)
MAX_SHIFT = 4096
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos,
                                            ast.Invert: operator.invert}
_NUMBERS = (int, float, bool)


class ExprError(DebugError):
    """The expression could not be evaluated (what went wrong, in its words); ``timed_out``: its time ran out."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def names(prog: Any) -> dict[str, Any]:
    """What an expression's names mean: ``prog``, drgn's Linux helpers and functions, the builtins."""
    import builtins

    require_drgn()
    import drgn
    from drgn.helpers import linux

    out: dict[str, Any] = {n: getattr(linux, n) for n in (drgn_helper_names() or ())
                           if not n.startswith("print_")}  # they write to labctl's own output
    out.update({n: getattr(drgn, n) for n in DRGN_FUNCTIONS})
    out.update({n: getattr(builtins, n) for n in DRGN_BUILTINS})
    out["prog"] = prog
    return out


def evaluate(prog: Any, text: str, deadline: float | None = None) -> Any:
    """The value of the expression ``text`` on ``prog``'s kernel.

    :raise ExprError: for an expression the language refuses, the budget or time passing, or
        what drgn or Python raised evaluating it (a missing symbol, a fault reading memory...).
    """
    return _evaluate(prog, text, deadline, left=False)


def left_side(prog: Any, text: str, deadline: float | None = None) -> tuple[str, Any] | None:
    """The source and the value of a comparison's left side (``dev.mtu`` of ``dev.mtu == 1400``), to
    say why it is false; None for an expression that is no comparison.

    :raise ExprError: as :func:`evaluate`.
    """
    return _evaluate(prog, text, deadline, left=True)  # type: ignore[no-any-return]


def _evaluate(prog: Any, text: str, deadline: float | None, left: bool) -> Any:
    try:
        tree = parse_drgn(text)
    except ValueError as exc:
        raise ExprError(f"drgn expression: {exc}") from None
    walker = _Walker(prog, names(prog), deadline)
    d = require_drgn()
    try:
        if left:
            body = tree.body
            if not isinstance(body, ast.Compare):
                return None
            return ast.get_source_segment(text.strip(), body.left) or "", walker.value(body.left, {})
        return walker.value(tree.body, {})
    except ExprError:
        raise
    except (d.FaultError, d.ObjectAbsentError, LookupError, ValueError, TypeError, ArithmeticError,
            AttributeError, OverflowError, d.MissingDebugInfoError) as exc:
        raise ExprError(f"{type(exc).__name__}: {exc}") from None


class _Walker:
    def __init__(self, prog: Any, env: dict[str, Any], deadline: float | None) -> None:
        self.prog, self.env, self.deadline, self.steps = prog, env, deadline, 0
        self.bytes = 0
        self.d = require_drgn()

    def charge(self, n: int) -> None:
        """``n`` more bytes held or about to be read. :raise ExprError: past :data:`MAX_BYTES`."""
        self.bytes += max(0, n)
        if self.bytes > MAX_BYTES:
            raise ExprError(f"more than {MAX_BYTES >> 20} MiB read or made: the expression gave up")

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ExprError(f"more than {MAX_STEPS} steps: the expression gave up")
        if self.deadline is not None and self.steps % 256 == 0 and time.monotonic() > self.deadline:
            raise ExprError("the check's time ran out while the expression ran", timed_out=True)

    def value(self, node: ast.expr, scope: dict[str, Any]) -> Any:
        self.tick()
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id, scope)
        if isinstance(node, ast.BoolOp):
            return self._boolop(node, scope)
        if isinstance(node, ast.BinOp):
            return self._binop(node, scope)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self.value(node.operand, scope))
        if isinstance(node, ast.Compare):
            return self._compare(node, scope)
        if isinstance(node, ast.IfExp):
            return self.value(node.body if self.value(node.test, scope) else node.orelse, scope)
        if isinstance(node, ast.Attribute):
            return self._attribute(self.value(node.value, scope), node.attr)
        if isinstance(node, ast.Subscript):
            return self._subscript(node, scope)
        if isinstance(node, ast.Call):
            return self._call(node, scope)
        if isinstance(node, ast.Tuple | ast.List):
            elts = [self.value(e, scope) for e in node.elts]
            return tuple(elts) if isinstance(node, ast.Tuple) else elts
        if isinstance(node, ast.GeneratorExp | ast.ListComp | ast.SetComp):
            items = self._comprehension(node.elt, node.generators, scope)
            return set(items) if isinstance(node, ast.SetComp) else list(items) \
                if isinstance(node, ast.ListComp) else items
        raise ExprError(f"{type(node).__name__} is not allowed in a drgn check")

    def _name(self, name: str, scope: dict[str, Any]) -> Any:
        if name in scope:
            return scope[name]
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        if name not in self.env:
            raise ExprError(f"unknown name '{name}'")
        return self.env[name]

    def _boolop(self, node: ast.BoolOp, scope: dict[str, Any]) -> Any:
        result: Any = None
        for v in node.values:
            result = self.value(v, scope)
            if isinstance(node.op, ast.And) != bool(result):
                return result
        return result

    def _binop(self, node: ast.BinOp, scope: dict[str, Any]) -> Any:
        left, right = self.value(node.left, scope), self.value(node.right, scope)
        numeric = all(isinstance(v, (*_NUMBERS, self.d.Object)) for v in (left, right))
        if isinstance(node.op, ast.Mult) and not numeric:
            raise ExprError("'*' is for numbers and kernel objects only")
        if isinstance(node.op, ast.LShift) and int(right) > MAX_SHIFT:
            raise ExprError(f"a shift of more than {MAX_SHIFT} bits")
        if isinstance(left, str | bytes) and isinstance(right, str | bytes):
            self.charge(len(left) + len(right))
        return _BINOPS[type(node.op)](left, right)

    def _compare(self, node: ast.Compare, scope: dict[str, Any]) -> bool:
        left = self.value(node.left, scope)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.value(comp, scope)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _attribute(self, obj: Any, attr: str) -> Any:
        d = self.d
        if isinstance(obj, d.Object):
            if attr in DRGN_OBJECT_ATTRIBUTES or attr in DRGN_OBJECT_METHODS:
                return getattr(obj, attr)
            return obj.member_(attr)
        if isinstance(obj, d.Program) and attr in DRGN_PROGRAM_METHODS:
            return getattr(obj, attr)
        if isinstance(obj, d.Type) and attr in DRGN_TYPE_ATTRIBUTES:
            return getattr(obj, attr)
        if isinstance(obj, str | bytes) and attr in DRGN_TEXT_METHODS:
            return getattr(obj, attr)
        raise ExprError(f"'{attr}' of a {type(obj).__name__} is not allowed in a drgn check")

    def _subscript(self, node: ast.Subscript, scope: dict[str, Any]) -> Any:
        obj = self.value(node.value, scope)
        if isinstance(node.slice, ast.Slice):
            if not isinstance(obj, str | bytes | list | tuple):
                raise ExprError("slices are for text, lists and tuples")
            parts = [None if p is None else self.value(p, scope) for p in (node.slice.lower, node.slice.upper,
                                                                           node.slice.step)]
            return obj[slice(*parts)]
        key = self.value(node.slice, scope)
        if isinstance(obj, self.d.Program | self.d.Object | str | bytes | list | tuple):
            return obj[key]
        raise ExprError(f"a {type(obj).__name__} cannot be indexed in a drgn check")

    def _call(self, node: ast.Call, scope: dict[str, Any]) -> Any:
        if isinstance(node.func, ast.Attribute):
            func = self._attribute(self.value(node.func.value, scope), node.func.attr)
        else:
            assert isinstance(node.func, ast.Name)
            func = self._name(node.func.id, scope)
            if node.func.id in scope or not callable(func) or node.func.id == "prog":
                raise ExprError(f"'{node.func.id}' cannot be called")
        args = [self.value(a, scope) for a in node.args]
        kwargs = {str(k.arg): self.value(k.value, scope) for k in node.keywords}
        owner = getattr(func, "__self__", None)
        if isinstance(owner, self.d.Object) and getattr(func, "__name__", "") in ("read_", "to_bytes_", "value_"):
            try:
                self.charge(self.d.sizeof(owner))  # before drgn reads (and holds) it
            except (TypeError, ValueError):
                pass  # an incomplete type: what it makes is counted below
        result = func(*args, **kwargs)
        if isinstance(result, str | bytes):
            self.charge(len(result))
        return self._bounded(result) if isinstance(result, Iterator) else result

    def _bounded(self, items: Iterator[Any]) -> Iterator[Any]:
        """A helper's iterator, each item counted against the budget."""
        for item in items:
            self.tick()
            yield item

    def _comprehension(self, elt: ast.expr, generators: list[ast.comprehension], scope: dict[str, Any]
                       ) -> Iterator[Any]:
        first, rest = generators[0], generators[1:]
        for item in self.value(first.iter, scope):
            self.tick()
            inner = dict(scope)
            self._bind(first.target, item, inner)
            if all(self.value(cond, inner) for cond in first.ifs):
                if rest:
                    yield from self._comprehension(elt, rest, inner)
                else:
                    yield self.value(elt, inner)

    @staticmethod
    def _bind(target: ast.expr, item: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = item
            return
        assert isinstance(target, ast.Tuple)
        values = tuple(item)
        if len(values) != len(target.elts):
            raise ExprError(f"cannot unpack {len(values)} values into {len(target.elts)} names")
        for e, v in zip(target.elts, values, strict=True):
            assert isinstance(e, ast.Name)
            scope[e.id] = v
