"""``labctl up --dry-run``: every guest's QEMU command line before anything starts, and the same
command line ``up`` then runs (the planning is the one ``up`` uses, minus its side effects)."""

from __future__ import annotations

import json
import re

from tests.conftest import ROOT, Cli
from tests.integration.conftest import qemu_pids_under

LAB = ROOT / "labs" / "quickstart.yaml"


def _normal(argv: list[str]) -> list[str]:
    # The SSH port is one free when asked (a dry run's is free now, up's when it starts).
    # and the VM generation ID each start draws anew (guid=auto when planned)
    return [re.sub(r"^vmgenid,guid=[^,]*", "vmgenid,guid=NEW", re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", a))
            for a in argv]


def test_dry_run_prints_the_commands_up_runs_and_starts_nothing(cli: Cli, image: object) -> None:
    dry = cli("up", str(LAB), "--dry-run", "--accel", "tcg", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = {g["guest"]: g for g in json.loads(dry.stdout)["guests"]}
    assert sorted(planned) == ["a", "b", "c"]
    # Nothing made or started: no run directory, no QEMU, no lab up.
    assert not (cli.state_dir / "labs").exists() or not any((cli.state_dir / "labs").iterdir())
    assert qemu_pids_under(cli.state_dir) == []
    assert "no labs are up" in cli("status").stdout
    for g in planned.values():
        assert g["command"][0].startswith("qemu-system-"), g
        assert "-kernel" in g["command"] and "-netdev" in " ".join(g["command"])

    text = cli("up", str(LAB), "--dry-run", "--accel", "tcg")
    assert text.returncode == 0 and text.stdout.count("qemu-system-") == 3, text.stdout + text.stderr

    up = cli("up", str(LAB), "--accel", "tcg", "--json", timeout=900)
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((cli.state_dir / "labs" / "quickstart" / "state.json").read_text())
        started = {g["name"]: g["started_from"] for g in json.loads(up.stdout)["guests"]}
        for name, rec in state["guests"].items():
            assert started[name] == planned[name]["from"], (name, started, planned[name]["from"])
            assert _normal(rec["argv"]) == _normal(planned[name]["command"]), name
    finally:
        cli("down", "quickstart")


def test_dry_run_refuses_what_up_would_with_exit_2(cli: Cli, image: object, tmp_path: object) -> None:
    from pathlib import Path

    lab = Path(str(tmp_path)) / "long.yaml"
    # A lab name that makes its unix socket paths longer than sun_path allows: refused, with its line.
    name = "n" * 60
    lab.write_text(f"name: {name}\nnetworks: {{}}\nguests:\n  {'g' * 60}: {{}}\n")
    res = cli("up", str(lab), "--dry-run", "--accel", "tcg")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "long.yaml:4" in res.stderr and "Traceback" not in res.stderr
    assert "qemu-system-" not in res.stdout
