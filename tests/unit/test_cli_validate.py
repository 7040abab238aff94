"""``labctl validate`` through the real CLI: exit status 2, FILE:LINE messages, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, Cli

INVALID = sorted((ROOT / "tests" / "labs" / "invalid").glob("*.yaml"))


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_validate_reports_each_problem_with_its_line(cli: Cli, path: Path) -> None:
    rel = path.relative_to(ROOT)
    res = cli("validate", str(rel))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    expected = path.with_suffix(".expected").read_text().replace(path.name, str(rel)).splitlines()
    assert res.stderr.splitlines() == expected
    for line in expected:
        assert line.startswith(f"{rel}:")
        assert line.split(":")[1].isdigit()


def test_validate_accepts_every_bundled_lab(cli: Cli) -> None:
    for lab in sorted((ROOT / "labs").glob("*.yaml")):
        res = cli("validate", str(lab))
        assert res.returncode == 0, res.stderr


def test_up_with_a_broken_lab_starts_nothing(cli: Cli) -> None:
    res = cli("up", str(INVALID[0]))
    assert res.returncode == 2
    assert not (cli.state_dir / "labs").exists() or not any((cli.state_dir / "labs").iterdir())
