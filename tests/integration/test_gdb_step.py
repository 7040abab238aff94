"""A lab step with a scripted gdb session: breakpoint in the driver during traffic."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, Cli


def test_gdb_step_breaks_in_the_driver_and_the_guest_runs_on(cli: Cli, image: object, tmp_path: Path) -> None:
    res = cli("up", str(ROOT / "labs" / "gdb-driver-step.yaml"), "--accel", "tcg", "--out", str(tmp_path),
              "--json", timeout=900)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        bundle = Path(json.loads(res.stdout)["bundle"])
        a = bundle / "steps" / "break-in-driver" / "_" / "a"
        transcript = json.loads((a / "gdb-transcript.json").read_text())
        text = (a / "gdb-transcript.txt").read_text()
        assert "e1000_xmit_frame" in text and "drivers/net/ethernet/intel/e1000/e1000_main.c" in text
        assert transcript["hits"] == 2 and not transcript["timed_out"]
        summary = json.loads((bundle / "summary.json").read_text())
        assert summary["steps"][0]["gdb"]["hits"] == 2
        # The guest keeps running after the session.
        assert cli("exec", "gdb-driver-step", "a", "--", "ping", "-c", "1", "-W", "5", "10.32.0.2").returncode == 0
    finally:
        cli("down", "gdb-driver-step")
