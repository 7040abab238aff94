"""``labctl graph FILE|LAB [--format svg|dot|mermaid] [-o FILE]``: a picture of a lab's topology.

From a lab file: guests, NICs (model, address), networks and how labctl
wires them, with the file's impairments and captures. From a lab that is
up: also the bound drivers, guest states, links taken down, the
impairments in force and the captures running.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from labctl.errors import UsageError
from labctl.lab import load_lab
from labctl.live import active_captures
from labctl.net import Runtime, runtime_from_state, to_dot, to_mermaid, to_svg, topology
from labctl.paths import atomic_write
from labctl.state import LabState, check_lab_name, load_netstate
from labctl.up import guest_statuses

FORMATS = {"svg": to_svg, "dot": to_dot, "mermaid": to_mermaid}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("graph", help="draw a lab's topology (SVG, Graphviz DOT or Mermaid)",
                       description="Draw the topology of a lab file, or of a lab that is up with what is "
                                   "in force now (drivers, links down, impairments, captures).")
    p.add_argument("source", metavar="FILE|LAB", help="a lab file, or the name of a lab that is up")
    p.add_argument("--format", choices=tuple(FORMATS), default="svg")
    p.add_argument("-o", "--output", metavar="FILE", type=Path, help="write here instead of standard output")
    p.set_defaults(func=cmd_graph)


def _is_file(source: str) -> bool:
    return Path(source).exists() or source.endswith((".yaml", ".yml")) or "/" in source


def lab_picture(source: str) -> tuple[dict[str, Any], Runtime | None]:
    """The resolved lab and runtime facts (None for a file) of ``source``.

    :raise LabFileError: for a bad lab file. :raise UsageError, LabStateError: for a bad or absent lab.
    """
    if _is_file(source):
        return dict(load_lab(source).to_dict()), None
    state = LabState.load(check_lab_name(source))
    record = load_netstate(state.path)
    runtime = runtime_from_state(state.drivers, state.networks, state.hosts,
                                 {g.name: g.state for g in guest_statuses(state)},
                                 record.impair, record.links, [c.label for c in active_captures(state)],
                                 state.offloads)
    return dict(state.resolved), runtime


def cmd_graph(args: argparse.Namespace) -> int:
    lab, runtime = lab_picture(args.source)
    text = FORMATS[args.format](topology(lab, runtime))
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        atomic_write(args.output, text)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from exc
    return 0
