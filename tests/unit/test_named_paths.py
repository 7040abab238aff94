"""Issue 47 (round four), High 4 and Low 13: one rule for every host path a lab file names
(:func:`labctl.lab.trust.named_path_reason`). A lab file of another user (a real second account,
made here) names only what that user owns and can read, whatever it is: a bpftrace ``file:``, a
kernel's files, a selftests' tree, a share; a lab file from a URL, a git repository or a pack names
none, refused before the file is read; a file is read no further than its cap. And the bundle keeps
what holds script text, a kernel log or guest memory 0600."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.errors import LabFileError
from labctl.lab import load_lab, load_lab_text
from labctl.lab.trust import read_capped
from tests.unit.test_lab_trust import other_user  # noqa: F401  (fixture)

LAB = """name: t
networks: {}
guests:
  a: {kernel: debian:6.1.0-56-amd64}
steps:
  - name: probe
    run: [{guest: a, command: "true"}]
    trace:
      a:
        bpftrace: {file: BPF}
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (``/tmp/...``, 0755), as a colleague's files would be."""
    d = Path(tempfile.mkdtemp(prefix="labctl-r4-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _their_lab(d: Path, uid: int, text: str) -> Path:
    """A lab file of user ``uid`` in their own directory ``d/their`` (0755)."""
    theirs = d / "their"
    theirs.mkdir(exist_ok=True)
    os.chown(theirs, uid, uid)
    lab = theirs / "lab.yaml"
    lab.write_text(text)
    os.chown(lab, uid, uid)
    return lab


def _root_secret(d: Path) -> Path:
    secret = d / "secret.bt"
    secret.write_text("BEGIN { printf(\"root's own\\n\"); }\n")
    secret.chmod(0o600)
    return secret


# -- High 4: another user's lab file -------------------------------------------------------------

def test_another_users_lab_file_gets_no_root_only_bpftrace_file(other_user: tuple[str, int],  # noqa: F811
                                                              shared_dir: Path) -> None:
    name, uid = other_user
    secret = _root_secret(shared_dir)
    lab = _their_lab(shared_dir, uid, LAB.replace("BPF", str(secret)))
    with pytest.raises(LabFileError, match=r"bpftrace.file: bpftrace file .*secret.bt is not trusted: it belongs to "
                                           rf"root \(uid 0\), and the lab file to {name}"):
        load_lab(lab, trusted=[shared_dir])  # --trust-dir or not: never what its author could not read
    link = shared_dir / "their" / "innocent.bt"  # a link of theirs to root's file: the file it names is root's
    link.symlink_to(secret)
    os.lchown(link, uid, uid)
    with pytest.raises(LabFileError, match="belongs to root"):
        load_lab(_their_lab(shared_dir, uid, LAB.replace("BPF", "innocent.bt")), trusted=[shared_dir])


def test_another_users_lab_file_gets_a_file_of_theirs_they_can_read(other_user: tuple[str, int],  # noqa: F811
                                                                  shared_dir: Path) -> None:
    _name, uid = other_user
    lab = _their_lab(shared_dir, uid, LAB.replace("BPF", "mine.bt"))
    mine = shared_dir / "their" / "mine.bt"
    mine.write_text("BEGIN { exit(); }\n")
    os.chown(mine, uid, uid)
    mine.chmod(0o600)
    spec = load_lab(lab, trusted=[shared_dir]).steps[0].trace["a"].bpftrace
    assert spec is not None and "exit()" in spec.script
    mine.chmod(0o000)  # theirs, but they could not read it
    with pytest.raises(LabFileError, match="the lab file's owner could not read it"):
        load_lab(lab, trusted=[shared_dir])


def test_another_users_lab_file_gets_no_root_kernel_file_nor_tree(other_user: tuple[str, int],  # noqa: F811
                                                                shared_dir: Path) -> None:
    name, uid = other_user
    cfg = shared_dir / "config"
    cfg.write_text("CONFIG_X=y\n")
    cfg.chmod(0o600)
    boot = shared_dir / "bzImage"
    boot.write_bytes(b"\x7fELF")
    lab = _their_lab(shared_dir, uid, f"name: t\nnetworks: {{}}\nguests:\n  a:\n    kernel: {{image: {boot}, "
                                      f"config: {cfg}}}\n")
    with pytest.raises(LabFileError) as err:
        load_lab(lab, trusted=[shared_dir])
    text = str(err.value)
    assert "kernel.image: kernel image" in text and "kernel.config: kernel config file" in text, text
    assert f"belongs to root (uid 0), and the lab file to {name}" in text


# -- a lab file from a URL, a git repository or a pack: refused before it is read --------------

def test_a_remote_lab_file_never_reads_a_host_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    read: list[Path] = []
    from labctl.lab import tracespec

    def spy(path: Path, cap: int) -> bytes:
        read.append(path)
        return read_capped(path, cap)
    monkeypatch.setattr(tracespec, "read_capped", spy)
    secret = _root_secret(tmp_path)
    with pytest.raises(LabFileError, match=r"a lab file from http://example.org/lab.yaml may not name a path"):
        load_lab_text(LAB.replace("BPF", str(secret)), "http://example.org/lab.yaml", remote="http://example.org/lab.yaml")
    assert read == []
    load_lab_text(LAB.replace("BPF", str(secret)), str(tmp_path / "lab.yaml"))  # the user's own lab: read, as ever
    assert read == [secret]


# -- Low 13: read no further than the cap --------------------------------------------------------

def test_a_huge_bpftrace_file_is_read_no_further_than_the_cap(tmp_path: Path) -> None:
    huge = tmp_path / "huge.bt"
    with open(huge, "wb") as f:
        f.write(b"BEGIN {}\n" * 1000)
        f.truncate(256 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(LabFileError, match="a program of at most 65536 bytes"):
            load_lab_text(LAB.replace("BPF", str(huge)), str(tmp_path / "lab.yaml"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    fifo = tmp_path / "fifo.bt"
    os.mkfifo(fifo)
    with pytest.raises(LabFileError, match="not a regular file"):  # never waits on a FIFO
        load_lab_text(LAB.replace("BPF", str(fifo)), str(tmp_path / "lab.yaml"))


# -- what the bundle keeps private ---------------------------------------------------------------

def test_bpftrace_files_and_kernel_logs_come_back_0600(tmp_path: Path) -> None:
    from labctl.steps.copyback import extract

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("bpftrace.bt", "bpftrace.log", "bpftrace.json", "dmesg.txt", "iperf3.json"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
    buf.seek(0)
    extract(buf, tmp_path)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"bpftrace.bt": 0o600, "bpftrace.log": 0o600, "bpftrace.json": 0o600, "dmesg.txt": 0o600,
                     "iperf3.json": 0o644}


def test_a_bundles_archive_is_0600_with_or_without_vmcores(tmp_path: Path) -> None:
    from labctl.bundle.archive import pack
    from tests.unit.test_bundle_archive import FIXTURE

    run = tmp_path / "runs" / "r-20261201T000000"
    shutil.copytree(FIXTURE, run)
    for vmcores in (False, True):
        out = pack(run, tmp_path / f"a-{vmcores}.tar.gz", vmcores=vmcores)
        assert out.stat().st_mode & 0o777 == 0o600
