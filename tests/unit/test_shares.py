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
from labctl.lab.shares import Share, mount_problem, parse_option, place_problem
from labctl.up.mounts import directories, make_directories, mount_script, of, umount_script
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
                      f"local,id=share1,path={tmp_path}/a/share1,security_model=mapped-xattr"]
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


HOMES = {Path("/home/bob"): "bob", Path("/var/lib/postgresql"): "postgres", Path("/srv/www"): "www-data"}
OWN = {Path("/root/.cache/labctl"): "cache", Path("/run/labctl"): "state directory"}


@pytest.mark.parametrize("path, why", [
    ("/", "the host's root directory"),
    ("/etc", "is the system directory /etc"), ("/etc/cron.d", "is in the system directory /etc"),
    ("/usr/src/linux", "/usr"), ("/var/tmp/x", "/var"), ("/lib64", "/lib64"), ("/libx32/y", "/libx32"),
    ("/opt/tools", "/opt"), ("/srv/data", "/srv"), ("/boot", "/boot"), ("/dev/shm/x", "/dev"),
    ("/proc/1/root", "/proc"), ("/sys", "/sys"), ("/run/user/0", "/run"), ("/bin", "/bin"),
    ("/home", "is /home, which holds other users' files"), ("/tmp", "is /tmp"), ("/mnt", "/mnt"),
    ("/media", "/media"),
    ("/home/bob", "is the home directory of bob"), ("/home/bob/.ssh", "is in the home directory of bob"),
    ("/root", "your whole home directory"),
    ("/root/.cache", "holds labctl's cache"), ("/root/.cache/labctl/kernels", "is in labctl's cache"),
])
def test_where_a_share_may_never_be(path: str, why: str) -> None:
    problem = place_problem(Path(path), Path("/root"), HOMES, OWN)
    assert problem is not None and why in problem, problem


@pytest.mark.parametrize("path", ["/root/build", "/tmp/x", "/tmp/pytest-of-root/t0/bin", "/home/alice/x",
                                  "/mnt/usb/results", "/media/cd", "/data/labs", "/root/.cache/other"])
def test_where_a_share_may_be(path: str) -> None:
    assert place_problem(Path(path), Path("/root"), HOMES, OWN) is None


def test_a_home_above_a_share_or_below_it(tmp_path: Path) -> None:
    homes = {tmp_path / "users" / "eve": "eve"}
    assert "holds the home directory of eve" in str(place_problem(tmp_path / "users", None, homes, {}))
    assert "is in the home directory of eve" in str(place_problem(tmp_path / "users/eve/x", None, homes, {}))


def test_system_directories_are_refused_in_a_lab_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.delenv("LABCTL_CACHE_DIR", raising=False)  # the suite's run has a cache of its own:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # here labctl's cache is ~/.cache/labctl
    problems = _problems(tmp_path, "      - {host: /etc, mount: /mnt/a}\n"
                                   "      - {host: /, mount: /mnt/b}\n"
                                   "      - {host: ~/.cache, mount: /mnt/c}\n")
    text = "\n".join(problems)
    assert "lab.yaml:6: guests.a.shares[0].host: host directory /etc cannot be shared: it is the system " \
           "directory /etc" in text
    assert "lab.yaml:7: guests.a.shares[1].host: host directory / cannot be shared" in text
    assert "lab.yaml:8: guests.a.shares[2].host:" in text and "labctl's cache" in text
    with pytest.raises(ValueError, match="system directory /usr"):
        parse_option("a:/usr/share:/mnt/d", tmp_path)


def test_a_writable_share_must_be_the_users_own_even_when_trusted(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    problems = _problems(tmp_path, "      - {host: open, mount: /mnt/a, writable: true}\n")
    assert "of a writable share is not yours" in problems[0]
    with pytest.raises(LabFileError, match="writable share is not yours"):
        load_lab(_lab(tmp_path, "      - {host: open, mount: /mnt/a, writable: true}\n"), trusted=[d])


def test_each_up_exports_a_new_directory_for_a_writable_share(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "authorized_keys").write_text("mine\n")
    gdir = tmp_path / "run" / "a"
    gdir.mkdir(parents=True)
    shares = (Share(tmp_path / "ro", "/mnt/ro"), Share(tmp_path / "out", "/mnt/out", True))
    make_directories(gdir, "lab@ann", "a", shares)
    made = directories(gdir, shares)
    assert made[0] == tmp_path / "ro"
    assert made[1].parent == tmp_path / "out" and made[1].name.startswith("lab@ann-a-")
    assert list(made[1].iterdir()) == [] and made[1].stat().st_mode & 0o777 == 0o700
    assert (gdir / "share1").resolve() == made[1]
    make_directories(gdir, "lab@ann", "a", shares)  # the next up (the same second): another one
    assert directories(gdir, shares)[1] != made[1] and made[1].is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_lab_file_of_another_user_names_only_directories_that_user_owns_and_reads(tmp_path: Path) -> None:
    nobody = 65534
    (tmp_path / "roots").mkdir()
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", nobody, nobody)
    lab = _lab(tmp_path, "      - {host: roots, mount: /mnt/a}\n      - {host: theirs, mount: /mnt/b}\n")
    os.chown(lab, nobody, nobody)
    with pytest.raises(LabFileError) as info:
        load_lab(lab, trusted=[tmp_path])
    text = "\n".join(str(p) for p in info.value.problems)
    assert "shares[0].host: host directory" in text and "belongs to root (uid 0), and the lab file to nobody" in text
    # theirs, but out of their reach (pytest's directories are root's, 0700)
    assert "shares[1].host:" in text and "the lab file's owner could not read it" in text
    os.chown(lab, 0, 0)  # the same file as root's: its owner's choice
    assert len(load_lab(lab, trusted=[tmp_path]).guests["a"].shares) == 2
