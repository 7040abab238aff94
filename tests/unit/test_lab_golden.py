"""Golden-file tests for lab files.

Every ``tests/labs/invalid/NAME.yaml`` must fail to load with exactly the
problem lines in ``NAME.expected`` (file named by its basename, as passed).
Set ``LABCTL_UPDATE_GOLDEN=1`` to rewrite the ``.expected`` files from the
current output (then review the diff!).  Every ``tests/labs/valid/*.yaml``
and every ``labs/*.yaml`` of the repository must load without problems.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labctl.errors import LabFileError
from labctl.lab import Lab, load_lab

ROOT = Path(__file__).resolve().parents[2]
LABS = ROOT / "tests" / "labs"
INVALID = sorted((LABS / "invalid").glob("*.yaml"))
VALID = sorted((LABS / "valid").glob("*.yaml"))
REPO_LABS = sorted((ROOT / "labs").glob("*.yaml"))
UPDATE = os.environ.get("LABCTL_UPDATE_GOLDEN") == "1"


def _problem_lines(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Load ``path`` by its basename and return the reported problem lines."""
    monkeypatch.chdir(path.parent)
    with pytest.raises(LabFileError) as info:
        load_lab(path.name)
    assert info.value.exit_code == 2
    assert str(info.value) == "\n".join(str(p) for p in info.value.problems)
    return [str(problem) for problem in info.value.problems]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_lab_reports_expected_problems(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    actual = _problem_lines(path, monkeypatch)
    golden = path.with_suffix(".expected")
    if UPDATE:
        golden.write_text("\n".join(actual) + "\n", encoding="utf-8")
    assert actual == golden.read_text(encoding="utf-8").splitlines()


def test_every_invalid_fixture_has_a_golden_file_and_vice_versa() -> None:
    yamls = {p.stem for p in INVALID}
    goldens = {p.stem for p in (LABS / "invalid").glob("*.expected")}
    assert yamls == goldens


def test_problems_are_sorted_by_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for path in INVALID:
        lines = [int(line.split(":")[1]) for line in _problem_lines(path, monkeypatch)]
        assert lines == sorted(lines), path.name


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_fixture_loads(path: Path) -> None:
    assert isinstance(load_lab(path), Lab)


@pytest.mark.parametrize("path", REPO_LABS, ids=lambda p: p.stem)
def test_repository_lab_loads(path: Path) -> None:
    assert isinstance(load_lab(path), Lab)
