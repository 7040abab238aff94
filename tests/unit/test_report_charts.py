"""Inline SVG bar charts: well-formed, escaped, deterministic, None drawn as n/a."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from labctl.report.charts import bar_chart_svg, fmt_num, nice_ticks


def texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter("text")]


def test_values_are_printed_on_bars_with_axis_labels() -> None:
    svg = bar_chart_svg("Throughput", ["rtl8139", "e1000"], [312.5, 401.25], "Mbit/s")
    root = ET.fromstring(svg)
    assert root.tag == "svg"
    assert len([r for r in root.iter("rect")]) == 2
    shown = texts(svg)
    assert {"Throughput", "rtl8139", "e1000", "312.5 Mbit/s", "401.25 Mbit/s", "Mbit/s", "0"} <= set(shown)


def test_none_is_drawn_as_na() -> None:
    svg = bar_chart_svg("CPU", ["a", "b"], [None, 12.0], "%", axis_label="CPU (%)")
    shown = texts(svg)
    assert "n/a" in shown and "12.0%" in shown and "CPU (%)" in shown


def test_failed_bars_say_so() -> None:
    svg = bar_chart_svg("CPU", ["a", "b"], [None, 12.0], "%", failed=[True, True])
    assert "failed" in texts(svg)
    assert "(step failed)" in svg


def test_text_is_escaped() -> None:
    label = '<script>alert("x")</script> & co'
    svg = bar_chart_svg("a < b & c", [label], [1], "%")
    assert "<script" not in svg
    assert ET.fromstring(svg).find("title").text == "a < b & c"  # type: ignore[union-attr]
    assert label[:27] + "…" in texts(svg)  # long labels are shortened, the tooltip keeps them whole
    assert '&lt;script&gt;alert("x")&lt;/script&gt; &amp; co' in svg.replace("&quot;", '"')


def test_output_is_deterministic_and_has_no_urls() -> None:
    args = ("T", ["x", "y", "z"], [1.5, None, 0], "Mbit/s")
    assert bar_chart_svg(*args) == bar_chart_svg(*args)
    assert "http" not in bar_chart_svg(*args)


def test_edge_cases() -> None:
    assert "no data" in texts(bar_chart_svg("empty", [], [], "%"))
    all_none = bar_chart_svg("none", ["a"], [None], "%")
    assert texts(all_none).count("n/a") == 1
    ET.fromstring(bar_chart_svg("neg", ["a", "b"], [-3.0, float("inf")], "%"))
    with pytest.raises(ValueError):
        bar_chart_svg("bad", ["a"], [1, 2], "%")


@pytest.mark.parametrize(("vmax", "top"), [(0, 1), (1, 1), (87.2, 100), (488, 500), (17.53, 20), (0.42, 0.5)])
def test_nice_ticks_cover_the_maximum(vmax: float, top: float) -> None:
    ticks = nice_ticks(vmax)
    assert ticks[0] == 0 and ticks[-1] == top and ticks[-1] >= vmax
    assert 2 <= len(ticks) <= 6


@pytest.mark.parametrize(("value", "text"), [(None, "n/a"), (12345, "12345"), (312.5, "312.5"), (61.0, "61.0"),
                                             (17.534, "17.53"), (0.0, "0.0"), (float("nan"), "n/a")])
def test_fmt_num(value: object, text: str) -> None:
    assert fmt_num(value) == text
