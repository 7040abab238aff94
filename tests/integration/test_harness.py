"""The test harness itself (tests/harness.py, the cli fixture): a boot test that fails still has
its lab taken down, and a lab a test leaves behind is named by the run's leftover check.

Each case runs a small generated test file in a nested pytest (its own basetemp, its own run id)
that boots one guest, and looks at the nested run's outcome and at the host afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import ROOT
from tests.integration.conftest import pids_matching, qemu_pids_under

HEADER = '''\
from pathlib import Path

from tests.conftest import new_cli
from tests.integration.conftest import qemu_pids_under

LAB = "name: {name}\\nnetworks: {{}}\\nguests:\\n  g: {{}}\\n"


def _up(cli, tmp_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB)
    up = cli("up", str(lab), "--accel", "tcg")
    assert up.returncode == 0, up.stdout + up.stderr
    Path({record!r}).write_text(str(cli.state_dir))
    assert qemu_pids_under(cli.state_dir)
'''

FAILS = '''
def test_boots_then_fails(cli, image, tmp_path):
    _up(cli, tmp_path)
    assert False, "failing on purpose with the lab up"
'''

LEAVES = '''
def test_boots_and_leaves_its_lab(image, tmp_path, tmp_path_factory):
    cli = new_cli(tmp_path_factory)  # not the cli fixture: nothing takes this lab down after the test
    _up(cli, tmp_path)
'''


def _inner(tmp: Path, name: str, body: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run ``body`` (after HEADER) as ``test_inner.py`` in a nested pytest; its result and the
    state directory the inner test used."""
    record = tmp / "state-dir"
    test = tmp / "test_inner.py"
    test.write_text(HEADER.format(name=name, record=str(record)) + body)
    (tmp / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: boots guests\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", harness.RUN_ENV)}
    env["PYTHONPATH"] = str(ROOT)
    res = harness.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                       "-p", "tests.integration.conftest", "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp),
                       "--basetemp", str(tmp / "b"), "-q", "-rA", str(test)],
                      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert record.exists(), f"the inner test never brought its lab up:\n{res.stdout}\n{res.stderr}"
    return res, Path(record.read_text())


def _nothing_of(state: Path, name: str) -> None:
    assert qemu_pids_under(state) == []
    assert pids_matching(f"labctl.net.switch.*{state}/") == []
    assert not (state / "labs" / name).exists()


def test_a_boot_test_that_fails_has_its_lab_taken_down(image: object,
                                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("hf")  # short: the inner state directory's socket paths
    name = harness.lab_name("hfail")
    res, state = _inner(tmp, name, FAILS)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out  # the test failed...
    assert "failing on purpose with the lab up" in out and "1 failed" in out, out
    assert "LEFTOVERS" not in out, out  # ...and its fixture took the lab down: nothing left to report
    _nothing_of(state, name)


def test_a_lab_left_behind_is_named_by_the_leftover_check(image: object,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("hl")
    name = harness.lab_name("hleft")
    res, state = _inner(tmp, name, LEAVES)
    out = res.stdout + res.stderr
    assert "1 passed" in out, out
    assert res.returncode == 1, out  # the test passed, the run did not: it left its lab
    lines = [line for line in out.splitlines() if "made by test_inner.py::test_boots_and_leaves_its_lab" in line]
    assert any(f"(qemu-system-x86_64, labctl-{name}-g) naming {state}" in line for line in lines), out
    assert any(f"run directory {state}/labs/{name}" in line for line in lines), out
    _nothing_of(state, name)  # and the check removed what it found
