"""labs/oops-buggy-driver.yaml end to end: the crash is decoded to the module's source line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, Cli
from tests.integration.conftest import qemu_pids_under


def test_buggy_netfilter_module_oops_is_decoded_to_its_source(cli: Cli, image: object, tmp_path: Path) -> None:
    res = cli("run", str(ROOT / "labs" / "oops-buggy-driver.yaml"), "--out", str(tmp_path), "--accel", "tcg",
              "--json", timeout=900)
    assert res.returncode == 6, res.stdout + res.stderr  # the trigger step fails: that is the lab
    outcome = json.loads(res.stdout)
    assert [s["status"] for s in outcome["steps"]] == ["ok", "failed"]
    assert "guest victim crashed: BUG: kernel NULL pointer dereference in buggy_nf_count" in outcome["reason"]
    bundle = Path(outcome["bundle"])
    decoded = json.loads((bundle / "guests" / "victim" / "oops.json").read_text())
    rip = decoded[0]["rip"]
    assert rip["func"] == "buggy_nf_count" and rip["module"] == "buggy_nf"
    assert rip["file"] == "guest/modules/buggy_nf/buggy_nf.c"
    source = (ROOT / "guest" / "modules" / "buggy_nf" / "buggy_nf.c").read_text().splitlines()
    assert "st->packets++" in source[rip["line"] - 1]  # the faulting line itself
    frames = [f["func"] for f in decoded[0]["frames"]]
    assert "buggy_nf_hook" in frames and "nf_hook_slow" in frames
    assert qemu_pids_under(cli.state_dir) == []
