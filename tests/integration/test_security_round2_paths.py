"""Issue 19, items 2, 4, 5 and 9, reproduced with a real second user.

A throwaway system user (``labctl-evil-NNNN``, made by ``useradd`` and removed
by ``userdel`` after) plants what it can in directories it owns; root runs
labctl as a trainer or an engineer would:

* its ``XDG_RUNTIME_DIR``, passed on by ``su``, with ``labctl/labs`` a link to
  a victim directory: root's ``down NAME``, ``down --all`` and ``status`` must
  neither remove nor chmod anything there (item 2);
* a student's handout directory made in advance by that user (item 4);
* a link at the temporary name of ``graph -o`` in its directory (item 5);
* processes that name a lab's run directory: one of that user's, and one of
  root's naming another state directory whose path contains this one's: ``down``
  stops neither (item 9).
"""

from __future__ import annotations

import os
import pwd
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, Cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a second user is made")


@pytest.fixture
def evil() -> Iterator[pwd.struct_passwd]:
    """A throwaway system user, removed after the test."""
    name = f"labctl-evil-{random.randrange(10000, 99999)}"
    subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory like /tmp (1777) where the second user can make things (pytest's own are root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="labctl-r2-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


# Plays the other user who predicts labctl's pid: a link of theirs at DIR/NAME (NAME's {pid}
# filled in with this process's, which the labctl run in it keeps) to TARGET, then labctl ARGS.
_PLANT_AND_RUN = """
import os, runpy, sys
d, name, target, uid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tmp = os.path.join(d, name.format(pid=os.getpid()))
os.symlink(target, tmp)
os.lchown(tmp, uid, uid)
sys.argv = ["labctl", *sys.argv[5:]]
runpy.run_module("labctl", run_name="__main__")
"""


def as_evil(user: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(["runuser", "-u", user.pw_name, "--", *argv], check=True, cwd="/")


def labctl(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _tree(d: Path) -> dict[str, tuple[int, str]]:
    """Everything under ``d``: relative path -> (mode, content or '')."""
    found = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        found[str(p.relative_to(d))] = (st.st_mode, p.read_text() if p.is_file() else "")
    found["."] = (d.lstat().st_mode, "")
    return found


def test_another_users_xdg_runtime_dir_does_not_steer_roots_down_or_status(
        evil: pwd.struct_passwd, shared_tmp: Path) -> None:
    victim = shared_tmp / "victim"  # root's: say /etc or /srv/data
    victim.mkdir(mode=0o755)
    for name in ("victimlab", "otherlab"):
        (victim / name).mkdir()
        (victim / name / "precious").write_text(name)
    before = _tree(victim)
    xdg = shared_tmp / "xdg"
    as_evil(evil, "mkdir", "-m", "700", str(xdg))
    as_evil(evil, "mkdir", str(xdg / "labctl"))
    as_evil(evil, "ln", "-s", str(victim), str(xdg / "labctl" / "labs"))
    env = {k: v for k, v in os.environ.items() if k != "LABCTL_STATE_DIR"}
    env["XDG_RUNTIME_DIR"] = str(xdg)  # what `su` leaves to root

    lock = Path("/run/labctl/labs/.victimlab.lock")  # root's down takes the lab's lock in /run/labctl
    lock_was_there = lock.exists()
    down = labctl("down", "victimlab", env=env)
    if not lock_was_there:
        lock.unlink(missing_ok=True)
    status = labctl("status", "--json", env=env)
    assert _tree(victim) == before, down.stdout + down.stderr
    for res in (down, status):
        assert "Traceback" not in res.stderr, res.stderr
        assert "victimlab" not in res.stdout and "otherlab" not in res.stdout, res.stdout
    assert down.returncode != 0  # no lab of root's by that name
    root_labs = Path("/run/labctl/labs")
    if not root_labs.is_dir() or not any(root_labs.iterdir()):  # never take a real lab of root's down
        down_all = labctl("down", "--all", env=env)
        assert "Traceback" not in down_all.stderr, down_all.stderr
        assert _tree(victim) == before, down_all.stdout + down_all.stderr
    assert sorted(os.listdir(xdg / "labctl")) == ["labs"]


def test_an_explicit_state_dir_behind_another_users_link_is_refused_clearly(
        evil: pwd.struct_passwd, shared_tmp: Path) -> None:
    victim = shared_tmp / "victim"
    victim.mkdir(mode=0o755)
    (victim / "victimlab").mkdir()
    before = _tree(victim)
    theirs = shared_tmp / "theirs"
    as_evil(evil, "mkdir", "-m", "755", str(theirs))
    as_evil(evil, "ln", "-s", str(victim), str(theirs / "labs"))
    env = dict(os.environ, LABCTL_STATE_DIR=str(theirs))
    env.pop("XDG_RUNTIME_DIR", None)
    for args in (("down", "victimlab"), ("status",), ("down", "--all")):
        res = labctl(*args, env=env)
        assert res.returncode == 3, (args, res.stdout, res.stderr)
        assert "refusing" in res.stderr and "belongs to" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert _tree(victim) == before


def test_a_handout_directory_made_by_another_user_is_refused_before_anything_starts(
        evil: pwd.struct_passwd, shared_tmp: Path, cli: Cli) -> None:
    roster = shared_tmp / "roster.txt"
    roster.write_text("alice\n")
    out = shared_tmp / "handouts"  # the trainer's --out: a shared, sticky place like /tmp
    out.mkdir()
    out.chmod(0o1777)
    alice = out / "alice"
    as_evil(evil, "mkdir", "-m", "777", str(alice))
    as_evil(evil, "touch", str(alice / "stolen"))
    started = time.monotonic()
    # the link goes where today's atomic_write puts alice's key first: .id_ed25519.PID.tmp
    res = subprocess.run([sys.executable, "-c", _PLANT_AND_RUN, str(alice), ".id_ed25519.{pid}.tmp",
                          str(alice / "stolen"), str(evil.pw_uid),
                          "class", "up", str(ROOT / "labs" / "training-rp-filter.yaml"), "--roster", str(roster),
                          "--out", str(out), "--accel", "tcg"],
                         cwd=ROOT, env=cli.env, capture_output=True, text=True, timeout=1800, check=False)
    assert (alice / "stolen").read_bytes() == b"", "alice's private key went to the other user's file"
    assert res.returncode == 3, res.stdout + res.stderr
    assert "refusing" in res.stderr and str(alice) in res.stderr and "Traceback" not in res.stderr
    assert time.monotonic() - started < 60  # before any guest boots
    assert cli("class", "status").returncode != 0  # no class was recorded


def test_a_handout_out_directory_of_another_users_is_refused(evil: pwd.struct_passwd, shared_tmp: Path,
                                                            cli: Cli) -> None:
    roster = shared_tmp / "roster.txt"
    roster.write_text("alice\n")
    out = shared_tmp / "handouts"
    as_evil(evil, "mkdir", "-m", "755", str(out))  # --out DIR made in advance by the other user
    res = cli("class", "up", str(ROOT / "labs" / "training-rp-filter.yaml"), "--roster", str(roster),
              "--out", str(out), "--accel", "tcg", timeout=1200)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "belongs to" in res.stderr and "Traceback" not in res.stderr
    assert list(out.iterdir()) == []




def test_graph_output_never_writes_through_a_link_in_another_users_directory(
        evil: pwd.struct_passwd, shared_tmp: Path) -> None:
    victim = shared_tmp / "victim"  # a file of root's the other user wants clobbered
    victim.write_text("root's\n")
    d = shared_tmp / "outdir"
    as_evil(evil, "mkdir", "-m", "777", str(d))
    res = subprocess.run([sys.executable, "-c", _PLANT_AND_RUN, str(d), ".g.svg.{pid}.tmp", str(victim),
                          str(evil.pw_uid), "graph", str(ROOT / "labs" / "quickstart.yaml"), "-o", str(d / "g.svg")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert victim.read_text() == "root's\n", res.stdout + res.stderr
    assert res.returncode == 3 and "refusing" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (d / "g.svg").exists()


def test_graph_output_into_a_private_directory_or_tmp_still_works(shared_tmp: Path) -> None:
    for d in (shared_tmp, Path("/tmp")):
        out = Path(tempfile.mktemp(suffix=".svg", dir=d))
        try:
            res = subprocess.run([sys.executable, "-m", "labctl", "graph", str(ROOT / "labs" / "quickstart.yaml"),
                                  "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
            assert res.returncode == 0, res.stderr
            assert out.read_text().lstrip().startswith("<")
            assert (out.stat().st_mode & 0o777) == 0o644
        finally:
            out.unlink(missing_ok=True)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _sleeper(started: list[subprocess.Popen[bytes]], arg: str, uid: int | None = None) -> subprocess.Popen[bytes]:
    def drop() -> None:
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", arg], cwd="/",
                         preexec_fn=drop, start_new_session=True)  # noqa: PLW1509 - the test's own child
    started.append(p)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if arg in Path(f"/proc/{p.pid}/cmdline").read_text():
                return p
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"{p.pid} never named {arg}")


def test_down_stops_only_its_own_processes_that_name_its_run_directory(
        evil: pwd.struct_passwd, sleepers: list[subprocess.Popen[bytes]], cli: Cli) -> None:
    run = cli.state_dir / "labs" / "foo"  # a lab whose up was killed: no state, just its directory
    (run / "guests" / "a").mkdir(parents=True)
    cli.state_dir.chmod(0o700)
    (cli.state_dir / "labs").chmod(0o700)
    qmp = run / "guests" / "a" / "qmp.sock"
    ours = _sleeper(sleepers, f"socket,id=qmp,path={qmp},server=on")
    elsewhere = _sleeper(sleepers, f"socket,id=qmp,path=/srv{qmp},server=on")  # /srv + this state dir's path
    foobar = _sleeper(sleepers, f"{cli.state_dir}/labs/foobar/guests/a/qmp.sock")
    theirs = _sleeper(sleepers, f"socket,id=qmp,path={qmp},server=on", uid=evil.pw_uid)
    res = cli("down", "foo")
    assert res.returncode == 0, res.stdout + res.stderr
    assert ours.wait(timeout=15) is not None
    for p in (elsewhere, foobar, theirs):
        assert p.poll() is None, f"down foo stopped {Path(f'/proc/{p.pid}/cmdline').read_text()!r}"
    assert not run.exists()
