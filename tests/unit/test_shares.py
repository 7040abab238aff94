"""Host directories in guests (``shares:``): what the lab file may say, the QEMU devices and the guest's mounts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labctl.backends.base import GuestPlan
from labctl.backends.qemu.argv import build_argv
from labctl.errors import LabFileError
from labctl.image.store import Image
from labctl.lab import load_lab
from labctl.lab.addresses import mgmt_mac
from labctl.lab.shares import Share, mount_problem, parse_option
from labctl.up.mounts import mount_script, of, umount_script
from tests.conftest import fake_kernel


def _lab(tmp_path: Path, shares: str) -> Path:
    f = tmp_path / "lab.yaml"
    f.write_text("name: sh\nnetworks: {}\nguests:\n  a:\n    shares:\n" + shares)
    return f


def _problems(tmp_path: Path, shares: str) -> list[str]:
    with pytest.raises(LabFileError) as info:
        load_lab(_lab(tmp_path, shares))
    return [str(p) for p in info.value.problems]


def test_a_share_is_read_only_unless_writable_and_paths_start_at_the_lab_file(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "out").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    lab = load_lab(_lab(tmp_path, "      - {host: bin, mount: /mnt/bin}\n"
                                  "      - {host: ~/out, mount: /mnt/out, writable: true}\n"))
    a = lab.guests["a"]
    assert a.shares == (Share((tmp_path / "bin").resolve(), "/mnt/bin", False, 6),
                        Share((tmp_path / "home" / "out").resolve(), "/mnt/out", True, 7))
    assert lab.to_dict()["guests"]["a"]["shares"][1] == {"host": str((tmp_path / "home" / "out").resolve()),
                                                         "mount": "/mnt/out", "writable": True}


def test_bad_shares_are_refused_at_their_lines(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    problems = _problems(tmp_path, "      - {host: nope, mount: /mnt/a}\n"
                                   "      - {host: f, mount: /mnt/b}\n"
                                   "      - {host: d, mount: relative}\n"
                                   "      - {host: d, mount: /etc/x}\n"
                                   "      - {host: d, mount: /mnt/c, writable: yes please}\n"
                                   "      - {host: d, mount: /mnt/e, size: 3}\n"
                                   "      - {host: d, mount: /mnt/g}\n"
                                   "      - {host: d, mount: /mnt/g}\n")
    text = "\n".join(problems)
    assert "lab.yaml:6: guests.a.shares[0].host: host directory" in text and "does not exist" in text
    assert "lab.yaml:7: guests.a.shares[1].host:" in text and "is not a directory" in text
    assert "lab.yaml:8: guests.a.shares[2].mount: mount point 'relative'" in text
    assert "lab.yaml:9: guests.a.shares[3].mount: mount point /etc/x would hide /etc" in text
    assert "lab.yaml:10: guests.a.shares[4].writable: expected true or false" in text
    assert "lab.yaml:11: guests.a.shares[5]" in text and "size" in text
    assert "lab.yaml:13: guests.a.shares[7].mount: mount point /mnt/g is already another share's" in text


def test_a_directory_others_can_write_is_not_shared_unless_trusted(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    problems = _problems(tmp_path, "      - {host: open, mount: /mnt/a}\n")
    assert "is not trusted" in problems[0] and "--trust-dir" in problems[0]
    lab = load_lab(_lab(tmp_path, "      - {host: open, mount: /mnt/a}\n"), trusted=[d])
    assert lab.guests["a"].shares[0].host == d.resolve()


@pytest.mark.parametrize("mount, ok", [
    ("/mnt/x", True), ("/opt/tests", True), ("/", False), ("/mnt/../etc", False), ("/mnt/a b", False),
    ("/proc/x", False), ("/usr", False), ("/mnt/x;reboot", False), ("/srv/$(id)", False), ("/mnt/x/", False),
])
def test_mount_points(mount: str, ok: bool) -> None:
    assert (mount_problem(mount) is None) == ok


def test_the_command_line_option(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    guest, share = parse_option(f"a:{tmp_path / 'd'}:/mnt/d:rw", tmp_path)
    assert (guest, share) == ("a", Share((tmp_path / "d").resolve(), "/mnt/d", True))
    assert parse_option("b:d:/mnt/d", tmp_path)[1].writable is False
    for bad in ("a:d", "a:nope:/mnt/d", "a:d:/etc", ":d:/mnt/d", "a:d:/mnt/d:rx"):
        with pytest.raises(ValueError, match="--share"):
            parse_option(bad, tmp_path)


def test_each_share_is_a_9p_device_read_only_unless_writable(tmp_path: Path) -> None:
    (tmp_path / "ro,dir").mkdir()
    (tmp_path / "rw").mkdir()
    lab = load_lab(_lab(tmp_path, "      - {host: rw, mount: /mnt/rw, writable: true}\n"))
    g = lab.guests["a"]
    g = type(g)(**{**g.__dict__, "shares": (Share(tmp_path / "ro,dir", "/mnt/ro"), *g.shares)})
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": ["quiet"], "kernel": {"release": "6.1"}})
    plan = GuestPlan(lab.name, g, tmp_path / "a", img, "tcg", 40000, mgmt_mac(lab.name, "a"), {}, ("quiet",),
                     fake_kernel(tmp_path / "kernel"), tmp_path / "initrd.img")
    argv = build_argv(plan)
    fsdevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-fsdev"]
    assert fsdevs == [f"local,id=share0,path={tmp_path}/ro,,dir,security_model=none,readonly=on",
                      f"local,id=share1,path={tmp_path}/rw,security_model=mapped-xattr"]
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert "virtio-9p-pci,fsdev=share0,mount_tag=labctl0" in devices
    assert "virtio-9p-pci,fsdev=share1,mount_tag=labctl1" in devices
    # A guest without shares has none (its snapshot key is what it was)
    plain = GuestPlan(lab.name, type(g)(**{**g.__dict__, "shares": ()}), tmp_path / "a", img, "tcg", 40000,
                      mgmt_mac(lab.name, "a"), {}, ("quiet",), fake_kernel(tmp_path / "kernel"), tmp_path / "i")
    assert "-fsdev" not in build_argv(plain)


def test_the_guest_mounts_by_tag_read_only_unless_writable() -> None:
    shares = (Share(Path("/h/a"), "/mnt/a"), Share(Path("/h/b"), "/mnt/b", True))
    script = mount_script(shares)
    assert "mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro labctl0 /mnt/a" in script
    assert "mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,rw labctl1 /mnt/b" in script
    assert script.startswith("set -e\n")
    assert umount_script(shares).splitlines() == ["! mountpoint -q /mnt/b || umount /mnt/b",
                                                  "! mountpoint -q /mnt/a || umount /mnt/a"]
    assert of({"shares": [{"host": "/h/a", "mount": "/mnt/a", "writable": False}]}) == (Share(Path("/h/a"), "/mnt/a"),)
    assert of({}) == ()
