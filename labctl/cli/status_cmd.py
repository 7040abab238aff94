"""``labctl status``: the labs that are up, read from their state (no paramiko, pipeline or pack
loaded: a command of the quick loop, like exec); ``up`` prints a lab the same way."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.cli.jsonout import print_json
from labctl.cli.netview import iface_rows, offload_lines, settings_lines
from labctl.cli.plaintable import line as plain_line
from labctl.cli.plaintable import plain_stdout, render
from labctl.errors import LabStateError
from labctl.proc import pid_alive
from labctl.state import UP, LabState, active_captures, check_lab_name, guest_statuses, run_dir, up_labs
from labctl.textsafe import safe_text

if TYPE_CHECKING:
    from collections.abc import Mapping

    from labctl.lab import Share


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("status", help="show labs that are up")
    s.add_argument("lab", nargs="?")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)


def status_data(state: LabState) -> dict[str, Any]:
    return {
        "lab": state.lab, "state": state.phase if not state.incomplete else "incomplete", "source": state.source, "backend": state.backend, "accel": state.accel,
        "image": state.image, "started_at": state.started_at, "run_dir": state.dir,
        "warnings": state.warnings, "networks": state.networks, "uploads": state.uploads,
        "captures": [{"guest": c.guest, "nic": c.nic, "purpose": c.purpose, "pid": c.owner,
                      "running": pid_alive(c.owner)} for c in active_captures(state)],
        "hosts": {h["name"]: {k: v for k, v in h.items() if k != "name"} for h in state.hosts.values()},
        "guests": [{"name": g.name, "state": g.state, "host": g.host, "ssh": g.ssh, "gdb": g.gdb, "pid": g.pid,
                    "accel": g.accel, "ready_seconds": state.ready_seconds.get(g.name),
                    "started_from": "snapshot" if g.name in state.warm else "boot",
                    "kernel": _kernel_of(state, g.name), "nics": g.nics, **g.settings,
                    "shares": [{**sh.to_dict(), "dir": str(d)} for sh, d in _exported(state, g.name)]}
                   for g in guest_statuses(state)],
    }


def _kernel_of(state: LabState, guest: str) -> dict[str, Any] | None:
    """The release and source of the kernel ``guest`` runs (None when unrecorded or gone from the cache)."""
    try:
        k = state.kernel(guest)
        return {"release": k.release, "source": k.source, "dir": str(k.dir)}
    except (LabStateError, OSError, ValueError):
        return None


def network_lines(state: LabState) -> list[str]:
    """One line per lab network: its mechanism and each member's endpoint."""
    lines = []
    for name, seg in state.networks.items():
        ends = [f"{p['guest']}.{p['nic']}" + (f"@{p['host']}" if p.get("host") else "") + f" {p['local']}"
                for p in seg.get("ports", [])]
        lines.append(f"network {name}: {seg.get('mechanism')} ({' <-> '.join(ends)})")
    return lines


def print_lab(state: LabState) -> None:
    title = f"lab {state.lab}"
    if state.incomplete:
        title += f" (incomplete: the labctl that brought it up was killed; 'labctl down {state.lab}' removes it)"
    elif state.phase != UP:
        title += " (starting)"
    releases = {g: (k or {}).get("release") or "" for g in state.guests for k in [_kernel_of(state, g)]}
    several = len(set(releases.values())) > 1
    if not several and releases:
        title += f" · kernel {next(iter(releases.values())) or '?'}"
    placed = any(h.get("name") != "local" for h in state.hosts.values())
    captured = {c.label for c in active_captures(state) if pid_alive(c.owner)}
    statuses = guest_statuses(state)
    marks = {(g.name, str(n.get("name"))): _net_marks(g.name, n, captured) for g in statuses for n in g.nics}
    shown = any(marks.values())
    columns = ["guest", *(["host"] if placed else []), *(["kernel"] if several else []), "state", "ssh", "gdb",
               "nic", "model", "driver", "address", "network", *(["link / impairment"] if shown else [])]
    rows: list[list[str]] = []
    for g in statuses:
        first = True
        resolved: Mapping[str, Any] = state.guest_spec(g.name) or {}
        for name, model, driver, address, network, nic in iface_rows(resolved, g.nics) or [("",) * 6]:
            host = [(g.host or "") if first else ""] if placed else []
            kernel = [releases.get(g.name, "") if first else ""] if several else []
            cells = [g.name if first else "", *host, *kernel, g.state if first else "", g.ssh if first else "",
                     (g.gdb or "") if first else "", name, model, driver, address, network,
                     *([marks.get((g.name, nic), "")] if shown else [])]
            rows.append([safe_text(c) for c in cells])  # guest text (drivers from READY): controls escaped
            first = False
    lines = [f"{g.name}: {sh.describe(d)}" for g in statuses for sh, d in _exported(state, g.name)]
    lines += [line for g in statuses for line in [
        *offload_lines(g.name, g.nics), *settings_lines(g.name, state.guest_spec(g.name) or {})]]
    _print_table(title, columns, rows, lines)


def _print_table(title: str, columns: list[str], rows: list[list[str]], lines: list[str]) -> None:
    """The table and the lines after it: drawn here for a pipe or a file when it can be (the text rich
    would print, without loading rich: :mod:`.plaintable`), else by rich."""
    plain = plain_stdout()
    table = render(safe_text(title), columns, rows) if plain else None
    after = [plain_line(safe_text(ln)) for ln in lines] if table is not None else []
    if table is not None and all(a is not None for a in after):
        sys.stdout.write(table + "".join(a for a in after if a is not None))
        sys.stdout.flush()
        return
    from rich.table import Table
    from rich.text import Text

    from labctl.cli.ui import out, safe

    t = Table(title=Text(safe_text(title)), title_justify="left")
    for col in columns:
        t.add_column(col)
    for r in rows:
        t.add_row(*(safe(c) for c in r))  # never markup
    out.print(t)
    for ln in lines:
        out.print(Text(ln))


def _say(text: str) -> None:
    """One line of ``status``'s own (no lab, a lab whose state is broken), as rich would print it."""
    plain = plain_line(safe_text(text)) if plain_stdout() else None
    if plain is not None:
        sys.stdout.write(plain)
        sys.stdout.flush()
        return
    from rich.text import Text

    from labctl.cli.ui import out

    out.print(Text(text))


def _exported(state: LabState, guest: str) -> list[tuple[Share, Path]]:
    """The guest's shares, each with the directory it exports (a writable one's of this up)."""
    spec = state.guest_spec(guest)
    if not (spec and spec["shares"]):
        return []  # no share: the lab-file package and the up stage stay unloaded
    from labctl.up import share_directories, shares_of

    shares = shares_of(state.guest_spec(guest))
    rec = state.guests.get(guest)
    if rec is None:
        return [(sh, sh.host) for sh in shares]
    return list(zip(shares, share_directories(Path(rec.dir), shares)))


def _net_marks(guest: str, nic: dict[str, Any], captured: set[str]) -> str:
    """``down · delay 50ms, loss 2% · capturing``: what is in force on a NIC besides its plain link."""
    parts = []
    if nic.get("link") == "down":
        parts.append("link down")
    if nic.get("impair"):
        from labctl.lab import Impairment

        try:
            parts.append(Impairment.from_dict(nic["impair"]).describe())
        except ValueError:
            parts.append("impaired")
    if f"{guest}.{nic.get('name')}" in captured:
        parts.append("capturing")
    for kind in ("xdp", "tc"):
        if isinstance(nic.get(kind), dict):
            parts.append(str(nic[kind].get("summary") or kind))
    return " · ".join(parts)


def cmd_status(args: argparse.Namespace) -> int:
    names = [check_lab_name(args.lab)] if args.lab else up_labs()
    states = []
    broken: dict[str, str] = {}  # lab -> why its state cannot be read (down still removes it)
    for name in names:
        try:
            states.append(LabState.load(name))
        except LabStateError as exc:
            if not run_dir(name).exists():
                raise
            broken[name] = exc.message
    if args.json:
        print_json({"labs": [status_data(s) for s in states]
                    + [{"lab": n, "state": "incomplete", "reason": why} for n, why in broken.items()]})
        return 0
    if not states and not broken:
        _say("no labs are up")
    for s in states:
        print_lab(s)
    for name, why in broken.items():
        _say(f"lab {name}: incomplete ({why}); 'labctl down {name}' removes it")
    return 0
