"""The test harness itself (tests/harness.py, the cli fixture): a boot test that fails, times
out or is interrupted still has its lab taken down, on either backend, and a lab a test leaves
behind is named by the run's leftover check.

Each case runs a small generated test file in a nested pytest (its own basetemp, its own run id)
that boots one guest, and looks at the nested run's outcome and at the host afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import ROOT
from tests.integration.conftest import pids_matching, qemu_pids_under, require_libvirtd, virsh

HEADER = '''\
import json
import signal
import time
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import new_cli
from tests.integration.conftest import pids_matching

NAME = harness.lab_name("{base}")  # the nested run's own id
LAB = ("name: " + NAME + "\\nnetworks: {{lan: {{}}}}\\nguests:\\n"
       "  g: {{nics: [{{name: eth1, model: e1000, network: lan, ip: 10.77.0.1/24}}]}}\\n")


def _up(cli, tmp_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB)
    Path({record!r}).write_text(json.dumps({{"state": str(cli.state_dir), "lab": NAME}}))
    up = cli("up", str(lab), "--accel", "tcg", "--backend", "{backend}")
    assert up.returncode == 0, up.stdout + up.stderr
    assert pids_matching("qemu-system.*labctl-" + NAME + "-g")
'''

BODIES = {
    "assertion": '''
def test_boots_then_fails(cli, image, tmp_path):
    _up(cli, tmp_path)
    assert False, "failing on purpose with the lab up"
''',
    "timeout": '''
@pytest.mark.timeout(900)
def test_boots_then_times_out(cli, image, tmp_path):
    _up(cli, tmp_path)
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # pytest-timeout's alarm, due now
    time.sleep(120)
''',
    "interrupt": '''
def test_boots_then_is_interrupted(cli, image, tmp_path):
    _up(cli, tmp_path)
    raise KeyboardInterrupt  # Ctrl-C in the middle of the test
''',
    "left": '''
def test_boots_and_leaves_its_lab(image, tmp_path, tmp_path_factory):
    cli = new_cli(tmp_path_factory)  # not the cli fixture: nothing takes this lab down after the test
    _up(cli, tmp_path)
''',
}


def _inner(tmp: Path, base: str, how: str, backend: str = "qemu") -> tuple[subprocess.CompletedProcess[str], Path, str]:
    """Run the test ``how`` in a nested pytest: its result, and the state directory and lab name
    the nested test used."""
    record = tmp / "lab.json"
    test = tmp / "test_inner.py"
    test.write_text(HEADER.format(base=base, record=str(record), backend=backend) + BODIES[how])
    (tmp / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: boots guests\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", harness.RUN_ENV)}
    env["PYTHONPATH"] = str(ROOT)
    res = harness.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                       "-p", "tests.integration.conftest", "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp),
                       "--basetemp", str(tmp / "b"), "-q", "-rA", str(test)],
                      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert record.exists(), f"the nested test never started its lab:\n{res.stdout}\n{res.stderr}"
    rec = json.loads(record.read_text())
    return res, Path(rec["state"]), rec["lab"]


def _nothing_of(state: Path, lab: str) -> None:
    assert qemu_pids_under(state) == []
    assert pids_matching(f"qemu-system.*labctl-{lab}-") == []
    assert pids_matching(f"labctl.net.switch.*{state}/") == []
    assert not (state / "labs" / lab).exists()


def _nothing_on_libvirt(lab: str) -> None:
    prefix = f"labctl-{lab}-"
    assert not [d for d in virsh("list", "--all", "--name").stdout.split() if d.startswith(prefix)]
    assert not [v for v in harness.libvirt_volumes() if v.startswith(prefix)]
    assert not [d for d in harness.libvirt_run_dirs() if d.startswith((prefix, f"{lab}."))]


@pytest.mark.parametrize(("how", "backend", "code", "says"), [
    ("assertion", "qemu", 1, "failing on purpose with the lab up"),
    ("timeout", "qemu", 1, "Timeout"),
    ("interrupt", "qemu", 2, "KeyboardInterrupt"),
    ("assertion", "libvirt", 1, "failing on purpose with the lab up"),
])
def test_a_boot_test_that_fails_has_its_lab_taken_down(image: object, tmp_path_factory: pytest.TempPathFactory,
                                                       how: str, backend: str, code: int, says: str) -> None:
    if backend == "libvirt":
        require_libvirtd()
    tmp = tmp_path_factory.mktemp("hf")  # short: the nested state directory's socket paths
    res, state, lab = _inner(tmp, "hfail", how, backend)
    out = res.stdout + res.stderr
    assert res.returncode == code, out  # the test failed (or the run was interrupted)...
    assert says in out, out
    assert "LEFTOVERS" not in out, out  # ...and its fixture took the lab down: nothing left to report
    _nothing_of(state, lab)
    if backend == "libvirt":
        _nothing_on_libvirt(lab)


def test_a_lab_left_behind_is_named_by_the_leftover_check(image: object,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("hl")
    res, state, lab = _inner(tmp, "hleft", "left")
    out = res.stdout + res.stderr
    assert "1 passed" in out, out
    assert res.returncode == 1, out  # the test passed, the run did not: it left its lab
    lines = [line for line in out.splitlines() if "made by test_inner.py::test_boots_and_leaves_its_lab" in line]
    assert any(f"(qemu-system-x86_64, labctl-{lab}-g) naming {state}" in line for line in lines), out
    assert any(f"run directory {state}/labs/{lab}" in line for line in lines), out
    _nothing_of(state, lab)  # and the check removed what it found
