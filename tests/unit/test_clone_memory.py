"""Clones, not copies (issue 52): a guest's RAM as a file, mapped shared by a boot and privately by
every restore; a new VM generation ID at each start; a snapshot's memory file checked before it is
mapped. Pure argv and file functions; the real guests are in tests/integration/test_clones.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

import labctl.up.snapshots as snaps
from labctl.backends.base import GuestRecord
from labctl.backends.qemu import clone
from labctl.backends.qemu.argv import build_argv
from labctl.backends.qemu.machines import QemuBackend, fresh_memory
from labctl.errors import SnapshotBroken
from labctl.up.warm import link_memory
from tests.unit.test_qemu_argv import ROOT, _pairs, _plans


def _memory(argv: list[str]) -> str:
    (obj,) = [o for o in _pairs(argv, "-object") if o.startswith("memory-backend-file,")]
    return obj


def test_a_boot_maps_its_own_ram_file_shared_and_a_restore_maps_it_privately(tmp_path: Path) -> None:
    plan = _plans(tmp_path, ROOT / "labs" / "quickstart.yaml")["a"]
    boot, restored = build_argv(plan), build_argv(dataclasses.replace(plan, warm=True))
    size = _pairs(boot, "-m")[0]
    assert _memory(boot) == f"memory-backend-file,id=ram0,size={size}M,mem-path={plan.dir / 'memory'},share=on"
    assert _memory(restored) == _memory(boot).replace("share=on", "share=off")
    assert "memory-backend=ram0" in _pairs(boot, "-machine")
    assert clone.shares_memory(boot) is True and clone.shares_memory(restored) is False
    assert clone.shares_memory(["qemu", "-m", "512"]) is None
    # the device every start gets a new ID for
    assert "vmgenid,guid=auto" in _pairs(boot, "-device")


def test_every_start_gets_a_new_generation_id_and_the_snapshot_key_ignores_it(tmp_path: Path) -> None:
    plan = _plans(tmp_path, ROOT / "labs" / "quickstart.yaml")["a"]
    argv = build_argv(plan)
    first, guid1 = clone.new_generation(argv)
    second, guid2 = clone.new_generation(first)
    assert guid1 and guid2 and guid1 != guid2
    assert f"vmgenid,guid={guid2}" in _pairs(second, "-device") and len(second) == len(argv)
    assert clone.new_generation(["qemu"]) == (["qemu"], None)
    assert snaps.key(plan, QemuBackend()) == snaps.key(plan, QemuBackend())


def test_a_restart_maps_the_ram_privately_to_restore_and_shared_to_boot(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    launched: list[list[str]] = []
    monkeypatch.setattr(QemuBackend, "_launch", lambda self, rec, fds=None: launched.append(rec.argv) or rec)
    obj = f"memory-backend-file,id=ram0,size=256M,mem-path={tmp_path}/memory,share=on"
    rec = GuestRecord("a", "qemu", 1, str(tmp_path), "c", "q", 1, "tcg", argv=["qemu", "-object", obj])
    QemuBackend().restart(rec, incoming=True)
    QemuBackend().restart(rec, incoming=False)
    assert launched == [["qemu", "-object", obj.replace("share=on", "share=off"), "-incoming", "defer"],
                        ["qemu", "-object", obj]]


def test_a_boot_never_writes_through_a_link_to_a_snapshot(tmp_path: Path) -> None:
    template = tmp_path / "template"
    template.write_bytes(b"saved RAM")
    ram = tmp_path / "memory"
    ram.symlink_to(template)
    fresh_memory(ram)
    assert not ram.is_symlink() and ram.stat().st_size == 0 and (ram.stat().st_mode & 0o777) == 0o600
    assert template.read_bytes() == b"saved RAM"


def test_copy_sparse_keeps_the_data_and_leaves_zero_pages_as_holes(tmp_path: Path) -> None:
    src, dest = tmp_path / "ram", tmp_path / "copy"
    page = snaps.PAGE
    with open(src, "wb") as f:
        f.truncate(64 * page)
        f.seek(3 * page)
        f.write(b"\1" * page + bytes(page) * 8 + b"\2" * 10)  # a zero run written out, inside data
        f.seek(40 * page)
        f.write(b"\3" * page)
    snaps.copy_sparse(src, dest)
    assert dest.read_bytes() == src.read_bytes()
    assert (dest.stat().st_mode & 0o777) == 0o600
    assert dest.stat().st_blocks * 512 <= 3 * page < src.stat().st_blocks * 512


def _snapshot(root: Path, size: int = 1 << 20) -> snaps.Snapshot:
    d = root / "k"
    d.mkdir(parents=True)
    for name in (snaps.STATE, snaps.DISK):
        (d / name).write_bytes(b"x")
    mem = d / snaps.MEMORY
    with open(mem, "wb") as f:
        f.truncate(size)
    mem.chmod(0o600)
    (d / snaps.META).write_text(json.dumps({"memory": snaps._identity(mem, mem)}))
    return snaps.Snapshot(d)


def test_a_truncated_or_replaced_memory_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path)
    assert snap.complete() and snap.memory_problem() is None
    dest = tmp_path / "guest-memory"
    link_memory(snap, dest)
    assert dest.resolve() == snap.memory.resolve()
    os.truncate(snap.memory, 4096)
    assert "is 4096 bytes, but it was saved with 1048576: it was truncated" in (snap.memory_problem() or "")
    dest.unlink()
    with pytest.raises(SnapshotBroken, match="cannot be restored: its memory file .* truncated") as exc:
        link_memory(snap, dest)
    assert exc.value.exit_code == 4 and not dest.exists()

    other = _snapshot(tmp_path / "o")
    tmp = other.memory.with_name("new")
    with open(tmp, "wb") as f:
        f.truncate(1 << 20)
    tmp.chmod(0o600)
    tmp.replace(other.memory)  # the same size, another file
    assert "was changed or replaced" in (other.memory_problem() or "")
    other.memory.chmod(0o644)
    assert "open to other users" in (other.memory_problem() or "")
    other.memory.unlink()
    assert "is gone" in (other.memory_problem() or "") and not other.complete()


def test_a_restored_overlay_is_a_copy_of_one_empty_overlay_on_the_snapshots_disk(tmp_path: Path) -> None:
    import subprocess

    d = tmp_path / "snap"
    d.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(d / snaps.DISK), "16M"], check=True)
    snap = snaps.Snapshot(d)
    first, second = tmp_path / "a.qcow2", tmp_path / "b.qcow2"
    snaps.restored_overlay(snap, first)
    made = (d / snaps.EMPTY_OVERLAY).stat()
    snaps.restored_overlay(snap, second)
    assert (d / snaps.EMPTY_OVERLAY).stat().st_ino == made.st_ino  # made once, then copied
    assert first.read_bytes() == second.read_bytes() and (second.stat().st_mode & 0o777) == 0o600
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(second)], check=True,
                                     capture_output=True, text=True).stdout)
    assert info["backing-filename"] == str(d / snaps.DISK) and info["virtual-size"] == 16 << 20


def test_a_reset_waits_for_sshds_banner_through_the_port(tmp_path: Path) -> None:
    import socket
    import threading

    from labctl.errors import GuestError
    from labctl.ssh import Endpoint
    from labctl.up.banner import wait_banner

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    answers = [b"", b"HTTP/1.0 400\r\n", b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n"]  # slirp's empty close first

    served: list[bytes] = []

    def serve() -> None:
        for answer in answers:
            conn, _ = srv.accept()
            conn.sendall(answer)
            conn.close()
            served.append(answer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    ep = Endpoint("g", port, tmp_path / "key", tmp_path / "known_hosts")
    wait_banner(ep, 10.0)
    t.join(5)
    assert served == answers  # it took neither the empty close nor another program's line for sshd's
    srv.close()
    with pytest.raises(GuestError, match=f"sshd did not answer on 127.0.0.1:{port} after its restore"):
        wait_banner(ep, 0.3)


def test_the_banner_may_come_in_pieces_and_must_be_ssh_2(tmp_path: Path) -> None:
    """A banner split over two reads is still sshd's; a server of SSH 1 is not the guest's sshd."""
    import socket
    import threading
    import time

    from labctl.ssh import Endpoint
    from labctl.up.banner import wait_banner

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    answers = [[b"SSH-1.5-old\r\n"], [b"SSH-2.", b"0-OpenSSH_9.2p1\r\n"]]
    served: list[list[bytes]] = []

    def serve() -> None:
        for parts in answers:
            conn, _ = srv.accept()
            for part in parts:
                conn.sendall(part)
                time.sleep(0.05)
            conn.close()
            served.append(parts)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    wait_banner(Endpoint("g", port, tmp_path / "key", tmp_path / "known_hosts"), 10.0)
    t.join(5)
    srv.close()
    assert served == answers  # the SSH 1 server's line was not taken, the split banner was
