"""Loading a guest's firewall (labctl.up.nftload): the command writes exactly the script and the lab's
nft file, checks the whole before loading it, and ``load`` turns nft's answer into nothing, lab-file
problems or a guest error. The guest's answer is nft 1.0.6's own (a Debian 12 guest, recorded in
tests/unit/test_firewall.py); the session is a stand-in that records the command."""

from __future__ import annotations

import base64
import re
import shlex
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import pytest

import labctl.up.nftload as nft
from labctl import ssh
from labctl.errors import GuestError, LabFileError
from labctl.lab import Firewall, load_lab
from labctl.ssh import Endpoint, Result
from tests.unit.test_firewall import NFT_OUTPUT

# nft 1.0.6's own answer in a Debian 12 guest to `nft -c -f` of the script of _fw's lab (its rules misspelt)
REFUSED = NFT_OUTPUT.encode()


def _fw(tmp_path: Path) -> Firewall:
    (tmp_path / "r.nft").write_text("table ip z {\n  chain c\n}\n")
    (tmp_path / "lab.yaml").write_text(
        "name: fw\nnetworks: {n: {}}\nguests:\n  r:\n    nics: [{name: eth1, model: e1000, network: n}]\n"
        "    firewall:\n      file: r.nft\n      filter:\n        input:\n          rules:\n"
        "            - tcp dport 22 dropp\n            - meta foo bar\n")
    fw = load_lab(str(tmp_path / "lab.yaml")).guests["r"].firewall
    assert fw is not None and fw.file is not None
    return fw


def _written(cmd: str) -> dict[str, str]:
    """What each ``printf %s B64 | base64 -d > PATH`` of the command writes."""
    return {m.group(2): base64.b64decode(m.group(1)).decode()
            for m in re.finditer(r"printf %s (\S+) \| base64 -d > (\S+)", cmd)}


def test_the_command_writes_the_script_and_the_file_then_checks_before_it_loads(tmp_path: Path) -> None:
    fw = _fw(tmp_path)
    cmd, lines = nft.command(fw)
    steps = cmd.split(" && ")
    assert steps[:4] == ["exec 2>&1", "umask 077", f"rm -rf {nft.DIR}", f"mkdir -p {nft.DIR}"]  # one stream, 0600, nothing stale
    assert steps[-2:] == [f"nft -c -f {nft.MAIN}", f"nft -f {nft.MAIN}"]  # all checked, then all loaded
    written = _written(cmd)
    assert written == {nft.MAIN: fw.script(nft.FILE)[0], nft.FILE: fw.file.text if fw.file else ""}
    assert written[nft.MAIN].startswith(f'include "{nft.FILE}"')
    assert all(shlex.split(s) for s in steps)  # each step one well-formed shell word list
    script = written[nft.MAIN].splitlines()
    assert [script[n - 1].strip() for n, ref in lines.items() if ref.what.startswith("rule")] == [
        "tcp dport 22 dropp", "meta foo bar"]


class _Session:
    """Answers every command with ``answer``; the commands are kept."""

    answer = Result(0, b"", b"", 0.1)
    commands: ClassVar[list[str]] = []

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def run(self, command: str, timeout: float = 60.0) -> Result:
        self.commands.append(command)
        return self.answer


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> type[_Session]:
    _Session.commands = []
    _Session.answer = Result(0, b"", b"", 0.1)
    monkeypatch.setattr(ssh, "Session", _Session)  # nftload imports it when it loads a firewall
    return _Session


def _ep(tmp_path: Path) -> Endpoint:
    return Endpoint("r", 22, tmp_path / "key", tmp_path / "known_hosts")


def test_load_runs_the_command_once_and_a_refused_rule_is_its_lab_line(tmp_path: Path, session: type[_Session]) -> None:
    fw = _fw(tmp_path)
    nft.load(_ep(tmp_path), fw, "lab.yaml")
    assert session.commands == [nft.command(fw)[0]]
    session.answer = Result(1, b"", REFUSED, 0.1)
    with pytest.raises(LabFileError) as exc:
        nft.load(_ep(tmp_path), fw, "lab.yaml")
    assert [str(p) for p in exc.value.problems] == [
        ("lab.yaml:11: guests.r.firewall.filter.input.rules[0]: guest r: nft refused rule 'tcp dport 22 dropp': "
         "syntax error, unexpected newline"),
        ("lab.yaml:12: guests.r.firewall.filter.input.rules[1]: guest r: nft refused rule 'meta foo bar': "
         "syntax error, unexpected foo, known keys are length, protocol"),
        (f"{tmp_path / 'r.nft'}:2: guests.r.firewall.file: guest r: nft refused line 2 of r.nft: "
         "Could not process rule: Operation not supported")]


def test_load_without_a_firewall_does_nothing_and_other_failures_are_the_guests(tmp_path: Path,
                                                                               session: type[_Session]) -> None:
    nft.load(_ep(tmp_path), None, "lab.yaml")
    assert session.commands == []
    session.answer = Result(127, b"", b"sh: 1: nft: not found\n", 0.1)
    with pytest.raises(GuestError) as exc:
        nft.load(_ep(tmp_path), _fw(tmp_path), "lab.yaml")
    assert exc.value.message == "guest r: its firewall could not be loaded (status 127): sh: 1: nft: not found"


def test_a_failure_that_says_nothing_is_asked_once_more(tmp_path: Path, session: type[_Session],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [Result(1, b"", b"", 0.1), Result(1, REFUSED, b"", 0.1)]
    monkeypatch.setattr(_Session, "run", lambda self, command, timeout=60.0: (
        session.commands.append(command), answers.pop(0))[1])
    fw = _fw(tmp_path)
    with pytest.raises(LabFileError) as exc:
        nft.load(_ep(tmp_path), fw, "lab.yaml")
    assert session.commands == [nft.command(fw)[0]] * 2 and answers == []
    assert len(exc.value.problems) == 3  # the second answer's lines (its stdout: exec 2>&1 merged them)
    session.answer = Result(1, b"", b"", 0.1)
    monkeypatch.undo()
    monkeypatch.setattr(ssh, "Session", _Session)
    session.commands = []
    with pytest.raises(GuestError):
        nft.load(_ep(tmp_path), fw, "lab.yaml")
    assert len(session.commands) == 2  # asked twice, never more
