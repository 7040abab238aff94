"""The crashes section, before the results: each guest that panicked or oopsed during the run, with
drgn's view of its vmcore (summary.json's ``vmcores``, written by :mod:`labctl.inspect.crashwatch`):
the crashing task's stack with each frame's local variables, each lab NIC's netdev state and the
kernel log's last lines, all read from the guest's memory when it crashed. The vmcore itself is
named, never shown: it holds the whole guest (0600, and ``labctl bundle`` leaves it out unless
asked)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from labctl.bundle import Run, VmcoreRecord, as_dict, as_list
from labctl.report.document import Block, Heading, Meta, Para, Pre, Row, Span, Table, txt
from labctl.report.sections import ReportSection
from labctl.textsafe import safe_text

LOG_LINES = 40
MAX_SUMMARY = 8 << 20  # bytes of a vmcore's summary read back


def _inside(root: Path, rel: object) -> Path | None:
    """``root/rel`` when it is a regular file inside ``root`` (a bundle's own path, never a link out)."""
    if not isinstance(rel, str) or not rel:
        return None
    p = (root / rel).resolve()
    return p if p.is_relative_to(root.resolve()) and p.is_file() else None


def read_digest(root: Path, rel: object) -> dict[str, Any]:
    """A vmcore's summary (:mod:`labctl.inspect.digest`) from the bundle ({} when missing or unreadable)."""
    p = _inside(root, rel)
    if p is None or p.stat().st_size > MAX_SUMMARY:
        return {}
    try:
        data = json.loads(p.read_text(errors="replace"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _size(n: object) -> str:
    return f"{int(n) / (1 << 20):.1f} MiB" if isinstance(n, int | float) else "?"


def _meta(root: Path, rec: VmcoreRecord) -> Meta:
    rows: list[tuple[str, tuple[Span, ...]]] = []
    if rec.get("file"):
        core = str(rec["file"])
        rows.append(("vmcore", (Span(core, "code", core if _inside(root, core) else None),
                                Span(f" ({rec.get('format', 'kdump')}, {_size(rec.get('size'))}; the guest's whole "
                                     "memory: readable by you only, and 'labctl bundle' packs it only with "
                                     "--with-vmcores)"))))
        rows.append(("kernel", txt(f"{rec.get('release', '?')} (build ID {rec.get('build_id', '?')})")))
        rows.append(("taken", txt(f"{rec.get('ready_after_s', '?')} s after the crash showed on the console, "
                                  f"summary included (dump {rec.get('dump_s', '?')} s, the guest paused "
                                  f"{rec.get('paused_s', '?')} s; summary {rec.get('summary_s', '?')} s)")))
        rows.append(("open it", (Span(f"labctl drgn --core {core}", "code"), Span("; "),
                                 Span(f"crash VMLINUX {core}", "code"))))
    if rec.get("error"):
        rows.append(("note", txt(safe_text(str(rec["error"])), "bad")))
    return Meta(tuple(rows))


def stack_text(task: Mapping[str, Any]) -> str:
    """A task's frames and their locals, as ``labctl drgn --summary`` prints them."""
    lines = []
    for i, f in enumerate(as_list(task.get("frames"))):
        f = as_dict(f)
        lines.append(f"#{i} {f.get('function')}" + (f" at {f['source']}" if f.get("source") else ""))
        lines += [f"     {k} = {v}" for k, v in as_dict(f.get("locals")).items()]
    return safe_text("\n".join(lines))


def _tasks(digest: Mapping[str, Any]) -> list[Block]:
    out: list[Block] = []
    for t in as_list(digest.get("tasks")):
        t = as_dict(t)
        head = "Crashing task" if t.get("crashed") else f"CPU {t.get('cpu')}"
        out.append(Heading(4, safe_text(f"{head}: pid {t.get('pid', '?')} ({t.get('comm', '?')})", False)))
        if t.get("error"):
            out.append(Para(txt(safe_text(str(t["error"]), False), "muted")))
        out.append(Pre(stack_text(t)))
    return out


def _netdevs(digest: Mapping[str, Any]) -> list[Block]:
    rows = []
    for n in as_list(digest.get("netdevs")):
        n = as_dict(n)
        if "error" in n:
            rows.append(Row((txt(safe_text(str(n.get("name")), False)), txt(safe_text(str(n["error"]), False)),
                             txt(""), txt(""), txt(""), txt(""))))
            continue
        q, st = as_dict(n.get("qdisc")), as_dict(n.get("stats"))
        state = ("UP" if n.get("up") else "DOWN") + (" RUNNING" if n.get("running") else "") \
            + (" carrier" if n.get("carrier") else " no carrier")
        qdisc = f"{q.get('kind')} qlen {q.get('qlen')} drops {q.get('drops')}" if q else "none"
        rows.append(Row((txt(safe_text(str(n.get("name")), False), "code"), txt(str(n.get("mtu"))), txt(state),
                         txt(safe_text(qdisc, False)),
                         txt(f"{st.get('rx_packets')} / {st.get('tx_packets')}"),
                         txt(f"{st.get('rx_dropped')} / {st.get('tx_dropped')}"))))
    if not rows:
        return []
    return [Heading(4, "Network devices"),
            Table(("device", "MTU", "state", "root qdisc", "dev->stats packets rx / tx", "dropped rx / tx"),
                  tuple(rows), frozenset({1}))]


def _dmesg(digest: Mapping[str, Any]) -> list[Block]:
    log = str(digest.get("dmesg") or "").splitlines()
    if not log:
        return []
    return [Heading(4, f"Kernel log (last {min(LOG_LINES, len(log))} lines)"),
            Pre(safe_text("\n".join(log[-LOG_LINES:])))]


def crash_blocks(root: Path, rec: VmcoreRecord) -> list[Block]:
    """One crash: what, when, its vmcore, and drgn's view of it."""
    what = "panicked" if rec.get("cause") == "panic" else "oopsed"
    title = safe_text(f"Guest {rec.get('guest')} {what} during {rec.get('when') or 'the run'}", False)
    blocks: list[Block] = [Heading(3, title)]
    if rec.get("title"):
        blocks.append(Para(txt(safe_text(str(rec["title"]), False), "code"), "alert"))
    blocks.append(_meta(root, rec))
    digest = read_digest(root, rec.get("summary_file"))
    return blocks + _tasks(digest) + _netdevs(digest) + _dmesg(digest)


class CrashSection(ReportSection):
    """Each guest's crash during the run, with drgn's view of its vmcore (see the module docstring)."""

    name = "crashes"
    placement = "lead"

    def blocks(self, run: Run) -> list[Block]:
        records = [cast("VmcoreRecord", as_dict(r)) for r in as_list(run.summary.get("vmcores"))]
        if not records:
            return []
        out: list[Block] = [Heading(2, "Crashes")]
        for rec in records:
            out += crash_blocks(run.dir, rec)
        return out
