"""Tests for labctl.lab.yamlpos: position-aware YAML loading."""

from __future__ import annotations

import yaml

from labctl.errors import Problem
from labctl.lab.yamlpos import YamlMap, YamlSeq, parse_yaml


def _ok(text: str) -> object:
    data, problems = parse_yaml(text, "t.yaml")
    assert problems == []
    return data


def test_lines_of_keys_values_and_items() -> None:
    data = _ok("# comment\na: 1\nb:\n  c: x\nd:\n  - p\n  -\n    q: 2\n")
    assert isinstance(data, YamlMap)
    assert data.line == 2
    assert data.key_lines == {"a": 2, "b": 3, "d": 5}
    assert data.value_lines["a"] == 2
    assert data["b"].key_line("c") == 4
    seq = data["d"]
    assert isinstance(seq, YamlSeq)
    assert seq == ["p", {"q": 2}]
    assert seq.item_lines == [6, 8]
    assert seq[1].key_line("q") == 8


def test_absent_keys_fall_back_to_the_mapping_line() -> None:
    data = _ok("x: 1\nm:\n  k: v\n")
    assert data["m"].key_line("missing") == 3
    assert data["m"].value_line("missing") == 3
    assert YamlSeq(7).item_line(5) == 7


def test_null_value_is_on_its_key_line() -> None:
    data = _ok("lan:\nwan: {}\n")
    assert data == {"lan": None, "wan": {}}
    assert data.value_line("lan") == 1


def test_scalars_resolve_like_safeloader() -> None:
    text = "i: 12\nh: 0x10\nf: 1.5\ne: .inf\nb: yes\nn: ~\ns: '12'\nm: 52:54:00:12:34:56\n"
    data = _ok(text)
    assert data == yaml.safe_load(text)
    assert data["h"] == 16 and data["b"] is True and data["s"] == "12"
    assert isinstance(data["m"], int)  # YAML 1.1 base-60, as SafeLoader does
    assert data.raw["m"] == "52:54:00:12:34:56"
    assert data.raw["s"] == "12"


def test_timestamps_stay_text() -> None:
    data = _ok("t: 2024-01-02\n")
    assert data == {"t": "2024-01-02"}
    assert data.raw["t"] == "2024-01-02"


def test_keys_are_source_text() -> None:
    assert list(_ok("1: a\ntrue: b\n'q': c\n")) == ["1", "true", "q"]


def test_duplicate_keys_reported_at_second_occurrence_first_kept() -> None:
    data, problems = parse_yaml("a: 1\nb:\n  x: 1\n  x: 2\na: 3\n", "t.yaml")
    assert data == {"a": 1, "b": {"x": 1}}
    assert problems == [
        Problem("t.yaml", 4, "b", "duplicate key 'x' (first at line 3)"),
        Problem("t.yaml", 5, "", "duplicate key 'a' (first at line 1)"),
    ]


def test_syntax_error_is_a_problem_with_its_line() -> None:
    data, problems = parse_yaml("a: 1\nb: [1, 2\n", "t.yaml")
    assert data is None
    assert len(problems) == 1
    assert problems[0].line == 3
    assert problems[0].message.startswith("invalid YAML: ")


def test_multiple_documents_rejected() -> None:
    _, problems = parse_yaml("a: 1\n---\nb: 2\n", "t.yaml")
    assert [p.line for p in problems] == [2]
    assert "single document" in problems[0].message


def test_unprintable_character_reported_with_line() -> None:
    _, problems = parse_yaml("a: 1\nb: \x07\n", "t.yaml")
    assert [p.line for p in problems] == [2]
    assert problems[0].message.startswith("invalid YAML: ")


def test_empty_document_is_none() -> None:
    assert parse_yaml("", "t.yaml") == (None, [])
    assert parse_yaml("# nothing\n", "t.yaml") == (None, [])


def test_anchors_aliases_and_merge_keys() -> None:
    data = _ok("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\nlist: [*b, *b]\n")
    assert data["use"] == {"y": 3, "x": 1}
    assert data["use"].key_line("x") == 1
    assert data["use"].key_line("y") == 4
    assert data["list"] == [{"x": 1, "y": 2}] * 2


def test_merge_of_a_list_earlier_sources_win() -> None:
    data = _ok("a: &a {k: 1}\nb: &b {k: 2, j: 2}\nc:\n  <<: [*a, *b]\n")
    assert data["c"] == {"k": 1, "j": 2}


def test_merge_of_a_scalar_is_a_problem() -> None:
    _, problems = parse_yaml("a: &a 1\nb:\n  <<: *a\n", "t.yaml")
    assert [p.message for p in problems] == ["'<<' needs a mapping or a list of mappings"]


def test_recursive_alias_is_a_problem() -> None:
    _, problems = parse_yaml("a: &r [1, *r]\n", "t.yaml")
    assert [p.message for p in problems] == ["recursive alias is not supported"]


def test_unsupported_tags_are_problems() -> None:
    data, problems = parse_yaml("a: !!binary aGk=\nb: !foo x\nc: !!set {x}\nd: !!str 5\n", "t.yaml")
    assert data == {"a": None, "b": None, "c": None, "d": "5"}
    assert [(p.line, p.path, p.message) for p in problems] == [
        (1, "a", "unsupported tag '!!binary'"),
        (2, "b", "unsupported tag '!foo'"),
        (3, "c", "unsupported tag '!!set'"),
    ]


def test_non_scalar_key_is_a_problem() -> None:
    _, problems = parse_yaml("? [a, b]\n: 1\n", "t.yaml")
    assert [p.message for p in problems] == ["mapping keys must be plain strings"]


def test_bad_explicitly_tagged_scalars_are_problems() -> None:
    data, problems = parse_yaml("a: !!int\nb: !!bool maybe\nc: !!float x\n", "t.yaml")
    assert data == {"a": None, "b": None, "c": None}
    assert [(p.line, p.message) for p in problems] == [
        (1, "invalid !!int value ''"),
        (2, "invalid !!bool value 'maybe'"),
        (3, "invalid !!float value 'x'"),
    ]
