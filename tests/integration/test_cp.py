"""``labctl cp`` with a real guest: a tree to the guest and back byte for byte, and what a hostile
guest sends (links, devices, FIFOs, a tar stream of its own with names outside) stays out of the host."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from tests.conftest import Cli

LAB = """\
name: cptest
networks: {lan: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio-net-pci, network: lan, ip: 10.77.0.1/24}]
"""


def _tree(root: Path) -> None:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "f1").write_text("hello\n")
    (root / "f1").chmod(0o755)
    (root / "sub" / "big").write_bytes(os.urandom(3 << 20))
    (root / "sub" / "deep" / "empty").write_bytes(b"")
    (root / "name with spaces ü").write_bytes(b"\x00\xff" * 1000)
    (root / "link").symlink_to("/etc/passwd")
    os.mkfifo(root / "fifo")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _hostile_tar() -> bytes:
    buf = io.BytesIO()

    def add(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
        if kind == tarfile.CHRTYPE:
            info.devmajor, info.devminor = 1, 3
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        add("x", tarfile.DIRTYPE)
        add("x/ok", data=b"fine")
        add("x/../../escape", data=b"pwned")
        add("/tmp/labctl-cp-abs-escape", data=b"pwned")
        add("x/ln", tarfile.SYMTYPE, link="/etc")
        add("x/ln/pwned", data=b"through the link?")
        add("x/hl", tarfile.LNKTYPE, link="/etc/passwd")
        add("x/dev", tarfile.CHRTYPE)
        add("x/fifo", tarfile.FIFOTYPE)
        add("x/a\x1bb", data=b"control")
        add("y/beside", data=b"not asked for")
    return buf.getvalue()


def test_cp_both_ways_and_a_hostile_guest(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "cptest.yaml"
    lab.write_text(LAB)
    up = cli("up", str(lab), "--accel", "tcg")
    assert up.returncode == 0, up.stdout + up.stderr

    # ---- host -> guest: the tree arrives; the link goes as a link, the FIFO is skipped (exit 1)
    src = tmp_path / "tree"
    src.mkdir()
    _tree(src)
    res = cli("cp", "cptest", str(src), "a:/root/", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["direction"] == "to-guest" and data["target"] == "/root/tree"
    assert data["skipped"] == [{"path": "tree/fifo", "reason": "a FIFO"}]
    assert data["files"] == 4 and data["bytes"] == sum(len(v) for v in _files(src).values())
    sums = cli("exec", "cptest", "a", "--", "cd /root/tree && readlink link && test ! -e fifo && "
               "find . -type f -exec sha256sum {} + | sort -k2", check=True).stdout.splitlines()
    assert sums[0] == "/etc/passwd"
    assert {line.split("  ", 1)[1][2:]: line.split()[0] for line in sums[1:]} == \
        {k: hashlib.sha256(v).hexdigest() for k, v in _files(src).items()}

    # ---- guest -> host: byte for byte, the link skipped with its reason (exit 1)
    back = tmp_path / "back"
    res = cli("cp", "cptest", "a:/root/tree", str(back), "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["target"] == str(back) and data["skipped"] == [{"path": "tree/link", "reason": "a symbolic link"}]
    assert _files(back) == _files(src)
    assert not (back / "link").exists() and not (back / "link").is_symlink()
    assert not list(tmp_path.glob(".labctl-cp-*"))

    # one file, into an existing directory, then again: never overwritten (exit 2)
    into = tmp_path / "into"
    into.mkdir()
    assert cli("cp", "cptest", "a:/root/tree/sub/big", str(into)).returncode == 0
    assert (into / "big").read_bytes() == (src / "sub" / "big").read_bytes()
    again = cli("cp", "cptest", "a:/root/tree/sub/big", str(into))
    assert again.returncode == 2 and "exists" in again.stderr

    # budget, both ways: a tree over it is refused before anything is sent; from the guest the
    # file over it ends the copy (it and the rest are listed as not copied)
    assert cli("cp", "cptest", "--max-size", "1M", str(src), "a:/root/small").returncode == 2
    res = cli("cp", "cptest", "--max-size", "1M", "a:/root/tree", str(tmp_path / "small"), "--json")
    assert res.returncode == 1
    assert {"path": "tree/sub/big", "reason": "over the copy budget of 1 MiB (512 bytes an entry besides its data); "
            "it and the rest were not copied"} in json.loads(res.stdout)["skipped"], res.stdout
    assert not (tmp_path / "small" / "sub" / "big").exists()

    # usage and state errors
    assert cli("cp", "cptest", "a:/nonexistent", str(tmp_path / "n")).returncode == 2
    assert cli("cp", "cptest", "a:/root", "b:/root").returncode == 2
    assert cli("cp", "cptest", str(src), str(tmp_path / "n")).returncode == 2
    assert cli("cp", "notup", "a:/root", str(tmp_path / "n")).returncode == 5
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by others, not sticky: refused (exit 3), nothing written
    res = cli("cp", "cptest", "a:/root/tree/f1", str(shared))
    assert res.returncode == 3 and "writable by other users" in res.stderr
    assert list(shared.iterdir()) == []

    # ---- a real guest's links, devices, FIFOs and hard links: only the regular file arrives
    cli("exec", "cptest", "a", "--",
        "mkdir -p /root/h/d && cd /root/h/d && echo ok > good && ln -s /etc/passwd pw && ln -s / root "
        "&& mkfifo fifo && mknod null c 1 3 && mknod blk b 7 0 && ln good hard", check=True)
    res = cli("cp", "cptest", "a:/root/h/d", str(tmp_path / "h"), "--json")
    assert res.returncode == 1
    skipped = {s["path"]: s["reason"] for s in json.loads(res.stdout)["skipped"]}
    # good and hard are one inode: tar sends whichever the directory lists first as the file and
    # the other as a hard link to it (ext4's order depends on the file system's hash seed)
    linked = [p for p, why in skipped.items() if why == "a hard link"]
    assert linked in (["d/hard"], ["d/good"]), skipped
    assert {p: why for p, why in skipped.items() if why != "a hard link"} == {
        "d/pw": "a symbolic link", "d/root": "a symbolic link", "d/fifo": "a FIFO",
        "d/null": "a device file", "d/blk": "a device file"}
    arrived = ["good"] if linked == ["d/hard"] else ["hard"]
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == arrived
    assert (tmp_path / "h" / arrived[0]).read_text() == "ok\n"

    # ---- a guest whose tar is replaced (root in the guest can): its own stream, names outside
    evil = tmp_path / "evil.tar"
    evil.write_bytes(_hostile_tar())
    cli("cp", "cptest", str(evil), "a:/root/evil.tar", check=True)
    cli("exec", "cptest", "a", "--",
        "mkdir -p /root/x && t=$(command -v tar) && mv $t $t.real && "
        "printf '#!/bin/sh\\nexec cat /root/evil.tar\\n' > $t && chmod 755 $t", check=True)
    arena = tmp_path / "arena"
    arena.mkdir()
    res = cli("cp", "cptest", "a:/root/x", str(arena / "got"), "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    data = json.loads(res.stdout)
    reasons = {s["path"]: s["reason"] for s in data["skipped"]}
    assert reasons["x/ln"] == "a symbolic link" and reasons["x/hl"] == "a hard link"
    assert reasons["x/dev"] == "a device file" and reasons["x/fifo"] == "a FIFO"
    assert reasons["y"] == "not under the path asked for (removed)"
    assert sum("outside" in r for r in reasons.values()) == 3  # ../../escape, /tmp/..., the control character
    # nothing outside DEST: the arena holds the copy only, and nothing escaped above it
    assert [p.name for p in arena.iterdir()] == ["got"]
    assert not (tmp_path / "escape").exists() and not (arena / "escape").exists()
    assert not Path("/tmp/labctl-cp-abs-escape").exists()
    assert sorted(str(p.relative_to(arena / "got")) for p in (arena / "got").rglob("*")) == ["ln", "ln/pwned", "ok"]
    assert (arena / "got" / "ln").is_dir() and not (arena / "got" / "ln").is_symlink()
    assert (arena / "got" / "ok").read_bytes() == b"fine"

    # ---- a guest that sends without end: stopped at the stream limit (2 x budget + 64 MiB), nothing placed
    cli("exec", "cptest", "a", "--", "printf '#!/bin/sh\\nexec cat /dev/zero\\n' > $(command -v tar)", check=True)
    endless = tmp_path / "endless"
    endless.mkdir()
    res = cli("cp", "cptest", "--max-size", "1M", "a:/root/x", str(endless / "got"), timeout=300)
    assert res.returncode == 4 and "nothing was copied" in " ".join(res.stderr.split()), res.stdout + res.stderr
    assert list(endless.iterdir()) == []

    assert cli("down", "cptest").returncode == 0
