"""QEMU as libvirt's unprivileged user: the pure pieces.

Whom QEMU runs as (read from a host's capabilities), where its files and
sockets go on the host, the commands that make and remove them, the journal
entries written before anything is made, and the switch that gives up root.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.base import GuestPlan
from labctl.backends.libvirt import api as lvapi
from labctl.backends.libvirt import domains as lvb
from labctl.backends.libvirt import host as hostfs
from labctl.backends.libvirt import host_checks, starter, storage
from labctl.backends.libvirt.host import QemuUser
from labctl.backends.libvirt.host_checks import kvm_access
from labctl.backends.owned import backends, entries, record
from labctl.errors import HostError, MachineError
from labctl.image.store import Image
from labctl.lab import load_lab_text
from labctl.lab.addresses import mgmt_mac
from labctl.lab.hosts import host_place
from labctl.net.plan import plan_networks
from tests import harness
from tests.conftest import fake_kernel

# `virsh capabilities` of this Debian 12 host (libvirt 9.0), the <secmodel> part,
# before and after scripts/libvirt-setup.sh stopped forcing root.
CAPS_ROOT = """<capabilities><host><uuid>x</uuid>
    <secmodel>
      <model>none</model>
      <doi>0</doi>
    </secmodel>
    <secmodel>
      <model>dac</model>
      <doi>0</doi>
      <baselabel type='kvm'>+0:+0</baselabel>
      <baselabel type='qemu'>+0:+0</baselabel>
    </secmodel>
</host></capabilities>"""
CAPS = CAPS_ROOT.replace("+0:+0", "+64055:+64055")  # libvirt-qemu:libvirt-qemu (it is also in group kvm)
USER = QemuUser(64055, 64055)


def test_qemus_user_is_the_dac_base_label() -> None:
    assert hostfs.dac_users(CAPS) == {"kvm": USER, "qemu": USER}
    assert hostfs.dac_users(CAPS_ROOT)["qemu"].is_root
    assert hostfs.security_models(CAPS) == ["none", "dac"]
    assert hostfs.dac_users("<capabilities><host/></capabilities>") == {}
    assert (USER.label, USER.owner) == ("+64055:+64055", "64055:64055")
    assert QemuUser.from_label("64055:64055") == USER


@pytest.mark.parametrize("label", ["libvirt-qemu:kvm", "+64055", ""])
def test_a_label_that_is_not_two_ids_is_refused(label: str) -> None:
    with pytest.raises(ValueError):
        QemuUser.from_label(label)


class _Conn:
    def __init__(self, caps: str) -> None:
        self.caps = caps

    def getCapabilities(self) -> str:
        return self.caps


def test_host_facts_name_the_host_when_it_has_no_dac_model() -> None:
    facts = lvapi.host_facts(_Conn(CAPS), "qemu:///system")
    assert facts.user == USER and facts.models == ("none", "dac")
    with pytest.raises(HostError, match="qemu:///system has no DAC security model"):
        lvapi.host_facts(_Conn("<capabilities><host/></capabilities>"), "qemu:///system")


def test_places_on_the_host() -> None:
    assert hostfs.guest_run_dir("labctl-q-a") == "/var/lib/libvirt/labctl-run/labctl-q-a"
    assert hostfs.lab_net_dir("q") == "/var/lib/libvirt/labctl-run/q.net"
    assert hostfs.is_run_dir("/var/lib/libvirt/labctl-run/q.net")
    for bad in ("/var/lib/libvirt/labctl-run", "/var/lib/libvirt/labctl-run/", "/var/lib/libvirt/labctl-run/..",
                "/var/lib/libvirt/labctl-run/a/b", "/var/lib/libvirt/labctl", "/etc"):
        assert not hostfs.is_run_dir(bad), bad
    assert hostfs.too_long(["/x" * 53, "/x" * 54]) == ["/x" * 54]  # 106 fits, 108 does not


def _sh(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_mkdir_script_makes_a_private_directory_for_qemus_user(tmp_path: Path) -> None:
    me = QemuUser(os.getuid(), os.getgid())  # chown to another user needs root; the script is the same
    parent = tmp_path / "run"
    d = str(parent / "labctl-q-a")
    assert _sh(hostfs.mkdir_argv(d, me, replace=False)).returncode == 0
    st = os.stat(d)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o700, me.uid, me.gid)
    assert stat.S_IMODE(os.stat(parent).st_mode) == 0o711  # passable, not listable
    (Path(d) / "left.sock").write_text("")
    again = _sh(hostfs.mkdir_argv(d, me, replace=False))  # someone else's: refused, untouched
    assert again.returncode == hostfs.EXISTS_STATUS and "already exists" in again.stderr
    assert (Path(d) / "left.sock").exists()
    assert _sh(hostfs.mkdir_argv(d, me, replace=True)).returncode == 0  # a leftover of this guest
    assert os.listdir(d) == []
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, Path(d) / "link")
    assert _sh(hostfs.rmdir_argv(d)).returncode == 0
    assert not os.path.exists(d) and outside.is_dir()  # rm -rf never follows a link


def test_volumes_are_made_for_qemus_user_and_the_pool_is_passable() -> None:
    vol = ET.fromstring(storage.volume_xml("v", 5, owner=(64055, 107)))
    assert [vol.findtext(f"target/permissions/{k}") for k in ("mode", "owner", "group")] == ["0600", "64055", "107"]
    pool = ET.fromstring(storage.pool_xml())
    assert pool.findtext("target/permissions/mode") == "0711"
    assert storage.pool_is_passable(0o711) and storage.pool_is_passable(0o755)
    assert not storage.pool_is_passable(0o700) and not storage.pool_is_passable(0o750)


class _Pool:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.refreshed = 0

    def XMLDesc(self, _flags: int) -> str:
        return (f"<pool type='dir'><target><path>{self.path}</path>"
                "<permissions><mode>0711</mode></permissions></target></pool>")

    def refresh(self, _flags: int) -> None:
        self.refreshed += 1


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root-owned image file is linked")
@pytest.mark.skipif(importlib.util.find_spec("libvirt") is None, reason="libvirt-python is not installed")
def test_a_local_image_volume_is_a_hard_link_of_a_root_owned_read_only_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    markers: dict[str, bytes] = {}
    monkeypatch.setattr(storage, "upload_bytes", lambda _c, _p, name, data, **_kw: markers.update({name: data}))
    pool = _Pool(tmp_path / "pool")
    pool.path.mkdir()
    src = tmp_path / "rootfs.img"
    src.write_bytes(b"x" * 100)
    src.chmod(0o644)
    assert storage.link_file(None, pool, "img-rootfs.img-c", src, "c" * 64)
    assert os.stat(pool.path / "img-rootfs.img-c").st_ino == os.stat(src).st_ino and pool.refreshed == 1
    assert markers["img-rootfs.img-c.sha256"].split()[0] == b"c" * 64
    private = tmp_path / "private.img"
    private.write_bytes(b"y")
    private.chmod(0o600)  # QEMU's user could not read it: upload a 0644 copy instead
    assert not storage.link_file(None, pool, "p", private, "d" * 64)
    writable = tmp_path / "w.img"
    writable.write_bytes(b"z")
    writable.chmod(0o666)
    assert not storage.link_file(None, pool, "w", writable, "e" * 64)
    assert sorted(os.listdir(pool.path)) == ["img-rootfs.img-c"]


def _lab_plan(tmp_path: Path, lab: str = "q", guest: str = "a") -> GuestPlan:
    text = (f"name: {lab}\nbackend: libvirt\nnetworks: {{l: {{}}}}\nguests:\n"
            f"  {guest}: {{nics: [{{name: eth1, model: e1000, network: l}}]}}\n"
            f"  b: {{nics: [{{name: eth1, model: e1000, network: l}}]}}\n")
    lab_ = load_lab_text(text, "t.yaml")
    seg = plan_networks(lab_, Path(hostfs.lab_net_dir(lab)))["l"]
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": [], "kernel": {"release": "6.1"}})
    host = host_place("local", "qemu:///system")
    return GuestPlan(lab, lab_.guests[guest], tmp_path / "guests" / guest, img, "tcg", 40000,
                     mgmt_mac(lab, guest), {"eth1": seg.ports[0]}, ("console=ttyS0",),
                     fake_kernel(tmp_path / "kernel"), tmp_path / "initrd.img", host=host)


def test_socket_paths_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    lvapi.check_socket_paths(_lab_plan(tmp_path))
    with pytest.raises(MachineError, match="longer than 107 bytes"):
        lvapi.check_socket_paths(_lab_plan(tmp_path, lab="l" * 32, guest="g" * 31))


def _backend(monkeypatch: pytest.MonkeyPatch, status: int) -> tuple[lvb.LibvirtBackend, list[Any]]:
    """A backend whose host commands are recorded (with the journal as it was then) and answer ``status``."""
    calls: list[Any] = []

    def fake_run(host: Any, argv: list[str], timeout: float = 30.0) -> tuple[int, str]:
        calls.append((host.uri, argv, entries(journal[0])))
        return (status, "") if "sh" in argv[:1] else (0, "")

    journal: list[Path] = []
    monkeypatch.setattr(starter, "host_run", fake_run)
    monkeypatch.setattr(lvapi, "host_run", fake_run)  # host_command reaches it there
    backend = lvb.LibvirtBackend()
    backend.starter._facts["qemu:///system"] = lvapi.HostFacts(USER, ("none", "dac"))
    return backend, [calls, journal]


def test_the_labs_socket_directory_is_journaled_before_it_is_made(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    backend, (calls, journal) = _backend(monkeypatch, 0)
    journal.append(tmp_path)
    hosts = {"a": host_place("local", "qemu:///system"), "b": host_place("local", "qemu:///system")}
    net = backend.network_dir(tmp_path, "q", hosts)
    assert (str(net.path), net.owner) == ("/var/lib/libvirt/labctl-run/q.net", (64055, 64055))
    entry = {"backend": "libvirt", "kind": "host-dir", "uri": "qemu:///system", "host": "local",
             "path": "/var/lib/libvirt/labctl-run/q.net"}
    ((uri, argv, journal_then),) = calls
    assert uri == "qemu:///system" and argv == hostfs.mkdir_argv(str(net.path), USER, replace=False)
    assert journal_then == [entry]  # written before the directory was made
    assert backends(tmp_path) == {"libvirt": [tmp_path]}  # the lab's own journal is released too
    backend.cleanup(tmp_path)
    assert calls[-1][1] == ["rm", "-rf", "--", "/var/lib/libvirt/labctl-run/q.net"]


def test_a_socket_directory_of_another_lab_is_refused_and_never_removed(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    backend, (calls, journal) = _backend(monkeypatch, hostfs.EXISTS_STATUS)
    journal.append(tmp_path)
    with pytest.raises(HostError, match="q.net already exists on host local") as info:
        backend.network_dir(tmp_path, "q", {"a": host_place("local", "qemu:///system")})
    assert info.value.hint and "remove /var/lib/libvirt/labctl-run/q.net" in info.value.hint
    assert entries(tmp_path) == []  # not ours: cleanup must not remove it
    backend.cleanup(tmp_path)
    assert len(calls) == 1


def test_a_lab_without_local_guests_needs_no_directory_on_a_host(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    backend, (calls, _journal) = _backend(monkeypatch, 0)
    remote = "qemu+ssh://root@lab2/system"
    net = backend.network_dir(tmp_path, "q", {"a": host_place("h2", remote)})
    assert net.path == tmp_path / "net" and net.owner is None and calls == []


def test_only_directories_below_the_run_root_are_ever_removed(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    backend, (calls, journal) = _backend(monkeypatch, 0)
    journal.append(tmp_path)
    for path in ("/var/lib/libvirt/labctl-run/labctl-q-a", "/", "/var/lib/libvirt/labctl-run/../x"):
        record(tmp_path, {"backend": "libvirt", "kind": "host-dir", "uri": "qemu:///system", "path": path})
    record(tmp_path, {"backend": "libvirt", "kind": "remote-dir", "uri": "qemu+ssh://lab2/system",
                      "host": "h2", "path": "/var/lib/libvirt/labctl-run/labctl-q-b"})  # an older journal
    backend.cleanup(tmp_path)
    assert [(c[0], c[1][-1]) for c in calls] == [
        ("qemu+ssh://lab2/system", "/var/lib/libvirt/labctl-run/labctl-q-b"),
        ("qemu:///system", "/var/lib/libvirt/labctl-run/labctl-q-a")]


def test_kvm_access_follows_owner_group_and_mode(tmp_path: Path) -> None:
    dev = tmp_path / "kvm"
    dev.write_text("")
    me = QemuUser(os.getuid(), os.getgid())
    other = QemuUser(os.getuid() + 12345, os.getgid() + 12345)
    dev.chmod(0o600)
    assert kvm_access(me, str(dev)) is True or me.is_root
    assert kvm_access(other, str(dev)) is False
    dev.chmod(0o666)
    assert kvm_access(other, str(dev)) is True
    os.chown(dev, -1, other.gid) if os.geteuid() == 0 else None
    dev.chmod(0o660)
    assert kvm_access(other, str(dev)) is (os.geteuid() == 0)  # group rw, as udev makes /dev/kvm
    assert kvm_access(other, str(tmp_path / "none")) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_the_switch_gives_up_root_before_it_binds() -> None:
    nobody = QemuUser(65534, 65534)
    base = Path(tempfile.mkdtemp(prefix="labctl-hub-"))  # pytest's tmp_path is in root's 0700 directory
    base.chmod(0o711)
    net = base / "q.net"
    net.mkdir(mode=0o700)
    os.chown(net, nobody.uid, nobody.gid)
    sock = net / "n0-switch.sock"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = harness.popen([sys.executable, "-m", "labctl.net.switch", str(sock), "--user", nobody.owner], env=env,
                         stderr=subprocess.PIPE)  # it gets SIGTERM
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.02)
        status = dict(line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines())
        assert status["Uid"].split() == ["65534"] * 4 and status["Gid"].split() == ["65534"] * 4
        assert status["Groups"].strip() == ""
        st = os.lstat(sock)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o600)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:  # root still reaches it
            s.sendto(b"\xff" * 14, str(sock))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    try:
        assert not sock.exists()  # it removed its own socket as that user
    finally:
        shutil.rmtree(base)


def test_doctor_says_whom_qemu_runs_as_and_why_root_is_weaker(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import contextmanager

    caps = [CAPS_ROOT]

    @contextmanager
    def fake_connection(_uri: str, _host: str | None = None) -> Any:
        yield _Conn(caps[0])

    monkeypatch.setattr(host_checks, "connection", fake_connection)
    root = host_checks.check_qemu_user("qemu+ssh://root@lab2/system", "h2")
    assert (root.name, root.ok, root.warn) == ("host h2: QEMU's user", True, True)
    assert root.detail.startswith("root (uid 0, gid 0): weaker, because a guest that escapes QEMU")
    assert "fix: drop user/group" in root.detail
    caps[0] = CAPS
    user = host_checks.check_qemu_user("qemu+ssh://root@lab2/system", "h2")
    assert (user.ok, user.warn) == (True, False) and user.detail.startswith("uid 64055, gid 64055, not root")
