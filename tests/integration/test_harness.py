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


# -- the suite beside the user's own labs (tests/isolation.py) ------------------------------------------

BESIDE = '''\
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _user(*args):
    env = json.loads(Path(os.environ["LABCTL_BESIDE_USER_ENV"]).read_text())
    return subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_suite_cleans_up_hard_while_the_user_brings_a_lab_up(cli, image, tmp_path):
    lab = tmp_path / "mine.yaml"
    lab.write_text(Path(os.environ["LABCTL_BESIDE_LAB"]).read_text())
    assert cli("up", str(lab), "--accel", "tcg").returncode == 0  # the user's lab's name, in the suite
    # the user, in another shell, during the run: a second lab of theirs comes up
    second = Path(os.environ["LABCTL_BESIDE_SECOND"])
    up = _user("up", str(second), "--accel", "tcg")
    assert up.returncode == 0, up.stderr
    for args in (("down", "--all"), ("snapshot", "prune"), ("kernel", "prune"), ("image", "prune")):
        res = cli(*args)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
'''


def _tree_listing(root: Path) -> dict[str, int]:
    """Every built image, prepared kernel, snapshot and download under ``root``, each file with its
    inode: one replaced or removed shows (host facts and locks are rewritten by any labctl)."""
    return {str(p.relative_to(root)): p.lstat().st_ino for top in ("images", "kernels", "snapshots", "downloads")
            for p in sorted((root / top).rglob("*")) if not p.name.endswith(".lock")}


def test_a_run_of_the_suite_leaves_the_users_labs_and_cache_alone(image: object, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A user with a lab up runs the suite (a nested run, from the user's own environment); during the
    run they bring a second lab up. The suite brings up a lab of the same name as theirs, runs
    ``down --all`` and every prune, and cleans its cache at its end: the user's two labs are still up
    and answer, their post-boot snapshots, kernels and image are the same files as before."""
    from tests import isolation

    tmp = tmp_path_factory.mktemp("iso")
    user_cache, user_state = tmp / "user-cache", tmp / "user-state"
    user_state.mkdir(mode=0o700)
    isolation.seed(Path(os.environ["LABCTL_CACHE_DIR"]), user_cache)  # a user with the image built
    user_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("LABCTL_", "XDG_", "PYTEST_")) and k != harness.RUN_ENV}
    user_env |= {"LABCTL_STATE_DIR": str(user_state), "LABCTL_CACHE_DIR": str(user_cache)}
    (tmp / "user-env.json").write_text(json.dumps(user_env))
    first, second = tmp / "mine.yaml", tmp / "second.yaml"
    first.write_text("name: mine\nnetworks: {lan: {}}\nguests:\n"
                     "  g: {nics: [{name: eth1, model: e1000, network: lan, ip: 10.78.0.1/24}]}\n")
    second.write_text(first.read_text().replace("mine", "second").replace("10.78.", "10.79."))

    def user(*args: str) -> subprocess.CompletedProcess[str]:
        return harness.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=user_env, capture_output=True,
                           text=True, timeout=600)

    try:
        assert user("up", str(first), "--accel", "tcg").returncode == 0
        before = _tree_listing(user_cache)
        assert any(p.startswith("snapshots/") for p in before) and any(p.startswith("kernels/") for p in before)
        qemu = qemu_pids_under(user_state)
        test = tmp / "test_beside.py"
        test.write_text(BESIDE)
        (tmp / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: boots guests\n")
        env = {**user_env, "PYTHONPATH": str(ROOT), isolation.SUITE_CACHE_ENV: str(tmp / "suite-cache"),
               "LABCTL_BESIDE_USER_ENV": str(tmp / "user-env.json"), "LABCTL_BESIDE_LAB": str(first),
               "LABCTL_BESIDE_SECOND": str(second)}
        env.pop("LABCTL_STATE_DIR")
        res = harness.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-p", "tests.integration.conftest", "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp),
                           "--basetemp", str(tmp / "b"), "-q", "-rA", str(test)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout + res.stderr
        # The user's labs: both up, the first on the very same QEMU, both answering.
        status = json.loads(user("status", "--json").stdout)
        assert sorted(lab["lab"] for lab in status["labs"]) == ["mine", "second"]
        assert qemu_pids_under(user_state) and set(qemu) <= set(qemu_pids_under(user_state))
        for lab in ("mine", "second"):
            assert user("exec", lab, "g", "--", "true").returncode == 0
        # The user's cache: nothing of before removed or replaced (the second lab only added).
        after = _tree_listing(user_cache)
        assert {p: i for p, i in after.items() if p in before} == before
    finally:
        user("down", "--all")
    assert qemu_pids_under(user_state) == []
