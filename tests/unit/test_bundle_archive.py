"""pack(): a reproducible .tar.gz of a run directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from labctl.bundle.archive import pack
from labctl.errors import UsageError
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "report" / "nic-driver-cost-ok"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    dest = tmp_path / "runs" / "nic-driver-cost-20261123T010000"
    shutil.copytree(FIXTURE, dest)
    return dest


def names(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


def test_default_archive_sits_next_to_the_run(run: Path) -> None:
    archive = pack(run)
    assert archive == run.with_name(run.name + ".tar.gz")
    members = names(archive)
    assert members[0] == run.name
    expected = sorted(str(p.relative_to(run.parent)) for p in run.rglob("*"))
    assert sorted(members[1:]) == expected
    assert all(not m.startswith("/") and ".." not in m.split("/") for m in members)
    assert f"{run.name}/manifest.json" in members


def test_members_are_in_sorted_order_with_directories_first(run: Path) -> None:
    members = names(pack(run))
    assert members == sorted(members, key=lambda m: m.split("/"))


def test_archive_is_reproducible(run: Path, tmp_path: Path) -> None:
    first = hashlib.sha256(pack(run, tmp_path / "one.tar.gz").read_bytes()).hexdigest()
    second = hashlib.sha256(pack(run, tmp_path / "two.tar.gz").read_bytes()).hexdigest()
    assert first == second
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        assert {(m.uid, m.gid, m.uname, m.gname) for m in tar.getmembers()} == {(0, 0, "", "")}
        data = tar.extractfile(f"{run.name}/summary.json")
        assert data is not None and data.read() == (run / "summary.json").read_bytes()


def test_output_inside_the_run_dir_is_not_packed_into_itself(run: Path) -> None:
    archive = pack(run, run / "self.tar.gz")
    assert f"{run.name}/self.tar.gz" not in names(archive)
    assert not any(n.endswith(".part") for n in names(archive))


def test_output_directory_gets_the_default_name(run: Path, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    outdir.mkdir()
    assert pack(run, outdir) == outdir / f"{run.name}.tar.gz"


def test_symlinks_out_of_the_run_dir_and_sockets_are_left_out(run: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the bundle")
    (run / "outside").symlink_to(secret)
    (run / "inside").symlink_to("lab.yaml")
    os.mkfifo(run / "fifo")
    members = names(pack(run))
    assert f"{run.name}/outside" not in members and f"{run.name}/fifo" not in members
    with tarfile.open(run.with_name(run.name + ".tar.gz")) as tar:
        link = tar.getmember(f"{run.name}/inside")
        assert link.issym() and link.linkname == "lab.yaml"


def test_refuses_a_directory_that_is_no_bundle(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no manifest.json"):
        pack(tmp_path)
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}.tar.gz"))


def test_missing_output_directory(run: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such directory"):
        pack(run, tmp_path / "nope" / "x.tar.gz")
