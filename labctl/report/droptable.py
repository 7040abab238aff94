"""The drops section: every skb each guest's kernel dropped during a step (:mod:`labctl.trace.drops`).

Its piece of a step's summary entry is ``drops``: the rows (guest, where, reason, device, protocol,
count, the first packets' headers, the netfilter rule that dropped), per guest how it was recorded
and what was lost, and the local frees left out. Each step's section shows the table; ``labctl
compare`` gets a figure per guest, function and reason (``drops.b.nft_do_chain.NETFILTER_DROP``),
a function absent from one run counting as 0 there when that run recorded drops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from labctl.bundle import Run, StepSummary, as_dict, as_list
from labctl.report.document import Block, Heading, Para, Row, Table, num, txt
from labctl.report.sections import Metric, ReportSection, StepFiles
from labctl.trace import DropRecord, DropRow, DropSummary, GuestDrops, drop_table, netfilter_note, parse_text

DROPS_TXT, DROPS_JSON = "drops.txt", "drops.json"
XDP_JSON = "xdp-drops.json"
RULESET_BEFORE, RULESET_AFTER = "drops-ruleset-before.txt", "drops-ruleset-after.txt"
ROWS_KEPT = 100


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def summarize_drops(step_dir: Path) -> DropSummary | None:
    """The step's drops from each guest's ``drops.txt`` (None when no guest recorded any)."""
    rows: list[DropRow] = []
    xdp: list[DropRecord] = []  # XDP programs' drops (labctl.follow.xdpwatch), as rows
    guests: dict[str, GuestDrops] = {}
    for d in sorted(p for p in step_dir.iterdir() if (p / DROPS_TXT).is_file()) if step_dir.is_dir() else []:
        try:
            info = json.loads(_read(d / DROPS_JSON) or "{}")
        except ValueError:
            info = {}
        info = info if isinstance(info, dict) else {}
        names = info.get("reasons")
        reasons = [str(n) for n in names] if isinstance(names, list) else None  # None: 6.1's, as before
        events, _ = parse_text(_read(d / DROPS_TXT), d.name)
        got, local = drop_table(events, reasons)
        note = netfilter_note(_read(d / RULESET_BEFORE), _read(d / RULESET_AFTER))
        for r in got:
            if r.reason == "NETFILTER_DROP" and note:
                r.rules.append(note)
        rows += got
        here = xdp_rows(d)
        xdp += here
        guests[d.name] = {"drops": sum(r.count for r in got) + sum(int(x.get("count") or 0) for x in here),
                          "local_frees": local,
                          "lost": int(info.get("lost") or 0), "mode": info.get("mode"),
                          "notes": [str(n) for n in info.get("notes") or []]}
    if not guests:
        return None
    every = [r.as_dict() for r in rows] + xdp
    every.sort(key=lambda r: (-int(r.get("count") or 0), str(r.get("guest")), str(r.get("where"))))
    return {"total": sum(int(r.get("count") or 0) for r in every), "guests": guests, "rows": every[:ROWS_KEPT],
            "rows_left_out": max(0, len(every) - ROWS_KEPT)}


def xdp_rows(guest_dir: Path) -> list[DropRecord]:
    """The guest's XDP drop rows of the step (``xdp-drops.json``, :meth:`labctl.trace.xdpverdicts.XdpRow.as_dict`
    read back: each read with ``get``; none without)."""
    try:
        got = json.loads(_read(guest_dir / XDP_JSON) or "[]")
    except ValueError:
        return []
    return [cast("DropRecord", r) for r in got if isinstance(r, dict)] if isinstance(got, list) else []


def drops_blocks(step: StepSummary) -> list[Block]:
    d = as_dict(step.get("drops"))
    if not d:
        return []
    guests = as_dict(d.get("guests"))
    blocks: list[Block] = [Heading(4, "Drops")]
    rows = []
    for r in as_list(d.get("rows")):
        r = as_dict(r)
        why = str(r.get("reason") or "")
        if r.get("rules"):
            why += " by " + "; ".join(str(x) for x in as_list(r.get("rules")))
        own = as_dict(r.get("xdp")).get("own_count")
        if as_dict(r.get("xdp")):
            why += f" (the program counted {own})" if own is not None else " (the program has no counters)"
        rows.append(Row((txt(r.get("guest")), txt(r.get("where"), "code"), txt(why or "–"), txt(r.get("dev") or "–"),
                         txt(r.get("protocol")), num(r.get("count")),
                         txt("; ".join(str(h) for h in as_list(r.get("headers"))) or "–"))))
    if rows:
        blocks.append(Table(("guest", "where", "reason", "device", "protocol", "count", "first packets"),
                            tuple(rows), frozenset({5}), "drops"))
    else:
        blocks.append(Para(txt(f"no packet dropped in {', '.join(guests)}"), "muted"))
    notes = [f"{g}: {n}" for g, info in guests.items() for n in as_list(as_dict(info).get("notes"))]
    notes += [f"{g}: {as_dict(info).get('lost')} drop events lost (the buffer was full)"
              for g, info in guests.items() if as_dict(info).get("lost")]
    local = sum(int(as_dict(i).get("local_frees") or 0) for i in guests.values())
    if local:
        notes.append(f"{local} frees of skbs that were never network packets (unix sockets, netlink) left out")
    if d.get("rows_left_out"):
        notes.append(f"{d['rows_left_out']} more rows in summary.json's drops")
    if notes:
        blocks.append(Para(txt("; ".join(notes)), "muted"))
    return blocks


def drops_metrics(step: StepSummary) -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    d = as_dict(step.get("drops"))
    for g, info in as_dict(d.get("guests")).items():
        out[f"drops.{g}.total"] = (float(as_dict(info).get("drops") or 0), f"{g}: all drops", "drops", -1)
    for r in as_list(d.get("rows")):
        r = as_dict(r)
        key = f"drops.{r.get('guest')}.{r.get('function')}.{r.get('reason') or 'none'}"
        label = f"{r.get('guest')}: {r.get('function')}" + (f" ({r.get('reason')})" if r.get("reason") else "")
        prev = out.get(key)
        out[key] = ((prev[0] if prev else 0.0) + float(r.get("count") or 0), label, "drops", -1)
    return out


class DropsSection(ReportSection):
    """Every drop of every guest, step by step (see the module docstring)."""

    name = "drops"
    kinds = ("drops",)
    compare_groups = ((8, "drops.", "Drops"),)
    zero_when_absent = ("drops.",)

    def summarize(self, step: StepFiles) -> None:
        got = summarize_drops(step.dir)
        if got is not None:
            step.entry["drops"] = got

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return drops_blocks(step)

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        return drops_metrics(step)
