"""``--json`` output: one JSON document on standard output (a leaf: no rich, so that a script's
``labctl status --json`` loads no drawing at all); the subcommands whose only option is ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def json_subcommand(sub: argparse._SubParsersAction, name: str, help: str,  # type: ignore[type-arg]
                    func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """The subcommand ``name`` of ``sub`` (``list``, ``prune``), whose only option is ``--json``, run by ``func``."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=func)
    return p
