"""``labctl cp``: which side is the guest, sizes, where a copy lands, what a host tree sends."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

import labctl.steps.transfer as xfer
from labctl.cli.main import build_parser
from labctl.errors import UnsafePath, UsageError
from labctl.steps.transfer import Copied, guest_spec, parse_size, plan


@pytest.mark.parametrize("word, spec", [
    ("a:/root/x", ("a", "/root/x")),
    ("client-2:rel/path", ("client-2", "rel/path")),
    ("a:", ("a", "")),
    ("a:/x:y", ("a", "/x:y")),
    ("./a:b", None), ("/tmp/a:b", None), ("out", None), ("A:/x", None), ("1a:/x", None),
    ("a/b:c", None), ("x" * 32 + ":/y", None),
])
def test_guest_spec(word: str, spec: tuple[str, str] | None) -> None:
    assert guest_spec(word) == spec


def test_the_guest_side_gives_the_direction() -> None:
    assert plan("a:/var/log", "logs") == xfer.Plan("a", "/var/log", "logs", to_guest=False)
    assert plan("./tests", "b:/root/") == xfer.Plan("b", "/root/", "./tests", to_guest=True)


@pytest.mark.parametrize("src, dest, what", [
    ("a:/x", "b:/y", "both"), ("x", "y", "neither"), ("a:", "out", "empty guest path"),
    ("a:/x\n", "out", "control"), ("a:/x", "o\x1bt", "control"),
])
def test_bad_pairs_are_usage_errors(src: str, dest: str, what: str) -> None:
    with pytest.raises(UsageError, match=what):
        plan(src, dest)


@pytest.mark.parametrize("text, n", [("4G", 4 << 30), ("512M", 512 << 20), ("100k", 100 << 10), ("1.5GiB", 3 << 29),
                                     ("123", 123), ("2mb", 2 << 20), ("1T", 1 << 40)])
def test_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "0", "G", "-1M", "4X", "1.2.3"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size(text)


def test_the_command_line() -> None:
    args = build_parser().parse_args(["cp", "lab@bob", "a:/x", "out", "--max-size", "1G", "--json"])
    assert (args.lab, args.src, args.dest, args.max_size, args.json) == ("lab@bob", "a:/x", "out", "1G", True)
    assert args.timeout == xfer.DEFAULT_TIMEOUT
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cp", "lab", "a:/x"])


def test_cmd_cp_checks_its_words_before_the_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.cli import cp_cmd

    monkeypatch.setattr(cp_cmd.LabState, "load", lambda lab: pytest.fail("the lab was loaded"))
    for argv in (["cp", "lab", "x", "y"], ["cp", "lab", "a:/x", "y", "--max-size", "lots"],
                 ["cp", "lab", "a:/x", "y", "--timeout", "0"], ["cp", "../x", "a:/x", "y"]):
        args = build_parser().parse_args(argv)
        with pytest.raises(UsageError):
            args.func(args)


def test_host_target_into_a_directory_or_as_a_new_path(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    assert xfer._host_target(str(d), "/var/log/", "/var/log") == (d, "log")
    assert xfer._host_target(str(d / "new"), "/var/log", "/var/log") == (d, "new")
    assert xfer._host_target(str(d), "/root/link", "/etc/real") == (d, "link")
    (d / "log").mkdir()
    with pytest.raises(UsageError, match="never overwrites"):
        xfer._host_target(str(d), "/var/log", "/var/log")
    (d / "dangling").symlink_to("/nonexistent")
    with pytest.raises(UsageError, match="never overwrites"):
        xfer._host_target(str(d / "dangling"), "/x", "/x")
    with pytest.raises(UsageError, match="no such directory"):
        xfer._host_target(str(tmp_path / "missing" / "x"), "/x", "/x")


def test_host_target_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(UnsafePath, match="writable by other users"):
        xfer._host_target(str(d), "/x", "/x")


def test_a_host_tree_sends_links_as_links_and_skips_fifos(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"12345")
    (src / "ln").symlink_to("/etc/passwd")
    (src / "dirlink").symlink_to("/etc")
    os.mkfifo(src / "p")
    copied = Copied()
    entries, total = xfer._walk_local(str(src), "src", copied)
    assert total == 5
    assert sorted(e.arcname for e in entries) == ["src", "src/d", "src/d/f", "src/dirlink", "src/ln"]
    assert copied.skipped == [("src/p", "a FIFO")]


class _FakeSession:
    """Answers the probe and keeps what ``feed`` is given."""

    class ep:
        guest = "a"

    def __init__(self, kind: str) -> None:
        self.kind, self.fed, self.command = kind, io.BytesIO(), ""

    def run(self, command: str, timeout: float) -> object:
        from labctl.ssh import Result

        return Result(0, self.kind.encode() + b"\n", b"", 0.0)

    def feed(self, command: str, timeout: float):  # type: ignore[no-untyped-def]
        import contextlib

        self.command = command

        @contextlib.contextmanager
        def cm():  # type: ignore[no-untyped-def]
            yield self.fed
        return cm()


def test_to_guest_streams_a_tar_that_follows_no_link(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"data")
    (src / "ln").symlink_to("/etc/passwd")
    s = _FakeSession("d")
    got = xfer.to_guest(s, str(src), "/root")  # type: ignore[arg-type]
    assert (got.target, got.files, got.bytes, got.skipped) == ("/root/src", 1, 4, [])
    assert s.command.startswith("tar -x --no-same-owner") and "-C /root" in s.command
    with tarfile.open(fileobj=io.BytesIO(s.fed.getvalue())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"src", "src/d", "src/d/f", "src/ln"}
    assert members["src/ln"].issym() and members["src/ln"].linkname == "/etc/passwd"
    assert members["src/d/f"].uid == 0 and members["src/d/f"].uname == ""


def test_to_guest_as_a_new_name_and_its_refusals(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"x" * 2048)
    s = _FakeSession("p")
    assert xfer.to_guest(s, str(f), "/root/renamed").target == "/root/renamed"  # type: ignore[arg-type]
    with tarfile.open(fileobj=io.BytesIO(s.fed.getvalue())) as tar:
        assert tar.getnames() == ["renamed"]
    with pytest.raises(UsageError, match="no such directory"):
        xfer.to_guest(_FakeSession("n"), str(f), "/nope/x")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not a directory"):
        xfer.to_guest(_FakeSession("f"), str(tmp_path), "/etc/passwd")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="over the copy budget"):
        xfer.to_guest(_FakeSession("d"), str(f), "/root", budget=1024)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="No such file"):
        xfer.to_guest(_FakeSession("d"), str(tmp_path / "missing"), "/root")  # type: ignore[arg-type]


def test_the_progress_display_counts_what_goes_through() -> None:
    from labctl.cli import cp_cmd

    with cp_cmd._progress(False, "x", 10) as none:
        assert none is None
    with cp_cmd._progress(True, "to a", 100) as advance:
        assert advance is not None
        advance(60)
        advance(40)
    seen: list[int] = []
    counted = xfer._Counted(io.BytesIO(b"abcdef"), seen.append)
    assert counted.read(4) == b"abcd" and counted.read() == b"ef" and counted.read() == b""
    assert seen == [4, 2] and counted.count == 6


def test_a_stream_far_over_the_budget_fails_the_copy() -> None:
    from labctl.errors import GuestError

    limit = xfer.stream_limit(1 << 20)
    assert limit == (2 << 20) + (64 << 20)
    counted = xfer._Counted(io.BytesIO(b"x" * (limit + 1)), None, limit)
    counted.read(limit)
    with pytest.raises(GuestError, match="nothing was copied"):
        counted.read(1)
