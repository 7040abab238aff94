"""What each quick command imports (its module budget): one eager import added later to the parser,
the command table or a light command's module fails here instead of slowing every command.

Each command runs in a fresh interpreter with ``-X importtime``; the modules it loaded are read from
that report (not timed: only the names count, so machine load cannot change the outcome)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("paramiko", "rich", "labctl.pipeline", "labctl.backends", "labctl.report", "labctl.web",
         "labctl.bisect", "labctl.bundle")


def imported(args: list[str], tmp_path: Path) -> set[str]:
    """The modules ``labctl ARGS`` imports, run from this checkout with a private, empty state directory."""
    env = {**os.environ, "LABCTL_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", *args], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}


def heavy(mods: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == b or m.startswith(b + ".") for b in banned))


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_import_nothing_of_labctls_machinery(args: list[str], tmp_path: Path) -> None:
    mods = imported(args, tmp_path)
    assert sorted(m for m in mods if m.startswith("labctl")) == ["labctl", "labctl.cli", "labctl.cli.examples",
                                                                   "labctl.cli.main"]
    assert heavy(mods, ("logging", "dataclasses", *HEAVY)) == []


def test_exec_loads_neither_paramiko_nor_the_backends_nor_rich(tmp_path: Path) -> None:
    """``exec`` runs OpenSSH over the guest's kept connection (labctl.mux): no paramiko, no backend,
    no lab-file package, no rich (its output is the guest command's own)."""
    mods = imported(["exec", "--help"], tmp_path)
    assert "labctl.cli.exec_cmd" in mods and "labctl.muxclient" in mods  # labctl.mux: when a command runs
    assert heavy(mods, (*HEAVY, "labctl.lab", "labctl.up", "labctl.live", "labctl.debug", "labctl.ssh",
                        "labctl.kernel", "labctl.image", "labctl.steps")) == []


def test_exec_of_a_lab_that_is_not_up_loads_no_more(tmp_path: Path) -> None:
    """The state read and the error printed: rich comes in to print it, nothing else."""
    env = {**os.environ, "LABCTL_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", "exec", "nolab", "g", "--", "true"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert res.returncode == 5 and "lab 'nolab' is not up" in res.stderr, res.stderr[-2000:]
    mods = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "labctl.state.runstate" in mods
    assert heavy(mods, tuple(b for b in HEAVY if b != "rich")) == []


def test_status_loads_neither_paramiko_nor_the_pipeline_nor_a_pack_nor_the_report(tmp_path: Path) -> None:
    """``status`` reads the labs' state; what brings a lab up (the pipeline, packs, the up stage),
    paramiko and the live stage stay out; with no lab up, no backend either (one that is up loads
    its backend, which says whether each machine exists: labctl.state.status)."""
    mods = imported(["status", "--json"], tmp_path)
    assert "labctl.cli.status_cmd" in mods and "labctl.cli.lifecycle_cmds" not in mods
    assert heavy(mods, (*HEAVY, "labctl.pack", "labctl.up", "labctl.live",
                        "labctl.debug", "labctl.ssh", "labctl.cli.displays")) == []


def test_down_loads_neither_paramiko_nor_the_pipeline_nor_a_pack(tmp_path: Path) -> None:
    """``down`` of a lab that is not up (its parser and command: the same imports up to the state's
    answer): not up's module, whose parser needs the pipeline, packs and the steps' displays."""
    env = {**os.environ, "LABCTL_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", "down", "nolab"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert res.returncode != 0 and "nolab" in res.stderr, res.stderr[-2000:]
    mods = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "labctl.cli.down_cmd" in mods and "labctl.cli.lifecycle_cmds" not in mods
    assert heavy(mods, ("paramiko", "labctl.pipeline", "labctl.report", "labctl.web", "labctl.bisect",
                        "labctl.pack", "labctl.ssh", "labctl.steps", "labctl.cli.displays")) == []


def test_up_loads_what_bringing_a_lab_up_needs_and_no_more(tmp_path: Path) -> None:
    """``up``'s module and the pipeline's front: not paramiko (a warm guest answers through its agent
    and its sshd's banner; a cold one's wait loads it), nor what running steps, checks and the report
    need (loaded by a lab with steps: labctl.pipeline.run_steps)."""
    mods = imported(["up", "--help"], tmp_path)
    assert "labctl.cli.lifecycle_cmds" in mods and "labctl.pipeline" in mods and "labctl.up.lifecycle" in mods
    assert heavy(mods, ("paramiko", "labctl.ssh", "labctl.report", "labctl.steps", "labctl.bundle",
                        "labctl.grading", "labctl.inspect", "labctl.cli.displays", "labctl.web", "labctl.bisect")) == []


def test_an_eager_import_in_the_command_table_fails_the_budget(tmp_path: Path) -> None:
    """The budget catches what it is for: a copy of the tree whose command table imports paramiko
    eagerly (one line) loads it for every command."""
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "labctl", tree / "labctl", ignore=shutil.ignore_patterns("__pycache__"))
    main = tree / "labctl" / "cli" / "main.py"
    text = main.read_text()
    main.write_text(text.replace("from labctl.cli.examples import add_examples\n",
                                 "from labctl.cli.examples import add_examples\nimport paramiko  # noqa\n", 1))
    env = {**os.environ, "LABCTL_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(tree)}
    for args in (["--version"], ["status", "--json"], ["exec", "--help"]):
        res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", *args], capture_output=True,
                             text=True, cwd=tree, env=env, timeout=120, check=False)
        mods = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
        assert "labctl.cli.main" in mods and heavy(mods, HEAVY) != [], args


def _lab_up(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A state directory with lab ``one`` up (its state.json recorded from a real ``up`` of a one-guest
    lab, tests/fixtures/status/), whose guest's QEMU is a process of ours that names its QMP socket,
    as the backend checks; returned for the caller to end."""
    state = tmp_path / "state"
    run = state / "labs" / "one"
    (run / "guests" / "a").mkdir(parents=True)
    (state / "labs").chmod(0o700)
    state.chmod(0o700)
    run.chmod(0o700)
    text = (ROOT / "tests" / "fixtures" / "status" / "state.json").read_text()
    text = text.replace("@RUN@", str(run)).replace("@KERNEL@", str(tmp_path / "kernel")).replace(
        "@IMAGE@", str(tmp_path / "image"))
    qemu = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(run / "guests" / "a" / "qmp.sock")])
    data = json.loads(text)
    data["guests"]["a"]["pid"] = qemu.pid
    data["owner_pid"] = os.getpid()
    (run / "state.json").write_text(json.dumps(data))
    (run / "guests" / "a" / "console.log").write_text("")
    return qemu


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path (pytest's are long): the lab's table then fits 160 columns, as a
    user's does under ~/.local/state, and is drawn without rich."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="lb", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("args", [["status", "one"], ["status", "one", "--json"]])
def test_status_of_a_lab_that_is_up_loads_no_backend_checker_or_kernel_module(args: list[str], short_tmp: Path) -> None:
    """With a lab up, ``status`` asks whether each QEMU runs from /proc (labctl.backends.guest_alive)
    and shows the resolved lab's interfaces (labctl.lab.ifaces): the QEMU backend, the lab file's
    checker and the kernel's modules stay out (the lab package's face loads each name at its first
    use: labctl.lazyface)."""
    qemu = _lab_up(short_tmp)
    try:
        env = {**os.environ, "LABCTL_STATE_DIR": str(short_tmp / "state"), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
        res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", *args], capture_output=True,
                             text=True, cwd=ROOT, env=env, timeout=120, check=False)
    finally:
        qemu.kill()
        qemu.wait()
    assert res.returncode == 0, res.stderr[-2000:]
    assert "running" in res.stdout and "virtio_net" in res.stdout, res.stdout
    mods = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "labctl.backends.qemu.liveness" in mods and "labctl.lab.ifaces" in mods
    assert heavy(mods, ("paramiko", "rich", "labctl.backends.qemu.machines", "labctl.backends.monitor",
                        "labctl.backends.base", "labctl.lab.checker", "labctl.lab.validate", "labctl.lab.tunnels",
                        "labctl.lab.firewall", "labctl.kernel.requirements", "labctl.kernel.prepare",
                        "labctl.pipeline", "labctl.up", "labctl.live")) == []


def test_down_of_a_lab_that_is_up_loads_no_qmp_client_nor_the_lab_model(short_tmp: Path) -> None:
    """``down`` of a lab that is up stops its QEMU (SIGTERM: it has no writable share) and removes its
    state, without QMP's client (asyncio), the lab file's model or checker, the kernels or the image."""
    qemu = _lab_up(short_tmp)
    try:
        env = {**os.environ, "LABCTL_STATE_DIR": str(short_tmp / "state"), "PYTHONPATH": str(ROOT)}
        res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", "down", "one"], capture_output=True,
                             text=True, cwd=ROOT, env=env, timeout=120, check=False)
        assert qemu.wait(timeout=10) is not None
    finally:
        qemu.kill()
    assert res.returncode == 0, res.stderr[-2000:]
    assert "lab one is down" in res.stdout and not (short_tmp / "state" / "labs" / "one").exists()
    mods = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "labctl.up.teardown" in mods and "labctl.backends.qemu.machines" in mods
    assert heavy(mods, ("paramiko", "asyncio", "qemu.qmp", "labctl.backends.monitor", "labctl.backends.qemu.argv",
                        "labctl.lab.model", "labctl.lab.checker", "labctl.kernel", "labctl.image",
                        "labctl.net.graph", "labctl.pipeline", "labctl.pack")) == []


def test_status_drawn_for_a_terminal_is_richs(short_tmp: Path) -> None:
    """Where rich is told stdout is a terminal (FORCE_COLOR), status draws with rich, and the same
    characters come out as from the plain table (labctl.cli.plaintable), styles aside."""
    qemu = _lab_up(short_tmp)
    try:
        env = {**os.environ, "LABCTL_STATE_DIR": str(short_tmp / "state"), "PYTHONPATH": str(ROOT)}
        env.pop("FORCE_COLOR", None)
        runs = [subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", "status", "one"], capture_output=True,
                               text=True, cwd=ROOT, env={**env, **extra}, timeout=120, check=False)
                for extra in ({}, {"FORCE_COLOR": "1", "COLUMNS": "160"})]
    finally:
        qemu.kill()
        qemu.wait()
    plain, drawn = runs
    assert plain.returncode == drawn.returncode == 0, plain.stderr[-2000:] + drawn.stderr[-2000:]
    loaded = [{ln.split("|")[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")} for r in runs]
    assert "rich" not in loaded[0] and "rich.table" in loaded[1]
    import re

    unstyled = re.sub(r"\x1b\[[0-9;]*m", "", drawn.stdout)
    assert "\x1b[" in drawn.stdout and unstyled == plain.stdout and "virtio_net" in plain.stdout


@pytest.mark.parametrize("args", [["reset", "--help"], ["checkpoint", "--help"]])
def test_reset_and_checkpoint_load_no_paramiko(args: list[str], tmp_path: Path) -> None:
    """A guest restored from its snapshot is waited for by sshd's banner (the agent installed its
    keys): paramiko loads only where a guest is logged in to (shares to mount, a libvirt guest's
    clock), not with the commands' modules (the up and training faces load names when used)."""
    mods = imported(args, tmp_path)
    assert "labctl.cli.restore_cmds" in mods
    assert heavy(mods, ("paramiko", "labctl.ssh", "labctl.up.lifecycle", "labctl.pipeline")) == []
