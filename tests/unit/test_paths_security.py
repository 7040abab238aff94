"""Issue 19, items 2, 4, 5 and 9: the directories labctl trusts, the files it writes to
paths a user chose, what ``down`` removes and which processes it stops.

"Another user" is uid 65534 (nobody): directories and links are chowned to it,
and a forked child that drops to it plays that user where a real process is needed.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl import paths, proc
from labctl.errors import UnsafePath

OTHER = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowning to another user needs root")


def _other(path: Path) -> Path:
    os.lchown(path, OTHER, OTHER)
    return path


def as_user(uid: int, fn: Callable[[], Any], env: dict[str, str] | None = None) -> Any:
    """``fn()`` in a forked child running as ``uid`` (its result pickled back; an exception re-raised)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            out: Any = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 - sent back to the parent
            out = ("err", exc)
        with os.fdopen(w, "wb") as f:
            pickle.dump(out, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "err":
        raise value
    return value


# --- checked_dir ------------------------------------------------------------------------------

def test_a_private_test_directory_under_tmp_passes(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    d.mkdir(parents=True)
    assert paths.checked_dir(d) == d
    assert paths.checked_dir(tmp_path / "a" / ".." / "a" / "b") == d


def test_another_users_directory_on_the_way_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "x").mkdir()
    _other(theirs)
    with pytest.raises(UnsafePath, match="belongs to"):
        paths.checked_dir(theirs / "x")
    with pytest.raises(UnsafePath, match="belongs to"):
        paths.checked_dir(theirs)


def test_a_directory_others_may_write_is_refused_unless_sticky_on_the_way(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "mine").mkdir()
    with pytest.raises(UnsafePath, match="writable by other users"):
        paths.checked_dir(open_dir / "mine")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "mine").mkdir()
    assert paths.checked_dir(sticky / "mine") == sticky / "mine"  # like /tmp/x
    with pytest.raises(UnsafePath, match="writable by other users"):
        paths.checked_dir(sticky)  # itself: only for a file written with atomic_write
    assert paths.checked_dir(sticky, shared_ok=True) == sticky
    theirs = sticky / "theirs"
    theirs.mkdir()
    _other(theirs)
    with pytest.raises(UnsafePath, match="belongs to"):
        paths.checked_dir(theirs, shared_ok=True)


def test_another_users_link_is_never_followed_and_ones_own_is(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    link = tmp_path / "link"
    link.symlink_to(victim)
    assert paths.checked_dir(link) == victim  # made by root (or by you): as trusted as a directory
    assert paths.checked_dir(tmp_path / "link" / ".." / "link") == victim
    _other(link)
    with pytest.raises(UnsafePath, match="symbolic link"):
        paths.checked_dir(link)
    with pytest.raises(UnsafePath, match="symbolic link"):
        paths.checked_dir(link / "below", create=True)
    assert not (victim / "below").exists()


def test_create_makes_the_missing_part_and_missing_ok_stops_there(tmp_path: Path) -> None:
    assert paths.checked_dir(tmp_path / "n" / "m", missing_ok=True) == tmp_path / "n" / "m"
    assert not (tmp_path / "n").exists()
    made = paths.checked_dir(tmp_path / "n" / "m", create=True)
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700
    with pytest.raises(FileNotFoundError):
        paths.checked_dir(tmp_path / "nothing")


# --- state_dir, cache_dir, ensure_private_dir -------------------------------------------------

def test_root_never_takes_xdg_runtime_dir_from_the_environment(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    _other(xdg)  # `su` keeps the caller's XDG_RUNTIME_DIR
    monkeypatch.delenv("LABCTL_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert paths.state_dir() == Path("/run/labctl")
    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path / "st"))  # explicit: used (and checked)
    assert paths.state_dir() == tmp_path / "st"


def test_an_explicit_state_directory_of_another_user_is_refused(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _other(theirs)
    monkeypatch.setenv("LABCTL_STATE_DIR", str(theirs / "st"))
    with pytest.raises(UnsafePath):
        paths.state_dir()


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory under /tmp that another user can reach (pytest's own are root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="labctl-sec-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_user_takes_xdg_runtime_dir_only_when_it_is_their_own(open_tmp: Path) -> None:
    tmp_path = open_tmp
    theirs = tmp_path / "root-xdg"
    theirs.mkdir(mode=0o700)  # root's: not the user's own
    own = tmp_path / "own-xdg"
    own.mkdir(mode=0o700)
    _other(own)
    home = tmp_path / "home"
    home.mkdir()
    _other(home)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    assert as_user(OTHER, paths.state_dir, {**env, "XDG_RUNTIME_DIR": str(theirs)}) == \
        home / ".local" / "state" / "labctl"
    assert as_user(OTHER, paths.state_dir, {**env, "XDG_RUNTIME_DIR": str(own)}) == own / "labctl"
    own.chmod(0o777)
    assert as_user(OTHER, paths.state_dir, {**env, "XDG_RUNTIME_DIR": str(own)}) == \
        home / ".local" / "state" / "labctl"
    assert as_user(OTHER, paths.cache_dir, {**env, "XDG_CACHE_HOME": str(theirs)}) == home / ".cache" / "labctl"


def test_ensure_private_dir_never_chmods_through_another_users_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    link = tmp_path / "labs"
    link.symlink_to(victim)
    _other(link)
    with pytest.raises(UnsafePath):
        paths.ensure_private_dir(link)
    assert (victim.stat().st_mode & 0o777) == 0o755


def test_ensure_private_dir_refuses_another_users_directory(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    _other(theirs)
    with pytest.raises(UnsafePath):
        paths.ensure_private_dir(theirs)
    assert (theirs.stat().st_mode & 0o777) == 0o755


# --- atomic_write, create_new -------------------------------------------------------------------

def test_atomic_write_never_writes_through_a_planted_temporary_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    # today's predictable name, .NAME.PID.tmp, planted as a link by whoever can write here
    (out / f".g.svg.{os.getpid()}.tmp").symlink_to(victim)
    paths.atomic_write(out / "g.svg", "<svg/>", 0o640)
    assert victim.read_text() == "precious\n"
    assert (out / "g.svg").read_text() == "<svg/>"
    assert ((out / "g.svg").stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in out.iterdir()) == [f".g.svg.{os.getpid()}.tmp", "g.svg"]


def test_atomic_write_replaces_a_link_at_the_target_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "g.svg").symlink_to(victim)
    paths.atomic_write(tmp_path / "g.svg", "<svg/>")
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "g.svg").is_symlink()


def test_atomic_write_refuses_a_directory_another_user_can_change(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _other(theirs)
    with pytest.raises(UnsafePath):
        paths.atomic_write(theirs / "g.svg", "<svg/>")
    assert list(theirs.iterdir()) == []
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    paths.atomic_write(sticky / "g.svg", "<svg/>")  # /tmp: fine
    assert (sticky / "g.svg").read_text() == "<svg/>"


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        paths.atomic_write(tmp_path / "x", 42)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_create_new_refuses_a_link_and_another_users_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "cap.pcapng").symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        paths.create_new(tmp_path / "cap.pcapng")
    assert victim.read_text() == "precious\n"
    theirs = tmp_path / "theirs.pcapng"
    theirs.write_text("theirs")
    _other(theirs)
    with pytest.raises(UnsafePath):
        paths.create_new(theirs)
    mine = tmp_path / "mine.pcapng"
    mine.write_text("old")
    fd = paths.create_new(mine, 0o600)
    os.write(fd, b"new")
    os.close(fd)
    assert mine.read_text() == "new" and (mine.stat().st_mode & 0o777) == 0o600


# --- remove_tree, the labs root ---------------------------------------------------------------

def test_remove_tree_never_follows_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    parent = tmp_path / "labs"
    parent.mkdir()
    (parent / "lnk").symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        paths.remove_tree(parent, "lnk")
    (parent / "lab").mkdir()
    (parent / "lab" / "inside").symlink_to(victim)
    assert paths.remove_tree(parent, "lab") is True
    assert not (parent / "lab").exists()
    assert (victim / "keep").exists()
    assert paths.remove_tree(parent, "gone") is False
    for bad in ("..", ".", "a/b", ""):
        with pytest.raises(UnsafePath):
            paths.remove_tree(parent, bad)


def test_remove_tree_refuses_another_users_parent_or_directory(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "lab").mkdir()
    _other(theirs)
    with pytest.raises(UnsafePath):
        paths.remove_tree(theirs, "lab")
    assert (theirs / "lab").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "lab").mkdir()
    _other(mine / "lab")
    with pytest.raises(UnsafePath, match="belongs to"):
        paths.remove_tree(mine, "lab")
    assert (mine / "lab").exists()


@pytest.fixture
def victim_labs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A state directory whose ``labs`` is another user's link to a victim directory
    holding directories named like labs: (state dir, victim)."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    for name in ("foo", "bar"):
        (victim / name).mkdir()
        (victim / name / "data").write_text(name)
    state = tmp_path / "st"
    state.mkdir(mode=0o700)
    (state / "labs").symlink_to(victim)
    _other(state / "labs")
    monkeypatch.setenv("LABCTL_STATE_DIR", str(state))
    yield state, victim
    assert sorted(p.name for p in victim.iterdir()) == ["bar", "foo"]
    assert (victim.stat().st_mode & 0o777) == 0o755


def test_status_and_down_refuse_a_labs_root_behind_another_users_link(victim_labs: tuple[Path, Path]) -> None:
    from labctl.state import runstate

    with pytest.raises(UnsafePath):
        runstate.up_labs()
    with pytest.raises(UnsafePath):
        runstate.remove_run_dir(runstate.run_dir("foo"))
    with pytest.raises(UnsafePath), runstate.lab_lock("foo"):
        pass


def test_status_lists_only_the_users_own_real_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.state import runstate

    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path))
    labs = tmp_path / "labs"
    labs.mkdir(mode=0o700)
    (labs / "mine").mkdir()
    (labs / "theirs").mkdir()
    _other(labs / "theirs")
    (labs / "lnk").symlink_to(tmp_path)
    (labs / "file").write_text("")
    assert runstate.up_labs() == ["mine"]
    runstate.remove_run_dir(labs / "mine")
    assert not (labs / "mine").exists()
    with pytest.raises(UnsafePath):
        runstate.remove_run_dir(labs / "theirs")
    assert (labs / "theirs").exists()


# --- handouts ------------------------------------------------------------------------------------

def _state(tmp_path: Path) -> Any:
    from labctl.state.runstate import LabState

    run = tmp_path / "run"
    run.mkdir()
    (run / "id_ed25519").write_text("PRIVATE KEY\n")
    (run / "known_hosts").write_text("")
    return LabState(lab="t@alice", source="t.yaml", dir=str(run), backend="qemu", accel="tcg", image={},
                    started_at="")


def test_a_handout_directory_another_user_made_is_refused(tmp_path: Path) -> None:
    from labctl.training.handout import check_handout_dirs, write_handout

    out = tmp_path / "out"
    out.mkdir()
    alice = out / "alice"
    alice.mkdir(mode=0o755)
    _other(alice)
    (alice / ".id_ed25519.99.tmp").symlink_to(tmp_path / "stolen")
    with pytest.raises(UnsafePath):
        check_handout_dirs(out, ["alice", "bob"])
    with pytest.raises(UnsafePath):
        write_handout(_state(tmp_path), "alice", alice, [])
    assert not (tmp_path / "stolen").exists()
    assert sorted(p.name for p in alice.iterdir()) == [".id_ed25519.99.tmp"]


def test_a_handout_under_another_users_out_directory_is_refused(tmp_path: Path) -> None:
    from labctl.training.handout import check_handout_dirs, write_handout

    out = tmp_path / "out"
    out.mkdir()
    _other(out)
    with pytest.raises(UnsafePath):
        check_handout_dirs(out, ["alice"])
    with pytest.raises(UnsafePath):
        write_handout(_state(tmp_path), "alice", out / "alice", [])
    assert not (out / "alice").exists()


def test_a_handout_is_private_and_complete(tmp_path: Path) -> None:
    from labctl.training.handout import check_handout_dirs, write_handout

    out = tmp_path / "out"
    check_handout_dirs(out, ["alice"])
    config = write_handout(_state(tmp_path), "alice", out / "alice", [])
    d = config.parent
    assert (d.stat().st_mode & 0o777) == 0o700
    assert ((d / "id_ed25519").stat().st_mode & 0o777) == 0o600
    assert (d / "id_ed25519").read_text() == "PRIVATE KEY\n"
    assert sorted(p.name for p in d.iterdir()) == ["README.md", "id_ed25519", "known_hosts", "ssh_config"]


# --- pids_referencing, stop_pid -----------------------------------------------------------------

@pytest.fixture
def sleepers(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, uid: int | None = None) -> subprocess.Popen[bytes]:
        def drop() -> None:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *args],
                             preexec_fn=drop, start_new_session=True)  # noqa: PLW1509 - the test's own child
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def _wait_cmdline(p: subprocess.Popen[bytes], needle: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(needle in a for a in proc.pid_cmdline(p.pid)):
            return
        time.sleep(0.02)
    raise AssertionError(f"{p.pid} never showed {needle}")


def test_pids_referencing_matches_whole_paths_and_only_the_users_processes(
        tmp_path: Path, sleepers: Callable[..., subprocess.Popen[bytes]]) -> None:
    run = tmp_path / "st" / "labs" / "foo"
    mine = [sleepers(str(run)),
            sleepers("-chardev", f"socket,id=qmp,path={run}/guests/a/qmp.sock,server=on,wait=off"),
            sleepers("-pidfile", f"{run}/guests/a/qemu.pid"),
            sleepers(f"--lab={run}"),
            # root's switch for a libvirt lab runs as the guests' QEMU user, as its --user says
            sleepers("labctl.net.switch", f"{run}/net/n0-switch.sock", "--user", f"{OTHER}:{OTHER}", uid=OTHER)]
    others = [sleepers(f"/x{run}/guests/a/qmp.sock"),              # another state directory containing this path
              sleepers(f"path=/x{run}/guests/a/qmp.sock"),
              sleepers(f"{tmp_path}/st2/labs/foo/guests/a/qmp.sock"),
              sleepers(f"{tmp_path}/st/labs/foobar/guests/a/qmp.sock"),  # lab foobar
              sleepers(f"{run}/guests/a/qmp.sock", uid=OTHER),   # another user's
              sleepers("labctl.net.switch", f"{run}/net/n0-switch.sock", "--user", "1:1", uid=OTHER)]  # not as said
    for p in mine + others:
        _wait_cmdline(p, "time.sleep")
    time.sleep(0.2)  # the dropped child's exec
    assert proc.pids_referencing(run) == sorted(p.pid for p in mine)
    proc.stop_pid(others[-2].pid, marker=f"{run}/guests/a/qmp.sock", grace=0.5)
    proc.stop_pid(others[1].pid, marker=f"{run}/guests/a/qmp.sock", grace=0.5)
    assert others[-2].poll() is None and others[1].poll() is None
    proc.stop_pid(mine[1].pid, marker=f"{run}/guests/a/qmp.sock", grace=0.5)
    assert mine[1].wait(timeout=10) is not None


def test_capture_w_never_writes_through_a_link(tmp_path: Path) -> None:
    import argparse

    from labctl.cli.capture_cmd import _output

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "cap.pcapng").symlink_to(victim)
    with pytest.raises(UnsafePath):
        _output(argparse.Namespace(write=str(tmp_path / "cap.pcapng")))
    assert victim.read_text() == "precious\n"
    f, close = _output(argparse.Namespace(write=str(tmp_path / "new.pcapng")))
    assert f is not None
    f.write(b"x")
    close()
    assert (tmp_path / "new.pcapng").read_bytes() == b"x"


def test_archive_never_writes_through_a_planted_part_file(tmp_path: Path) -> None:
    from labctl.bundle.archive import pack

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".a.tar.gz.part").symlink_to(victim)  # the temporary name pack used before
    try:
        dest = pack(run, out / "a.tar.gz")
    except Exception as exc:  # noqa: BLE001 - a bundle check stricter than this stand-in: the link is what matters
        pytest.skip(f"stand-in bundle refused: {exc}")
    assert victim.read_text() == "precious\n"
    assert dest == out / "a.tar.gz" and dest.stat().st_size > 0
    assert sorted(p.name for p in out.iterdir()) == [".a.tar.gz.part", "a.tar.gz"]


def test_build_into_replaces_the_directory_whole_or_not_at_all(tmp_path: Path) -> None:
    from labctl.paths import build_into

    final = tmp_path / "thing"
    final.mkdir()
    (final / "old").write_text("1")
    with pytest.raises(RuntimeError), build_into(final) as work:
        (work / "new").write_text("2")
        raise RuntimeError("half way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]  # no work directory left
    assert [p.name for p in final.iterdir()] == ["old"]
    with build_into(final) as work:
        assert work.parent == tmp_path and work.stat().st_mode & 0o777 == 0o700
        (work / "new").write_text("2")
    assert [p.name for p in final.iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]


def test_in_dir_names_a_file_of_the_record_directory_and_cannot_be_set(tmp_path: Path) -> None:
    from dataclasses import dataclass

    @dataclass
    class Rec:
        dir: Path
        console = paths.InDir("console.log")

    rec = Rec(tmp_path)
    assert rec.console == tmp_path / "console.log"
    assert isinstance(Rec.console, paths.InDir)
    with pytest.raises(AttributeError):
        rec.console = tmp_path / "other"
    assert rec.console == tmp_path / "console.log"
