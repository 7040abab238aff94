"""report.md and report.html rendered from the fixture bundles under tests/fixtures/report/."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from labctl.bundle.layout import MANIFEST, SUMMARY
from labctl.errors import LabctlError, UsageError
from labctl.report import render_run
from labctl.report.charts import fmt_num
from labctl.report.throughput import FIGURES
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "report"
OK, FAILED = "nic-driver-cost-ok", "nic-driver-cost-failed"


def bundle(tmp_path: Path, name: str) -> Path:
    """A private copy of a fixture bundle (rendering writes into it)."""
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def summary_of(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / SUMMARY).read_text())
    return data


def rendered(tmp_path: Path, name: str) -> tuple[Path, str, str]:
    run = bundle(tmp_path, name)
    md, html = render_run(run)
    assert (md, html) == (run / "report.md", run / "report.html")
    return run, md.read_text(), html.read_text()


def md_table(md: str, header_start: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table whose header starts with ``header_start``."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def as_number(cell: str) -> float | None:
    return None if cell == "n/a" else float(cell)


def same(cell: str, value: Any) -> bool:
    """A printed figure equals the summary's (to the two decimals the report keeps)."""
    number = as_number(cell)
    return value is None if number is None else value is not None and round(value, 2) == number


@pytest.mark.parametrize("name", [OK, FAILED])
def test_results_table_numbers_are_summary_numbers(tmp_path: Path, name: str) -> None:
    run, md, _ = rendered(tmp_path, name)
    steps = summary_of(run)["steps"]
    rows = md_table(md, "| step | variant")
    assert len(rows) == len(steps)
    for row, step in zip(rows, steps, strict=True):
        assert row[0] == step["name"]
        for cell, (key, *_rest) in zip(row[4:8], FIGURES, strict=True):
            assert same(cell, step["figures"][key]), (step["name"], key, cell)
        guest = step["guests"][(step["nic"] or {}).get("guest", "a")]
        assert same(row[8], guest["samples"]) and same(row[9], guest["lost_samples"])


def test_every_guest_symbol_and_softnet_number_is_printed(tmp_path: Path) -> None:
    run, md, html = rendered(tmp_path, OK)
    for step in summary_of(run)["steps"]:
        for guest in step["guests"].values():
            for sym in guest["top_symbols"]:
                line = f"`{sym['symbol']}` | `{sym['dso']}` | {fmt_num(sym['pct'])} |"
                assert line in md
                assert f"<code>{sym['symbol']}</code>" in html
            softnet = guest["softnet"]
            assert re.search(rf"\| {softnet['processed']} \| (\*\*)?{softnet['dropped']}(\*\*)? \| "
                             rf"{softnet['time_squeeze']} \|", md)
    assert md.count("#### Guests") == 3


def test_ok_report_header_and_comparison(tmp_path: Path) -> None:
    run, md, html = rendered(tmp_path, OK)
    summary = summary_of(run)
    assert md.startswith("# labctl report: nic-driver-cost\n")
    for text in ("Run status:", "tcg", "0.1.0", "7.2.19", "6.1.0-56-amd64", "2026-11-23 01:00:00 UTC",
                 "2 min 41 s"):
        assert text in md and text in html, text
    assert summary["comparison"] in md
    assert summary["comparison"] in html
    assert "FAILED" not in md
    assert md.count("- a: none") == 2 and md.count("- b: none") == 3  # trace loss is always listed
    assert "- a: **ftrace overruns 12**" in md
    assert "ftrace ring buffer overran 12 times" in md


def test_failed_report_shows_failures_and_nulls(tmp_path: Path) -> None:
    run, md, html = rendered(tmp_path, FAILED)
    summary = summary_of(run)
    reason = summary["reason"]
    failed_step = summary["steps"][2]
    assert f"> **Run FAILED**: {reason}" in md
    assert f'<p class="alert"><span class="bad">Run FAILED</span>: {reason}</p>' in html
    assert f"**step transfer / e1000 failed**: {failed_step['reason']}" in md
    assert "### transfer / e1000 — FAILED" in md
    assert '<section class="step failed" id="step-3">' in html
    assert '<tr class="failed">' in html
    assert "a: not measured" in md  # trace loss of a guest without data
    assert "perf lost events 17, kprobe misses 2" in md
    assert "Bar charts" in md
    assert ">failed</text>" in html  # the failed step's missing bars say so
    baseline = md_table(md, "| step | variant")[0]
    assert baseline[1] == "–" and baseline[4] == "n/a" and baseline[5] == "3.25"


def test_commands_table_comes_from_the_manifest(tmp_path: Path) -> None:
    run, md, html = rendered(tmp_path, FAILED)
    commands = json.loads((run / MANIFEST).read_text())["commands"]
    rows = md_table(md, "| guest | step | command")
    assert len(rows) == len(commands)
    for row, cmd in zip(rows, commands, strict=True):
        assert row[0] == cmd["guest"]
        assert row[3].strip("*") == str(cmd["status"])
        assert float(row[4]) == cmd["duration_s"]
    assert "``iperf3 -c 10.10.0.2 -t 10 --title 'a\\|b `x`'``" in md  # list argv, pipe and backticks
    table = html[html.index('<table class="commands">'):]
    assert table[:table.index("</table>")].count("<tr") == len(commands) + 1


def test_odd_strings_are_escaped(tmp_path: Path) -> None:
    _, md, html = rendered(tmp_path, FAILED)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot; &amp;&amp; true &amp; wait" in html
    assert "&lt;b&gt;&amp;amp; noisy_&lt;/b&gt;" in html
    assert "`sh -c 'echo \"<script>alert(1)</script>\" && true & wait'`" in md  # inside a code span
    assert r"figures | are \*rough\* \<b\>\&amp; noisy\_\</b\>" in md


class Refs(HTMLParser):
    """Collects every URL-bearing attribute and the tags used."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for key, value in attrs:
            if key in ("href", "src", "srcset", "action", "xlink:href", "data", "poster", "background"):
                self.refs.append((tag, key, value or ""))


@pytest.mark.parametrize("name", [OK, FAILED])
def test_html_is_self_contained(tmp_path: Path, name: str) -> None:
    run, _, html = rendered(tmp_path, name)
    lowered = html.lower()
    for banned in ("http://", "https://", "<script", "src=", "url(", "@import", "<link", "<iframe", "<img"):
        assert banned not in lowered, banned
    parser = Refs()
    parser.feed(html)
    assert {"script", "link", "img", "iframe", "object", "embed"}.isdisjoint(parser.tags)
    assert parser.refs, "expected links to the raw artifacts"
    for tag, key, value in parser.refs:
        assert (tag, key) == ("a", "href")
        assert not re.match(r"^[a-z][a-z0-9+.-]*:", value, re.IGNORECASE) and not value.startswith("/"), value
        target = (run / unquote(value)).resolve()
        assert target.is_file() and target.is_relative_to(run.resolve()), value


def test_artifact_links_are_relative_and_quoted(tmp_path: Path) -> None:
    _, md, html = rendered(tmp_path, FAILED)
    assert 'href="steps/transfer/rtl8139/a/odd%20name%20%231.txt"' in html
    assert "[`a/odd name #1.txt`](steps/transfer/rtl8139/a/odd%20name%20%231.txt)" in md
    assert "[`guests/a/console.log`](guests/a/console.log)" in md
    assert "[`a/cmd-1.err`](steps/transfer/e1000/a/cmd-1.err)" in md


@pytest.mark.parametrize("name", [OK, FAILED])
def test_svg_charts_are_well_formed(tmp_path: Path, name: str) -> None:
    run, _, html = rendered(tmp_path, name)
    svgs = re.findall(r"<svg\b.*?</svg>", html, re.DOTALL)
    assert len(svgs) == 5  # the topology picture first, then the four charts
    topology, svgs = ET.fromstring(svgs[0]), svgs[1:]
    assert topology.get("id") == "topology"
    assert {"a", "b"} <= {t.text for t in topology.iter("text")}
    labels = ["baseline", "transfer / rtl8139", "transfer / e1000"] if name == FAILED else \
        ["rtl8139", "e1000", "virtio-net-pci"]
    for svg in svgs:
        root = ET.fromstring(svg)
        texts = [t.text for t in root.iter("text")]
        assert all(label in texts for label in labels)
    throughput = [t.text for t in ET.fromstring(svgs[0]).iter("text")]
    for step in summary_of(run)["steps"]:
        value = step["figures"]["throughput_mbit_s"]
        if value is not None:
            assert f"{fmt_num(value)} Mbit/s" in throughput


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    run = bundle(tmp_path, OK)
    first = [p.read_bytes() for p in render_run(run)]
    second = [p.read_bytes() for p in render_run(run)]
    assert first == second


def test_missing_manifest_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a report bundle"):
        render_run(tmp_path)
    with pytest.raises(UsageError, match="not a directory"):
        render_run(tmp_path / "nope")


def test_broken_summary_is_an_error(tmp_path: Path) -> None:
    run = bundle(tmp_path, OK)
    (run / SUMMARY).write_text("{not json")
    with pytest.raises(LabctlError, match="summary.json"):
        render_run(run)


def test_missing_summary_still_renders_from_the_manifest(tmp_path: Path) -> None:
    run = bundle(tmp_path, FAILED)
    (run / SUMMARY).unlink()
    md, html = (p.read_text() for p in render_run(run))
    assert "summary.json is missing" in md
    assert "Run FAILED" in md and "Run FAILED" in html
    assert "No step produced results." in md
    assert "sleep 5" in md  # commands still come from the manifest


def test_odd_summary_shapes_do_not_crash(tmp_path: Path) -> None:
    run = bundle(tmp_path, OK)
    (run / SUMMARY).write_text(json.dumps({
        "status": "ok", "steps": [{"name": "s", "guests": {"a": {"top_symbols": None, "warnings": None}}},
                                  "junk", {"name": "t", "variant": "x", "figures": {"cpu_load_pct": float("nan")}}],
    }, allow_nan=True))
    md, _ = (p.read_text() for p in render_run(run))
    assert "| s | – |" in md and "| t | x |" in md
    assert "nan" not in md.lower()


def test_header_names_each_guests_kernel(tmp_path: Path) -> None:
    run = bundle(tmp_path, OK)
    manifest = json.loads((run / MANIFEST).read_text())
    debian = {"release": "6.1.0-56-rt-amd64", "source": {"kind": "debian", "release": "6.1.0-56-rt-amd64"},
              "build_id": "0123456789abcdef0123"}
    manifest["kernels"] = {"client": debian, "server": debian}
    (run / MANIFEST).write_text(json.dumps(manifest))
    md = render_run(run)[0].read_text()
    assert "6.1.0-56-rt-amd64 (Debian, build id 0123456789ab)" in md
    tree = {"release": "6.1.192-labctl-test", "source": {"kind": "tree", "tree": "/src/linux"}}
    manifest["kernels"] = {"client": debian, "server": tree}  # A/B: each guest's own
    (run / MANIFEST).write_text(json.dumps(manifest))
    md = render_run(run)[0].read_text()
    assert "client: 6.1.0-56-rt-amd64 (Debian, build id 0123456789ab); server: 6.1.192-labctl-test (tree /src/linux)" \
        in md


def test_a_failed_steps_cell_and_row_are_marked_bad_and_an_ok_ones_are_not() -> None:
    """The results table: a failed step's status in capitals, marked bad, its row 'failed'; an ok or
    skipped one as written and unmarked."""
    from labctl.report.document import Span
    from labctl.report.results import results_table, status_cell

    assert status_cell("failed") == (Span("FAILED", "bad"),)
    assert status_cell("timeout") == (Span("TIMEOUT", "bad"),)
    assert status_cell("ok") == (Span("ok", ""),) and status_cell("skipped") == (Span("skipped", ""),)
    assert status_cell(None) == (Span("unknown", ""),)
    table = results_table([{"name": "a", "status": "ok"}, {"name": "b", "status": "failed"}])
    assert [r.cls for r in table.rows] == ["", "failed"]
