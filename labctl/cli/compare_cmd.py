"""``labctl compare RUN_A RUN_B [--json] [--html FILE]``: two runs of one lab, every figure paired."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from labctl.bundle import BEYOND, load_run
from labctl.cli.ui import PrepareDisplay, out, print_json
from labctl.pack import is_pack, open_pack, packed_run
from labctl.report import GROUPS, Comparison, compare_runs, fmt_change, fmt_side, group_of, judgement, write_comparison

QUIET = ("snmp.", "tracepoints.")
STYLES = {"good": "green", "bad": "bold red", "b": "bold", "muted": "dim"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("compare", help="compare two runs of one lab: what differs, and every figure with its change")
    p.add_argument("run_a", metavar="RUN_A", type=Path, help="the first run's bundle (the baseline), or a packed run")
    p.add_argument("run_b", metavar="RUN_B", type=Path, help="the second run's bundle")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--html", metavar="FILE", type=Path, default=None, help="also write it as one HTML page")
    p.set_defaults(func=cmd_compare)


def _run_dir(path: Path) -> Path:
    """A run's bundle, or a packed run's (unpacked once into the cache)."""
    if not is_pack(path):
        return path
    with PrepareDisplay().slow(f"opening {path}") as rep:
        return packed_run(open_pack(path, reporter=rep))


def cmd_compare(args: argparse.Namespace) -> int:
    result = compare_runs(load_run(_run_dir(args.run_a)), load_run(_run_dir(args.run_b)))
    if args.html is not None:
        write_comparison(args.html, result, f"labctl compare: {result['lab']}")
    if args.json:
        print_json(result)
    else:
        _print(result, args.html)
    return 0


def _print(result: Comparison, html: Path | None) -> None:
    out.print(Text.assemble(("compare ", "bold"), str(result["lab"]), f": A {result['a']['dir']}",
                            f"  B {result['b']['dir']}"), soft_wrap=True)
    if result["differences"]:
        t = Table(title=Text("what differs between the runs"), title_justify="left")
        for col in ("", "A", "B"):
            t.add_column(col)
        for d in result["differences"]:
            t.add_row(Text(str(d["what"])), Text(str(d["a"])), Text(str(d["b"])))
        out.print(t)
    else:
        out.print(Text("nothing recorded differs between the runs (kernel, NIC models, lab file, versions, "
                       "accelerator, image, host)", style="dim"))
    for side, refs in (("A", result["only_in_a"]), ("B", result["only_in_b"])):
        for s in refs:
            out.print(Text(f"only in {side}: {s['step']} / {s['variant'] or '-'}", style="yellow"))
    for pair in result["pairs"]:
        t = Table(title=Text(f"{pair['step']} / {pair['variant'] or '-'}  (A: {pair['runs']['a']} runs, "
                             f"B: {pair['runs']['b']} runs)"), title_justify="left")
        for col, justify in (("figure", "left"), ("A", "right"), ("B", "right"), ("change", "right"),
                             ("verdict", "left")):
            t.add_column(col, justify=justify)  # type: ignore[arg-type]
        hidden = 0
        for _, title in GROUPS:
            for m in pair["metrics"]:
                if group_of(m["key"]) != title:
                    continue
                if m["key"].startswith(QUIET) and m.get("change") == 0 and m["verdict"] != BEYOND:
                    hidden += 1  # an unchanged counter: in --json and --html, not on the terminal
                    continue
                text, style = judgement(m)
                unit = f" {m['unit']}" if m.get("unit") else ""
                t.add_row(Text(f"{m['label']}{unit}"), Text(fmt_side(m["a"])), Text(fmt_side(m["b"])),
                          Text(fmt_change(m)), Text(text, style=STYLES.get(style, "")))
        out.print(t)
        if hidden:
            out.print(Text(f"  {hidden} counters with the same value in both runs not shown (see --json, --html)",
                           style="dim"))
    out.print(Text(f"{result['flagged']} change(s) beyond run-to-run noise"
                   + ("" if any(m["verdict"] != "no repeats" for p in result["pairs"] for m in p["metrics"])
                      else " (no step has repeats: add repeat: N to a step to measure the noise)")))
    if html is not None:
        out.print(Text(f"html: {html}"), soft_wrap=True)
