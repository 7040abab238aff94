"""A guest that panics mid-step: the step fails with the oops decoded, the other guest runs on."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Cli
from tests.integration.conftest import qemu_pids_under

LAB = """\
name: crashy
networks: {lan: {}}
guests:
  a:
    nics: [{name: eth1, model: e1000, network: lan, ip: 10.41.0.1/24}]
  b:
    nics: [{name: eth1, model: rtl8139, network: lan, ip: 10.41.0.2/24}]
steps:
  - name: crash
    run:
      - {guest: a, command: "ping -c 2 {{b.eth1.ip}}"}
      - {guest: b, command: "echo c > /proc/sysrq-trigger", timeout: 120}
"""


def test_sysrq_crash_fails_the_step_with_a_decoded_oops(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "crashy.yaml"
    lab.write_text(LAB)
    runs = tmp_path / "runs"
    res = cli("up", str(lab), "--accel", "tcg", "--out", str(runs), "--json", timeout=900)
    try:
        assert res.returncode == 6, res.stdout + res.stderr  # a step failed
        outcome = json.loads(res.stdout)
        assert outcome["status"] == "failed"
        assert "guest b crashed" in outcome["reason"] and "sysrq" in outcome["reason"].lower()
        bundle = Path(outcome["bundle"])
        oops = (bundle / "guests" / "b" / "oops.txt").read_text()
        assert "sysrq_handle_crash" in oops and "drivers/tty/sysrq.c:" in oops
        decoded = json.loads((bundle / "guests" / "b" / "oops.json").read_text())
        frames = [f for f in [decoded[0]["rip"], *decoded[0]["frames"]] if f]
        assert any(f["func"] == "sysrq_handle_crash" and f["file"].endswith("drivers/tty/sysrq.c")
                   and f["line"] for f in frames)
        report = (bundle / "report.md").read_text()
        assert "guest b crashed" in report
        # b is marked crashed, a keeps running and answers.
        status = json.loads(cli("status", "crashy", "--json", check=True).stdout)
        states = {g["name"]: g["state"] for g in status["labs"][0]["guests"]}
        assert states == {"a": "running", "b": "crashed"}
        assert cli("exec", "crashy", "a", "--", "true").returncode == 0
    finally:
        down = cli("down", "crashy")
    assert down.returncode == 0, down.stderr
    assert qemu_pids_under(cli.state_dir) == []
