"""``labctl compare`` as a document: what differs between the runs, then every figure of every pair.

Built from :func:`labctl.bundle.compare.compare_runs`; the CLI prints the
same rows with rich and ``--html FILE`` renders these blocks with
:func:`labctl.report.html.to_html`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.bundle.compare import BEYOND, NO_REPEATS, WITHIN
from labctl.bundle.figures import HEADLINE, as_dict, as_list, fmt_num
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Bullets, Charts, Heading, Inline, Meta, Para, Row, Span, Table, txt

GROUPS = (("", "Headline figures"), ("cost.", "Cost per GB, per guest"), ("latency.", "Per-packet latency"),
          ("softnet.", "Softnet"), ("tracepoints.", "Tracepoint counts"), ("snmp.", "SNMP counters (nstat)"))


def _num(value: object) -> str:
    """A figure as the report prints it, whole numbers without ``.0`` (counters)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return fmt_num(value)


def fmt_side(s: object) -> str:
    """A side's value: the mean, with ± sd and the number of runs when there are several."""
    s = as_dict(s)
    if not s:
        return "–"
    if (s.get("n") or 1) > 1:
        return f"{_num(s.get('mean'))} ± {_num(s.get('sd'))} (n={s.get('n')})"
    return _num(s.get("mean"))


def fmt_change(m: Mapping[str, Any]) -> str:
    """``+3.2 (+12.5%)``, ``0`` when unchanged, ``–`` when one side is missing."""
    change = m.get("change")
    if change is None:
        return "–"
    if change == 0:
        return "0"
    sign = "+" if change > 0 else ""
    pct = m.get("change_pct")
    return f"{sign}{_num(change)}" + (f" ({sign}{fmt_num(pct)}%)" if pct is not None else "")


def judgement(m: Mapping[str, Any]) -> tuple[str, str]:
    """(text, style) of a figure's verdict: better/worse beyond noise is said when the figure has a direction."""
    verdict, better, change = m.get("verdict"), m.get("better") or 0, m.get("change") or 0
    if verdict == BEYOND:
        if better and change:
            good = (change > 0) == (better > 0)
            return ("better, beyond noise" if good else "worse, beyond noise"), ("good" if good else "bad")
        return "changed, beyond noise", "b"
    if verdict == WITHIN:
        return "within noise", "muted"
    if verdict == NO_REPEATS:
        return "no repeats: noise unknown", "muted"
    return str(verdict or ""), "muted"


def group_of(key: str) -> str:
    for prefix, title in reversed(GROUPS):
        if prefix and key.startswith(prefix):
            return title
    return GROUPS[0][1]


def _pair_tables(pair: Mapping[str, Any]) -> list[Block]:
    rows: dict[str, list[Row]] = {title: [] for _, title in GROUPS}
    for m in as_list(pair.get("metrics")):
        m = as_dict(m)
        text, style = judgement(m)
        unit = f" {m['unit']}" if m.get("unit") else ""
        rows[group_of(str(m.get("key")))].append(Row((
            txt(f"{m.get('label')}{unit}"), txt(fmt_side(m.get("a"))), txt(fmt_side(m.get("b"))),
            txt(fmt_change(m)), txt(text, style)), "failed" if style == "bad" else ""))
    out: list[Block] = []
    for _, title in GROUPS:
        if rows[title]:
            out += [Heading(4, title), Table(("figure", "A", "B", "change", "verdict"), tuple(rows[title]),
                                             frozenset({1, 2, 3}), "compare")]
    return out


def _charts(result: Mapping[str, Any]) -> Charts | None:
    svgs = []
    pairs = [as_dict(p) for p in as_list(result.get("pairs"))]
    for key, label, unit, _ in HEADLINE:
        labels, values = [], []
        for p in pairs:
            m = next((as_dict(x) for x in as_list(p.get("metrics")) if as_dict(x).get("key") == key), None)
            if m is None:
                continue
            name = str(p.get("variant") or p.get("step"))
            for side in ("a", "b"):
                labels.append(f"{name} {side.upper()}")
                values.append(as_dict(m.get(side)).get("mean"))
        if labels:
            svgs.append(bar_chart_svg(f"{label}: A vs B", labels, values, unit, axis_label=f"{label} ({unit})"))
    return Charts(tuple(svgs)) if svgs else None


def compare_blocks(result: Mapping[str, Any]) -> list[Block]:
    """The comparison as document blocks."""
    a, b = as_dict(result.get("a")), as_dict(result.get("b"))
    blocks: list[Block] = [Heading(1, f"labctl compare: {result.get('lab')}"), Meta((
        ("A", (Span(str(a.get("dir")), "code"), Span(f" {a.get('started_at') or ''} ({a.get('status')})", "muted"))),
        ("B", (Span(str(b.get("dir")), "code"), Span(f" {b.get('started_at') or ''} ({b.get('status')})", "muted"))),
        ("changes beyond noise", txt(result.get("flagged"))),
    ))]
    diffs = [as_dict(d) for d in as_list(result.get("differences"))]
    blocks.append(Heading(2, "What differs between the runs"))
    if diffs:
        blocks.append(Table(("", "A", "B"), tuple(Row((txt(d.get("what")), txt(d.get("a") if d.get("a") is not None
                                                                                else "–", "code"),
                                                      txt(d.get("b") if d.get("b") is not None else "–", "code")))
                                                 for d in diffs), frozenset(), "differences"))
    else:
        blocks.append(Para(txt("Nothing recorded differs: same kernel, NIC models, lab file, labctl, QEMU, "
                               "accelerator, image and host."), "muted"))
    missing: list[Inline] = [txt(f"only in {side.upper()}: {s.get('step')} / {s.get('variant') or '–'}")
                             for side in ("a", "b") for s in map(as_dict, as_list(result.get(f"only_in_{side}")))]
    if missing:
        blocks.append(Bullets(tuple(missing), "warnings"))
    blocks.append(Para(txt(
        "A change is beyond noise when the runs' ranges over their repeats (a step's repeat: N) do not overlap; "
        "with repeats on one side only, when the other value lies outside that range widened by its own width. "
        "Without repeats there is no estimate of the noise."), "muted"))
    charts = _charts(result)
    if charts is not None:
        blocks.append(charts)
    for p in map(as_dict, as_list(result.get("pairs"))):
        runs = as_dict(p.get("runs"))
        blocks.append(Heading(2, f"{p.get('step')} / {p.get('variant') or '–'} "
                                 f"(A: {runs.get('a')} run{'s' if runs.get('a') != 1 else ''}, "
                                 f"B: {runs.get('b')} run{'s' if runs.get('b') != 1 else ''})"))
        blocks += _pair_tables(p) or [Para(txt("no figures on either side"), "muted")]
    return blocks
