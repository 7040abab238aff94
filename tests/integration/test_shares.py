"""Host directories in guests (``shares:``, ``--share``) with a real guest: a program compiled on the
host runs there from a read-only share (writing to it fails); a writable share takes the guest's files
as plain files (a link the guest makes is no link on the host), in a new directory for each up; the mounts are back after a warm
restore, a reset and a checkpoint restore; down lets a program write its last file on SIGTERM; bad
shares are refused before anything starts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Cli

LAB = """\
name: sharetest
networks: {{}}
guests:
  a:
    shares:
      - {{host: bin, mount: /mnt/bin}}
      - {{host: {out}, mount: /mnt/out, writable: true}}
"""

HELLO = r"""
#include <stdio.h>
#include <sys/utsname.h>
int main(int argc, char **argv) {
    struct utsname u;
    uname(&u);
    printf("built on the host, running on %s %s: %s\n", u.nodename, u.release, argc > 1 ? argv[1] : "");
    return 0;
}
"""


def _exec(cli: Cli, command: str) -> subprocess.CompletedProcess[str]:
    return cli("exec", "sharetest", "a", "--timeout", "60", "--", "sh", "-c", command, timeout=120)


def _hello_runs(cli: Cli, word: str) -> None:
    res = _exec(cli, f"/mnt/bin/hello {word}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("built on the host, running on a 6.1") and res.stdout.rstrip().endswith(word), \
        res.stdout


def test_host_directories_in_a_guest(cli: Cli, image: object, tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is missing: run setup.sh")
    (tmp_path / "bin").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "note").write_text("from --share\n")
    (tmp_path / "hello.c").write_text(HELLO)
    subprocess.run(["gcc", "-O2", "-o", str(tmp_path / "bin" / "hello"), str(tmp_path / "hello.c")], check=True)
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB.format(out=tmp_path / "out"))

    up = cli("up", str(lab), "--accel", "tcg", "--share", f"a:{tmp_path / 'extra'}:/srv/extra", "--json",
             timeout=900)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        shares = json.loads(up.stdout)["guests"][0]["shares"]
        assert [(s["mount"], s["writable"]) for s in shares] == [("/mnt/bin", False), ("/mnt/out", True),
                                                                 ("/srv/extra", False)]
        out = Path(shares[1]["dir"])  # this up's new directory in the writable share's host directory
        assert out.parent == tmp_path / "out" and out.name.startswith("sharetest-a-")
        assert "a: /mnt/bin ← " in cli("status", "sharetest").stdout
        assert "shares /mnt/bin (ro), /mnt/out (rw), /srv/extra (ro)" in cli("graph", "sharetest", "--format", "dot").stdout

        # The host's program runs in the guest, from a read-only share.
        _hello_runs(cli, "first")
        ro = _exec(cli, "touch /mnt/bin/new")
        assert ro.returncode != 0 and "Read-only file system" in ro.stderr, ro.stdout + ro.stderr
        assert not (tmp_path / "bin" / "new").exists()
        assert _exec(cli, "cat /srv/extra/note").stdout == "from --share\n"

        # A writable share: the guest's files arrive; its link and device are plain files on the host.
        res = _exec(cli, "echo result > /mnt/out/r.txt && ln -s /etc/shadow /mnt/out/link "
                         "&& mknod /mnt/out/null c 1 3 && ls -l /mnt/out/link")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "-> /etc/shadow" in res.stdout  # the guest sees its link
        assert (out / "r.txt").read_text() == "result\n"
        assert not (out / "link").is_symlink() and (out / "link").is_file()
        assert (out / "null").is_file() and not (out / "null").is_char_device()

        # A checkpoint (QEMU cannot save a mounted 9p: labctl unmounts around the save) and its restore
        assert cli("checkpoint", "save", "sharetest", "c1").returncode == 0
        _hello_runs(cli, "after-save")
        assert cli("checkpoint", "restore", "sharetest", "c1").returncode == 0
        _hello_runs(cli, "after-restore")
        # A reset to the post-boot snapshot mounts them again.
        assert cli("reset", "sharetest", "a").returncode == 0
        _hello_runs(cli, "after-reset")
    finally:
        cli("down", "sharetest")

    # Warm start: the snapshot was taken with the shares unmounted; the restore mounts them.
    again = cli("up", str(lab), "--accel", "tcg", "--share", f"a:{tmp_path / 'extra'}:/srv/extra", "--json",
                timeout=900)
    try:
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(again.stdout)["guests"][0]["started_from"] == "snapshot"
        out2 = Path(json.loads(again.stdout)["guests"][0]["shares"][1]["dir"])
        assert out2 != out and (out / "r.txt").is_file() and not any(out2.iterdir())
        _hello_runs(cli, "warm")
        # down powers the guest off cleanly: a program that ends on SIGTERM by writing its last
        # file to a share gets to write it (the power-off waits for it, 0.5 s at most).
        start = _exec(cli, "setsid -f bash -c 'trap \"echo stopped > /mnt/out/term.txt; exit 0\" TERM; "
                           "while :; do sleep 0.2; done' </dev/null >/dev/null 2>&1")
        assert start.returncode == 0, start.stdout + start.stderr
        assert cli("down", "sharetest").returncode == 0
        assert (out2 / "term.txt").read_text() == "stopped\n"
    finally:
        cli("down", "sharetest")


def test_bad_shares_start_nothing(cli: Cli, image: object, tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB.format(out=tmp_path / "missing"))
    res = cli("up", str(lab), "--accel", "tcg")
    assert res.returncode == 2 and "lab.yaml:7: guests.a.shares[1].host: host directory" in res.stderr, res.stderr
    lab.write_text(LAB.format(out=tmp_path / "bin").replace("/mnt/out", "/mnt/out2"))
    res = cli("up", str(lab), "--accel", "tcg", "--share", f"a:{tmp_path / 'bin'}:/mnt/bin")
    assert res.returncode == 2 and "already shares /mnt/bin" in res.stderr, res.stderr
    res = cli("up", str(lab), "--accel", "tcg", "--share", f"zz:{tmp_path / 'bin'}:/mnt/x")
    assert res.returncode == 2 and "no guest 'zz'" in res.stderr
    res = cli("up", str(lab), "--accel", "tcg", "--backend", "libvirt")
    assert res.returncode == 2 and "only the qemu backend" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not (cli.state_dir / "labs" / "sharetest").exists()
