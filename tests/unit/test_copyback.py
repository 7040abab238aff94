"""Copy-back from a hostile guest: every file stays inside the bundle."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from labctl.steps.copyback import extract, safe_parts


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "a/\x1bb", "", ".", "a/" * 40 + "f",
                                  "x" * 300])
def test_names_outside_or_odd_are_refused(name: str) -> None:
    assert safe_parts(name) is None


def test_plain_names() -> None:
    assert safe_parts("./perf.data") == ("perf.data",)
    assert safe_parts("stats/before/nstat.txt") == ("stats", "before", "nstat.txt")
    assert safe_parts("..hidden") == ("..hidden",)


def test_a_hostile_stream_leaves_the_host_untouched(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("original")
    dest = tmp_path / "bundle" / "steps" / "s" / "_" / "a"
    dest.mkdir(parents=True)
    here = tarfile.TarInfo(".")
    here.type = tarfile.DIRTYPE
    stream = _tar([
        (here, None),                                               # the step directory itself: no warning
        _file("perf.data", b"PERFDATA"),
        _file("stats/before/nstat.txt", b"IpInReceives 1\n"),
        _file(f"{outside}/abs", b"x"),                              # absolute name
        _file("../../../../outside/rel", b"x"),                     # climbing out
        _special("link", tarfile.SYMTYPE, str(outside)),            # symlink to a host directory...
        _file("link/through", b"x"),                                # ...and a file written through it
        _special("victimlink", tarfile.SYMTYPE, str(outside / "victim")),
        _file("victimlink", b"overwritten"),                        # a file over the link's name
        _special("hard", tarfile.LNKTYPE, str(outside / "victim")),  # hard link to a host file
        _special("dev", tarfile.CHRTYPE),                           # device node
        _special("fifo", tarfile.FIFOTYPE),
        _file("perf.data", b"AGAIN"),                               # sent twice
    ])
    got = extract(stream, dest)
    assert (dest / "perf.data").read_bytes() == b"PERFDATA"
    assert (dest / "stats" / "before" / "nstat.txt").read_text() == "IpInReceives 1\n"
    assert sorted(os.listdir(outside)) == ["victim"] and (outside / "victim").read_text() == "original"
    assert not (tmp_path / "abs").exists() and not (tmp_path / "outside" / "rel").exists()
    for path in dest.rglob("*"):  # nothing but plain files and directories, 0644 files
        mode = os.lstat(path).st_mode
        assert stat.S_ISREG(mode) or stat.S_ISDIR(mode), path
    assert (dest / "victimlink").read_bytes() == b"overwritten"  # a plain file in the bundle, no link
    assert (dest / "link" / "through").read_bytes() == b"x"  # the link was never made: a plain directory
    assert got.files == 4
    reasons = "\n".join(got.skipped)
    assert not any(r.startswith("'.'") for r in got.skipped)
    for bit in ("a name outside", "symbolic link", "hard link", "device file", "FIFO", "sent twice"):
        assert bit in reasons


def test_a_budget_stops_a_disk_filling_guest(tmp_path: Path) -> None:
    got = extract(_tar([_file("a", b"x" * 1000), _file("b", b"y" * 1000)]), tmp_path, budget=2000)
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert got.truncated and got.skipped == [("b: over the copy budget of 1.95 KiB (512 bytes an entry besides "
                                              "its data); it and the rest were not copied")]


def test_entries_count_against_the_budget_and_the_cap(tmp_path: Path) -> None:
    many = [_file(f"e{i}", b"") for i in range(1000)]  # empty files: no data, but an inode each
    (tmp_path / "a").mkdir()
    got = extract(_tar(many), tmp_path / "a", budget=1024)
    assert got.files == 2 and got.entries == 2 and got.truncated
    assert sorted(os.listdir(tmp_path / "a")) == ["e0", "e1"]
    assert got.skipped[0].startswith("e2: over the copy budget of 1 KiB")
    links = [_special(f"l{i}", tarfile.SYMTYPE, "/etc") for i in range(1000)]  # skipped ones count too
    (tmp_path / "b").mkdir()
    got = extract(_tar([*links, *many]), tmp_path / "b", max_entries=100)
    assert got.files == 0 and got.entries == 100 and os.listdir(tmp_path / "b") == []
    assert got.skipped[-1] == "l100: over the cap of 100 entries; it and the rest were not copied"
    assert len(got.skipped) == 101
