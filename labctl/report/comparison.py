"""Two runs of one lab, side by side (``labctl compare``): what differs between them, and every figure
with its change; then the same as a document.

:func:`compare_runs` pairs the steps of run A and run B by step name and variant, and for each pair
puts every figure side by side with its change: each report section's (:func:`labctl.report.registry.step_metrics`:
throughput, CPU, driver share, cost per GB, per-stage latency percentiles, softnet drops, SNMP
counters, tracepoint totals). It also says what differs between the runs: the kernel of each
guest, the NIC models, the lab file, labctl's and QEMU's versions, the accelerator, the image and
the host. :func:`compare_blocks` turns the result into document blocks; the CLI prints the same
rows with rich and ``--html FILE`` renders the blocks with :func:`labctl.report.html.to_html`.

**Noise.** A variant run several times (a step's ``repeat: N``) has a spread.
A change is *beyond noise* when:

* both runs have repeats: their ranges (min..max over the runs) do not
  overlap. With 3 runs a side, two samples of the same distribution give
  disjoint ranges by chance with probability 2/20 = 10%; with 5 a side,
  2/252 < 1%;
* only one run has repeats: the other's value lies outside that range
  widened by its own width on each side;
* neither has repeats: there is no estimate of the noise, and no verdict.

Runs that failed are left out of the figures. The result is JSON-able.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from labctl.bundle import (
    BEYOND,
    NO_REPEATS,
    WITHIN,
    Run,
    Spread,
    StepSummary,
    as_dict,
    fmt_num,
    is_failed,
    repeat_key,
    run_steps,
    spread,
    verdict,
)
from labctl.errors import UsageError
from labctl.lab import NetSettings, net_settings
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Bullets, Charts, Heading, Inline, Meta, Para, Row, Span, Table, txt
from labctl.report.registry import compare_groups, headline, step_metrics, zero_when_absent

GROUPS = compare_groups()  # each section's tables (labctl.report.sections), in order


class Difference(TypedDict):
    """One thing that differs between the runs' setups."""

    what: str
    a: object
    b: object


class MetricRow(TypedDict):
    """One figure of a step and variant in both runs: each side's spread, the change and its verdict."""

    key: str
    label: str
    unit: str
    better: int
    a: Spread | None
    b: Spread | None
    change: float | None
    change_pct: float | None
    verdict: str


class Runs(TypedDict):
    a: int
    b: int


class Pair(TypedDict):
    """A step and variant present in both runs, with its runs per side and its figures."""

    step: str
    variant: str | None
    runs: Runs
    metrics: list[MetricRow]


class Side(TypedDict):
    dir: str
    status: object
    started_at: object
    accel: object


class StepRef(TypedDict):
    step: str
    variant: str | None


class Comparison(TypedDict):
    """Everything ``labctl compare`` shows (:func:`compare_runs`), JSON-able."""

    lab: str
    a: Side
    b: Side
    differences: list[Difference]
    pairs: list[Pair]
    only_in_a: list[StepRef]
    only_in_b: list[StepRef]
    flagged: int


def lab_of(run: Run) -> str:
    """The run's lab name (summary first, then manifest)."""
    return str(run.summary.get("lab") or as_dict(run.manifest.get("lab")).get("name") or "")


def check_same_lab(a: Run, b: Run, names: tuple[str, str] = ("RUN_A", "RUN_B")) -> None:
    """:raise UsageError: (exit 2) when the two runs are of different labs."""
    la, lb = lab_of(a), lab_of(b)
    if la != lb:
        raise UsageError(f"{names[0]} is a run of lab '{la or 'unknown'}' and {names[1]} of lab "
                         f"'{lb or 'unknown'}': labctl compare pairs the steps of two runs of the same lab",
                         hint="pass two bundles of one lab file (before and after a change)")


# --------------------------------------------------------------------------- what differs


def _kernel(k: object) -> str:
    k = as_dict(k)
    if not k:
        return "unknown"
    build = f" (build id {str(k['build_id'])[:12]})" if k.get("build_id") else ""
    return f"{k.get('release') or '?'}{build}"


def _nics(manifest: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    guests = as_dict(as_dict(as_dict(manifest.get("lab")).get("resolved")).get("guests"))
    for g, spec in guests.items():
        for nic in as_dict(spec).get("nics") or []:
            nic = as_dict(nic)
            out[f"{g}.{nic.get('name')}"] = str(nic.get("model"))
    return out


def _net_settings(manifest: Mapping[str, Any]) -> dict[str, NetSettings]:
    guests = as_dict(as_dict(as_dict(manifest.get("lab")).get("resolved")).get("guests"))
    return {str(g): net_settings(as_dict(spec)) for g, spec in guests.items()}


def _net_differences(ma: Mapping[str, Any], mb: Mapping[str, Any]) -> list[tuple[str, object, object]]:
    """Each guest's network settings that differ: an interface's addresses or what it is (a VLAN, a
    bond's mode and members), its routes, each sysctl, its firewall's rules."""
    sa, sb = _net_settings(ma), _net_settings(mb)
    out: list[tuple[str, object, object]] = []
    for g in sorted(set(sa) & set(sb)):
        a, b = sa[g], sb[g]
        ia, ib = as_dict(a.get("interfaces")), as_dict(b.get("interfaces"))
        for name in sorted(set(ia) | set(ib)):
            x, y = as_dict(ia.get(name)), as_dict(ib.get(name))
            if x.get("what") != y.get("what") or x.get("in") != y.get("in"):
                out.append((f"interface {g}.{name}", _iface_text(x), _iface_text(y)))
            elif x.get("addresses") != y.get("addresses"):
                out.append((f"addresses of {g}.{name}", ", ".join(x.get("addresses") or []) or "none",
                            ", ".join(y.get("addresses") or []) or "none"))
            for kind, title in (("xdp", "XDP"), ("tc", "tc program")):
                if x.get(kind) != y.get(kind):
                    out.append((f"{title} of {g}.{name}", str(x.get(kind) or "none"), str(y.get(kind) or "none")))
        ra, rb = a.get("routes") or [], b.get("routes") or []
        if ra != rb:
            out.append((f"routes of {g}", "; ".join(ra) or "none", "; ".join(rb) or "none"))
        ka, kb = as_dict(a.get("sysctls")), as_dict(b.get("sysctls"))
        out += [(f"sysctl {k} of {g}", ka.get(k, "not set"), kb.get(k, "not set"))
                for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)]
        fa, fb = list(a.get("firewall") or []), list(b.get("firewall") or [])
        if fa != fb:  # the lines of each run's nft script that the other's lacks
            out.append((f"firewall of {g}", "; ".join(x for x in fa if x not in fb) or ("none" if not fa else "same rules"),
                        "; ".join(x for x in fb if x not in fa) or ("none" if not fb else "same rules")))
    return out


def _iface_text(iface: Mapping[str, Any]) -> str:
    if not iface:
        return "none"
    where = f" in {iface['in']}" if iface.get("in") else ""
    return f"{iface.get('what')}{where}" + (f", {', '.join(iface.get('addresses') or [])}" if iface.get("addresses") else "")


def differences(a: Run, b: Run) -> list[Difference]:
    """What differs between the two runs' setups: [{what, a, b}], empty when nothing does."""
    ma, mb = a.manifest, b.manifest
    pairs: list[tuple[str, object, object]] = [
        ("accelerator", a.summary.get("accel") or ma.get("accel"), b.summary.get("accel") or mb.get("accel")),
        ("labctl", ma.get("labctl_version"), mb.get("labctl_version")),
        ("QEMU", as_dict(ma.get("qemu")).get("version"), as_dict(mb.get("qemu")).get("version")),
        ("lab file sha256", as_dict(ma.get("lab")).get("sha256"), as_dict(mb.get("lab")).get("sha256")),
        ("image", as_dict(ma.get("image")).get("key"), as_dict(mb.get("image")).get("key")),
        ("backend", ma.get("backend"), mb.get("backend")),
    ]
    ka, kb = as_dict(ma.get("kernels")), as_dict(mb.get("kernels"))
    pairs += [(f"kernel of {g}", _kernel(ka.get(g)), _kernel(kb.get(g))) for g in sorted(set(ka) | set(kb))]
    na, nb = _nics(ma), _nics(mb)
    pairs += [(f"NIC model of {n}", na.get(n), nb.get(n)) for n in sorted(set(na) | set(nb))]
    pairs += _net_differences(ma, mb)
    ha, hb = as_dict(ma.get("host")), as_dict(mb.get("host"))
    pairs += [(f"host {k}", ha.get(k), hb.get(k)) for k in ("name", "kernel", "cpus")]
    return [{"what": what, "a": va, "b": vb} for what, va, vb in pairs if va != vb]


# --------------------------------------------------------------------------- figures


def _groups(run: Run) -> dict[tuple[str, str | None], list[StepSummary]]:
    """(step, variant) -> the runs of it that did not fail or get skipped, in order."""
    out: dict[tuple[str, str | None], list[StepSummary]] = {}
    for s in run_steps(run.summary):
        out.setdefault(repeat_key(s), [])
        if not is_failed(s.get("status")) and s.get("status") != "skipped":
            out[repeat_key(s)].append(s)
    return out


def _change(a: float, b: float) -> tuple[float, float | None]:
    return round(b - a, 4), (round(100 * (b - a) / abs(a), 2) if a else None)


def _absent_as_zero(values: dict[str, tuple[list[float], list[float]]],
                    sides: tuple[list[StepSummary], list[StepSummary]]) -> None:
    """A count a section keeps only when non-zero (drops by function) is 0 in each run that has that
    section's piece but not the key: a side whose runs all lack it, and a repeat that lacks it beside
    one that has it (its mean is over every repeat)."""
    for key, pair in values.items():
        prefix = next((p for p in zero_when_absent() if key.startswith(p)), None)
        if prefix is None:
            continue
        for side, runs in enumerate(sides):
            having = sum(1 for run in runs if prefix.rstrip(".") in run)  # each run gives a key at most once
            if pair[side] or having == len(runs):
                pair[side].extend([0.0] * max(0, having - len(pair[side])))


def _metric_rows(ra: list[StepSummary], rb: list[StepSummary]) -> list[MetricRow]:
    values: dict[str, tuple[list[float], list[float]]] = {}
    info: dict[str, tuple[str, str, int]] = {}
    order: list[str] = []
    for side, runs in ((0, ra), (1, rb)):
        for run in runs:
            for key, (value, label, unit, better) in step_metrics(run).items():
                if key not in values:
                    values[key] = ([], [])
                    order.append(key)
                values[key][side].append(value)
                info[key] = (label, unit, better)
    _absent_as_zero(values, (ra, rb))
    rows: list[MetricRow] = []
    for key in order:
        va, vb = values[key]
        label, unit, better = info[key]
        sa, sb = (spread(va) if va else None), (spread(vb) if vb else None)
        change, pct = _change(float(sa["mean"]), float(sb["mean"])) if sa and sb else (None, None)
        rows.append({"key": key, "label": label, "unit": unit, "better": better, "a": sa, "b": sb, "change": change,
                     "change_pct": pct, "verdict": verdict(va, vb) if va and vb else ("only in A" if va else "only in B")})
    return rows


def compare_runs(a: Run, b: Run) -> Comparison:
    """Everything ``labctl compare`` shows, JSON-able.

    Keys: ``lab``, ``a``/``b`` (directory, status, started), ``differences``
    (:func:`differences`), ``pairs`` (one per step and variant present in
    both, with ``runs`` per side and ``metrics``: key, label, unit, better,
    a/b spreads, change, change_pct, verdict), ``only_in_a``/``only_in_b``
    (step and variant names present in one run only) and ``flagged`` (how
    many figure changes are beyond noise).

    :raise UsageError: when the runs are of different labs.
    """
    check_same_lab(a, b)
    ga, gb = _groups(a), _groups(b)
    pairs: list[Pair] = []
    flagged = 0
    for key in [k for k in ga if k in gb]:
        metrics = _metric_rows(ga[key], gb[key])
        flagged += sum(1 for m in metrics if m["verdict"] == BEYOND)
        pairs.append({"step": key[0], "variant": key[1], "runs": {"a": len(ga[key]), "b": len(gb[key])},
                      "metrics": metrics})

    def side(r: Run) -> Side:
        return {"dir": str(r.dir), "status": r.summary.get("status") or r.manifest.get("status"),
                "started_at": r.summary.get("started_at") or r.manifest.get("started_at"),
                "accel": r.summary.get("accel") or r.manifest.get("accel")}

    return {"lab": lab_of(a), "a": side(a), "b": side(b), "differences": differences(a, b), "pairs": pairs,
            "only_in_a": [{"step": k[0], "variant": k[1]} for k in ga if k not in gb],
            "only_in_b": [{"step": k[0], "variant": k[1]} for k in gb if k not in ga],
            "flagged": flagged}


# --------------------------------------------------------------------------- the document


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


def fmt_change(m: MetricRow) -> str:
    """``+3.2 (+12.5%)``, ``0`` when unchanged, ``–`` when one side is missing."""
    change = m.get("change")
    if change is None:
        return "–"
    if change == 0:
        return "0"
    sign = "+" if change > 0 else ""
    pct = m.get("change_pct")
    return f"{sign}{_num(change)}" + (f" ({sign}{fmt_num(pct)}%)" if pct is not None else "")


def judgement(m: MetricRow) -> tuple[str, str]:
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


def _pair_tables(pair: Pair) -> list[Block]:
    rows: dict[str, list[Row]] = {title: [] for _, title in GROUPS}
    for m in pair["metrics"]:
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


def _charts(result: Comparison) -> Charts | None:
    svgs = []
    for key, label, unit, _ in headline():
        labels: list[str] = []
        values: list[float | None] = []
        for p in result["pairs"]:
            m = next((x for x in p["metrics"] if x["key"] == key), None)
            if m is None:
                continue
            name = str(p["variant"] or p["step"])
            for side in (m["a"], m["b"]):
                labels.append(f"{name} {'A' if side is m['a'] else 'B'}")
                values.append(side["mean"] if side else None)
        if labels:
            svgs.append(bar_chart_svg(f"{label}: A vs B", labels, values, unit, axis_label=f"{label} ({unit})"))
    return Charts(tuple(svgs)) if svgs else None


def compare_blocks(result: Comparison) -> list[Block]:
    """The comparison as document blocks."""
    a, b = result["a"], result["b"]
    blocks: list[Block] = [Heading(1, f"labctl compare: {result.get('lab')}"), Meta((
        ("A", (Span(str(a.get("dir")), "code"), Span(f" {a.get('started_at') or ''} ({a.get('status')})", "muted"))),
        ("B", (Span(str(b.get("dir")), "code"), Span(f" {b.get('started_at') or ''} ({b.get('status')})", "muted"))),
        ("changes beyond noise", txt(result.get("flagged"))),
    ))]
    diffs = result["differences"]
    blocks.append(Heading(2, "What differs between the runs"))
    if diffs:
        blocks.append(Table(("", "A", "B"), tuple(Row((txt(d.get("what")), txt(d.get("a") if d.get("a") is not None
                                                                                else "–", "code"),
                                                      txt(d.get("b") if d.get("b") is not None else "–", "code")))
                                                 for d in diffs), frozenset(), "differences"))
    else:
        blocks.append(Para(txt("Nothing recorded differs: same kernel, NIC models, lab file, labctl, QEMU, "
                               "accelerator, image and host."), "muted"))
    missing: list[Inline] = [txt(f"only in {side}: {s['step']} / {s['variant'] or '–'}")
                             for side, refs in (("A", result["only_in_a"]), ("B", result["only_in_b"])) for s in refs]
    if missing:
        blocks.append(Bullets(tuple(missing), "warnings"))
    blocks.append(Para(txt(
        "A change is beyond noise when the runs' ranges over their repeats (a step's repeat: N) do not overlap; "
        "with repeats on one side only, when the other value lies outside that range widened by its own width. "
        "Without repeats there is no estimate of the noise."), "muted"))
    charts = _charts(result)
    if charts is not None:
        blocks.append(charts)
    for p in result["pairs"]:
        runs = p["runs"]
        blocks.append(Heading(2, f"{p['step']} / {p['variant'] or '–'} "
                                 f"(A: {runs['a']} run{'s' if runs['a'] != 1 else ''}, "
                                 f"B: {runs['b']} run{'s' if runs['b'] != 1 else ''})"))
        blocks += _pair_tables(p) or [Para(txt("no figures on either side"), "muted")]
    return blocks
