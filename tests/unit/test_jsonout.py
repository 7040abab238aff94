"""``--json`` output (labctl.cli.jsonout): one indented document and its newline; values JSON lacks
(a path, a time) as their text, never a traceback."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from labctl.cli.jsonout import print_json


def test_a_document_with_paths_and_times_is_printed_whole(capsys: pytest.CaptureFixture[str]) -> None:
    when = datetime.datetime(2026, 12, 3, 20, 40, tzinfo=datetime.UTC)
    print_json({"dir": Path("/run/x"), "at": when, "n": [1, 2]})
    out = capsys.readouterr().out
    assert out.endswith("}\n") and out.count("\n") > 3  # indented, one trailing newline
    assert json.loads(out) == {"dir": "/run/x", "at": str(when), "n": [1, 2]}
