"""``--json`` output: one JSON document on standard output (a leaf: no rich, so that a script's
``labctl status --json`` loads no drawing at all)."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
