"""YAML loading that remembers where every key and value came from.

``parse_yaml`` composes the text with PyYAML's SafeLoader (no Python object
construction) and walks the node tree itself, producing plain Python data in
which mappings are :class:`YamlMap` and sequences are :class:`YamlSeq`.  Both
remember the 1-based source line of their keys, values and items, so the
validator can point every problem at the line that caused it.

Scalars resolve as SafeLoader would (int, float, bool, None, str), except
that timestamps and other exotic implicit types stay strings.  Mapping keys
are always the key's source text (``1:`` gives the key ``"1"``).  Anchors,
aliases and ``<<`` merge keys work; explicit tags other than the plain
str/int/float/bool/null/map/seq ones are reported as problems.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from labctl.errors import Problem

__all__ = ["MAX_DEPTH", "YamlMap", "YamlSeq", "parse_yaml"]

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists a lab file may have (a real one needs about 8)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # tab and newline are text

_TAG = "tag:yaml.org,2002:"
_MERGE_TAG = _TAG + "merge"
_MAP_TAGS = {_TAG + "map"}
_SEQ_TAGS = {_TAG + "seq"}
_CONSTRUCTED_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null")}
_TEXT_TAGS = {_TAG + "timestamp", _TAG + "value"}  # implicit, kept as text


class YamlMap(dict[str, Any]):
    """A mapping with string keys that remembers source lines.

    ``line`` is where the mapping starts; ``key_lines``/``value_lines`` give
    the line of each key and of its value; ``raw`` holds the source text of
    scalar values (useful when YAML 1.1 resolution mangled them, e.g. an
    unquoted MAC address read as a base-60 integer).
    """

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[str, int] = {}
        self.value_lines: dict[str, int] = {}
        self.raw: dict[str, str] = {}

    def key_line(self, key: str) -> int:
        """Line of ``key``, or of the mapping itself when the key is absent."""
        return self.key_lines.get(key, self.line)

    def value_line(self, key: str) -> int:
        """Line of ``key``'s value, or of the mapping when the key is absent."""
        return self.value_lines.get(key, self.line)


class YamlSeq(list[Any]):
    """A sequence that remembers its own line and the line of each item."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.item_lines: list[int] = []

    def item_line(self, index: int) -> int:
        """Line of item ``index`` (the sequence's line if out of range)."""
        if 0 <= index < len(self.item_lines):
            return self.item_lines[index]
        return self.line


def parse_yaml(text: str, filename: str) -> tuple[Any, list[Problem]]:
    """Parse one YAML document into position-aware data.

    Returns ``(data, problems)``; never raises for bad input.  A syntax error
    gives ``(None, [problem])`` with the line of the error.  Duplicate keys
    are reported at the second occurrence and the first one is kept.  An
    empty document gives ``None``.
    """
    try:
        too_deep = _too_deep(text)
        if too_deep is not None:
            return None, [Problem(filename, too_deep, "", f"nested more than {MAX_DEPTH} levels deep")]
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        return None, [_syntax_problem(exc, text, filename)]
    if root is None:
        return None, []
    builder = _Builder(filename)
    return builder.convert(root, ""), builder.problems


def _too_deep(text: str) -> int | None:
    """The line where the document nests deeper than MAX_DEPTH, else None.

    PyYAML composes (and labctl walks) recursively; its event stream is flat,
    so the depth is counted there first.
    """
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                return event.start_mark.line + 1 if event.start_mark else 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return None


def _syntax_problem(exc: yaml.YAMLError, text: str, filename: str) -> Problem:
    """Turn a PyYAML exception into a Problem pointing at its line."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        message = f"invalid YAML: {exc.problem or exc.context or 'syntax error'}"
        if exc.problem and exc.context and exc.context_mark is not None:
            message += f" ({exc.context} at line {exc.context_mark.line + 1})"
        return Problem(filename, line, "", message)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        message = f"invalid YAML: {exc.reason} (character #x{ord(char):04x})"
        return Problem(filename, line, "", message)
    return Problem(filename, 1, "", f"invalid YAML: {exc}")


def _join(path: str, key: str) -> str:
    """Data path of ``key`` inside ``path``."""
    return f"{path}.{key}" if path else key


class _Builder:
    """Converts a composed node tree, collecting problems on the way."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.problems: list[Problem] = []
        self._ctor = SafeConstructor()
        self._memo: dict[int, Any] = {}
        self._active: set[int] = set()

    def _problem(self, node: Node, path: str, message: str) -> None:
        self.problems.append(Problem(self.filename, _line(node), path, message))

    def convert(self, node: Node, path: str) -> Any:
        """Convert ``node`` (at data path ``path``) to position-aware data."""
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        key = id(node)
        if key in self._active:
            self._problem(node, path, "recursive alias is not supported")
            return None
        if key not in self._memo:
            self._active.add(key)
            try:
                self._memo[key] = self._collection(node, path)
            finally:
                self._active.discard(key)
        return self._memo[key]

    def _collection(self, node: Node, path: str) -> Any:
        """Convert a mapping or sequence node, rejecting exotic tags."""
        if isinstance(node, MappingNode) and node.tag in _MAP_TAGS:
            return self._mapping(node, path)
        if isinstance(node, SequenceNode) and node.tag in _SEQ_TAGS:
            return self._sequence(node, path)
        self._problem(node, path, f"unsupported tag '{_short_tag(node.tag)}'")
        return None

    def _scalar(self, node: ScalarNode, path: str) -> Any:
        """Resolve a scalar the way SafeLoader would; control characters are refused."""
        if _CONTROL.search(node.value):
            self._problem(node, path, "control characters are not allowed")
            return None
        if node.tag in _TEXT_TAGS:
            return node.value
        if node.tag not in _CONSTRUCTED_TAGS:
            self._problem(node, path, f"unsupported tag '{_short_tag(node.tag)}'")
            return None
        try:
            return SafeConstructor.yaml_constructors[node.tag](self._ctor, node)
        except (ValueError, IndexError, KeyError, yaml.YAMLError):
            tag = _short_tag(node.tag)
            self._problem(node, path, f"invalid {tag} value '{node.value}'")
            return None

    def _sequence(self, node: SequenceNode, path: str) -> YamlSeq:
        """Convert a sequence node, recording each item's line."""
        result = YamlSeq(_line(node))
        for index, item in enumerate(node.value):
            result.append(self.convert(item, f"{path}[{index}]"))
            result.item_lines.append(_line(item))
        return result

    def _mapping(self, node: MappingNode, path: str) -> YamlMap:
        """Convert a mapping node: explicit keys first, then ``<<`` merges."""
        result = YamlMap(_line(node))
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
            else:
                self._entry(result, key_node, value_node, path)
        for source in merges:
            self._merge(result, source, path)
        return result

    def _entry(self, result: YamlMap, key_node: Node, value_node: Node, path: str) -> None:
        """Add one key/value pair, reporting non-scalar and duplicate keys."""
        if not isinstance(key_node, ScalarNode):
            self._problem(key_node, path, "mapping keys must be plain strings")
            return
        key = str(key_node.value)
        if _CONTROL.search(key):
            self._problem(key_node, path, "control characters are not allowed in keys")
            return
        if key in result.key_lines:
            first = result.key_lines[key]
            self._problem(key_node, path, f"duplicate key '{key}' (first at line {first})")
            return
        result[key] = self.convert(value_node, _join(path, key))
        result.key_lines[key] = _line(key_node)
        result.value_lines[key] = _line(value_node)
        if isinstance(value_node, ScalarNode):
            result.raw[key] = str(value_node.value)

    def _merge(self, result: YamlMap, source: Node, path: str) -> None:
        """Apply a ``<<`` merge: copy keys of the source map(s) not yet set."""
        sources = source.value if isinstance(source, SequenceNode) else [source]
        for item in sources:
            merged = self.convert(item, path)
            if not isinstance(merged, YamlMap):
                self._problem(item, path, "'<<' needs a mapping or a list of mappings")
                continue
            for key, value in merged.items():
                if key not in result.key_lines:
                    result[key] = value
                    result.key_lines[key] = merged.key_lines[key]
                    result.value_lines[key] = merged.value_lines[key]
                    if key in merged.raw:
                        result.raw[key] = merged.raw[key]


def _line(node: Node) -> int:
    """1-based line where ``node`` starts."""
    return int(node.start_mark.line) + 1


def _short_tag(tag: str) -> str:
    """``tag:yaml.org,2002:set`` -> ``!!set``; other tags unchanged."""
    return "!!" + tag[len(_TAG):] if tag.startswith(_TAG) else tag
