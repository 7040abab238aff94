"""Training features without guests: rosters, ssh configs, check results, the class record."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from labctl import grading
from labctl.errors import EXIT_CHECKS_FAILED, GuestError, LabFileError, LabStateError, UsageError
from labctl.grading import CheckResult
from labctl.lab.model import Check
from labctl.ssh import Endpoint
from labctl.state.runstate import LabState
from labctl.training import classroom, handout
from labctl.training.classroom import ClassRecord, parse_roster
from tests.conftest import ROOT


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path / "st"))
    return tmp_path / "st"


# --- roster -------------------------------------------------------------------------------------

def test_roster_ignores_blank_lines_and_comments() -> None:
    text = "# class of May\nalice\n\n  bob   # late\n#carol\ndave-2\n"
    assert parse_roster(text, "r.txt") == ["alice", "bob", "dave-2"]


def test_roster_refuses_bad_names_and_duplicates_with_their_lines() -> None:
    text = "alice\nBob\n\nalice\n../x\nthis-name-is-far-too-long-for-an-instance-name\n"
    with pytest.raises(LabFileError) as exc:
        parse_roster(text, "r.txt")
    got = [str(p) for p in exc.value.problems]
    assert got[0].startswith("r.txt:2: invalid student name 'Bob'")
    assert got[1] == "r.txt:4: duplicate student 'alice' (first at line 1)"
    assert got[2].startswith("r.txt:5: invalid student name '../x'")
    assert got[3].startswith("r.txt:6: invalid student name")
    assert exc.value.exit_code == 2


def test_empty_roster_is_refused() -> None:
    with pytest.raises(LabFileError, match="no students"):
        parse_roster("# nobody\n\n", "r.txt")


def test_roster_that_cannot_be_read_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        classroom.read_roster(tmp_path / "missing.txt")


# --- ssh config ---------------------------------------------------------------------------------

def test_ssh_config_blocks_quote_paths_and_escape_tokens(tmp_path: Path) -> None:
    d = tmp_path / "my handouts" / "100%"
    ep = Endpoint("a", 40001, d / "id_ed25519", d / "known_hosts")
    text = handout.render([handout.HostEntry("s-a", ep)], "lab x")
    block = text.split("Host s-a\n", 1)[1]
    assert "    HostName 127.0.0.1\n    Port 40001\n    User root\n" in block
    assert f'    IdentityFile "{tmp_path}/my handouts/100%%/id_ed25519"\n' in block
    assert f'    UserKnownHostsFile "{tmp_path}/my handouts/100%%/known_hosts"\n' in block
    for line in ("IdentitiesOnly yes", "StrictHostKeyChecking yes", "LogLevel ERROR",
                 "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org"):
        assert f"    {line}\n" in block


def test_ssh_config_refuses_paths_openssh_cannot_take(tmp_path: Path) -> None:
    ep = Endpoint("a", 1, tmp_path / 'a"b', tmp_path / "kh")
    with pytest.raises(GuestError):
        handout.render([handout.HostEntry("a", ep)], "lab x")


@pytest.mark.parametrize("prefix", ["a b", "x*", "!", 'q"', "a\nHost *"])
def test_alias_prefix_rule(prefix: str) -> None:
    with pytest.raises(UsageError):
        handout.check_alias_prefix(prefix)
    assert handout.check_alias_prefix("class1.alice-") == "class1.alice-"


def _state(tmp_path: Path) -> LabState:
    from labctl.backends.base import GuestRecord

    run = tmp_path / "run"
    run.mkdir()
    (run / "id_ed25519").write_text("KEY\n")
    (run / "known_hosts").write_text("[127.0.0.1]:40001 ssh-ed25519 AAAA\n")
    recs = {g: GuestRecord.from_dict({"name": g, "dir": str(run / g), "pid": 1, "ssh_port": port, "qmp": "",
                                      "console": "", "argv": [], "accel": "tcg", "backend": "qemu"})
            for g, port in (("a", 40001), ("b", 40002))}
    resolved = {"name": "rp", "description": "an <exercise> [bold]x[/bold]",
                "guests": {"a": {"nics": [{"name": "eth1", "ip": "10.80.0.1/24", "network": "link"}]},
                           "b": {"nics": [{"name": "eth1", "ip": "10.80.0.2/24", "network": "link"}]}},
                "checks": [{"name": "pings", "guest": "a", "command": "ping -c1 x", "hint": "look at nstat",
                            "timeout": 20},
                           {"name": "answer", "guest": "b", "command": "true", "hint": "", "timeout": 30.0}]}
    return LabState("rp@alice", "rp.yaml", str(run), "qemu", "tcg", {}, "now", guests=recs, resolved=resolved)


def test_handout_is_self_contained(tmp_path: Path) -> None:
    state = _state(tmp_path)
    config = handout.write_handout(state, "alice", tmp_path / "out" / "alice", grading.checks_of(state))
    d = config.parent
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d / "id_ed25519").st_mode) == 0o600
    assert (d / "id_ed25519").read_text() == "KEY\n"
    assert (d / "known_hosts").read_text().startswith("[127.0.0.1]:40001 ")
    text = config.read_text()
    assert f'IdentityFile "{d}/id_ed25519"' in text and f'UserKnownHostsFile "{d}/known_hosts"' in text
    assert str(state.path) not in text  # nothing points back into the lab's run directory
    assert "Host a\n" in text and "Host b\n" in text and "Port 40002" in text
    readme = (d / "README.md").read_text()
    assert "ssh -F ssh_config a" in readme and "10.80.0.2/24" in readme
    assert "**pings** (on a): look at nstat" in readme
    assert "ping -c1 x" not in readme  # the checks' commands are not handed out


def test_handout_refuses_a_symlinked_directory(tmp_path: Path) -> None:
    state = _state(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "alice").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError):
        handout.write_handout(state, "alice", tmp_path / "alice", ())


# --- check results ------------------------------------------------------------------------------

def test_checks_are_rebuilt_from_the_saved_lab(tmp_path: Path) -> None:
    checks = grading.checks_of(_state(tmp_path))
    assert checks == (Check("pings", "a", "ping -c1 x", "look at nstat", 20.0),
                      Check("answer", "b", "true", "", 30.0))
    (tmp_path / "x").mkdir()
    bad = _state(tmp_path / "x")
    bad.resolved["checks"] = [{"guest": "a"}]
    with pytest.raises(LabStateError):
        grading.checks_of(bad)


def test_guest_command_is_bounded_and_quoted() -> None:
    cmd = grading.guest_command(Check("c", "a", "grep -q 'x y' /root/answer; echo $?", timeout=20.0))
    assert cmd == "timeout -k 2 20 sh -c 'grep -q '\"'\"'x y'\"'\"' /root/answer; echo $?'"


def test_result_summaries_and_json() -> None:
    rs = [CheckResult("a", "g", "pass", "h1", 0, 1.234),
          CheckResult("b", "g", "fail", "h2", 1, 2.0, "out"),
          CheckResult("c", "g", "timeout", "h3", 124, 20.4),
          CheckResult("d", "h", "error", "h4", None, 0.1, "cannot SSH to guest h")]
    assert [r.summary() for r in rs] == ["pass", "fail (exit 1)", "timeout (20 s)", "error: cannot SSH to guest h"]
    assert grading.summary(rs) == {"passed": 1, "total": 4, "failing": ["b", "c", "d"]}
    d = rs[1].to_dict()
    assert d == {"name": "b", "guest": "g", "status": "fail", "passed": False, "exit_status": 1, "seconds": 2.0,
                 "hint": "h2", "detail": "out"}
    json.dumps([r.to_dict() for r in rs])


def test_table_shows_hints_only_for_failures_and_never_markup() -> None:
    from rich.console import Console

    from labctl.cli.check_cmd import results_table

    rs = [CheckResult("ok-one", "a", "pass", "SECRET-HINT", 0),
          CheckResult("[bold]x[/bold]", "b", "fail", "see [red]nstat[/red]", 1)]
    console = Console(width=200, record=True, markup=False)
    console.print(results_table("lab x", rs))
    text = console.export_text()
    assert "SECRET-HINT" not in text
    assert "[bold]x[/bold]" in text and "see [red]nstat[/red]" in text
    assert EXIT_CHECKS_FAILED == 6


# --- class record -------------------------------------------------------------------------------

def test_class_record_round_trip_and_one_class_per_lab(state_dir: Path) -> None:
    rec = ClassRecord("rp", "/labs/rp.yaml", ["alice", "bob"], "/tmp/handouts",
                      checks=[{"name": "pings", "guest": "a", "hint": ""}])
    rec.create()
    path = state_dir / "classes" / "rp.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    got = ClassRecord.load("rp")
    assert got.students == ["alice", "bob"] and got.ident("bob") == "rp@bob"
    assert got.handout("alice") == Path("/tmp/handouts/alice") and got.created_at
    with pytest.raises(LabStateError, match="already has a class"):
        ClassRecord("rp", "", ["x"], "").create()
    with pytest.raises(LabStateError, match="already has a class"):
        ClassRecord.refuse_if_exists("rp")
    assert classroom.find_class(None).lab == "rp"
    ClassRecord("other", "", ["x"], "").create()
    with pytest.raises(UsageError, match="--lab"):
        classroom.find_class(None)
    with pytest.raises(UsageError, match="no student 'carol'"):
        classroom.check_student(got, "carol")
    got.remove()
    with pytest.raises(LabStateError, match="no class"):
        ClassRecord.load("rp")
    with pytest.raises(UsageError):
        ClassRecord.load("../etc")


def test_students_of_a_class_that_is_not_up_are_down(state_dir: Path) -> None:
    rec = ClassRecord("rp", "", ["alice"], "/tmp/h")
    row = classroom.student_status(rec, "alice")
    assert row["state"] == "down" and row["guests"] == {}


def test_class_up_refuses_a_bad_roster_before_anything_starts(tmp_path: Path, state_dir: Path) -> None:
    from labctl.cli.main import main

    roster = tmp_path / "students.txt"
    roster.write_text("alice\nbob smith\n")
    rc = main(["class", "up", str(ROOT / "labs" / "training-rp-filter.yaml"), "--roster", str(roster),
               "--out", str(tmp_path / "h")])
    assert rc == 2
    assert not (tmp_path / "h").exists() and not (state_dir / "classes").exists()


def test_class_reset_calls_up_reset(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.cli import class_cmd
    from labctl.cli.main import main

    ClassRecord("rp", "", ["alice"], "/tmp/h").create()
    calls = []
    monkeypatch.setattr(class_cmd, "reset", lambda lab, guests, on_moved=None: calls.append((lab, guests)) or {"b": 0.4})
    assert main(["class", "reset", "alice", "b"]) == 0
    assert main(["class", "reset", "alice"]) == 0
    assert calls == [("rp@alice", ["b"]), ("rp@alice", None)]
    assert main(["class", "reset", "mallory"]) == 2
