"""One lab on two libvirt hosts: this machine's qemu:///system and a "remote"
qemu+ssh:// host that is the same libvirtd reached through an sshd the test
starts on 127.0.0.1 with throwaway keys. The remote guest's image goes
through the upload path (storage pool, stream API, sha256), its console
through libvirt's console stream, its SSH through the host's sshd, and the
two guests are linked by a UDP tunnel.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labctl.debug.gdb import GdbSpec, gdb_target, run_breakpoint_session
from labctl.image.store import Image
from labctl.kernel.cached import Kernel
from labctl.state.runstate import LabState
from tests import harness
from tests.conftest import Cli, interrupt
from tests.integration.conftest import pids_matching, pool_volumes_of, require_libvirtd, virsh, wait_for

#: One worker for libvirt's tests: they share libvirtd's pool and its kernel volumes
#: (an up on one worker lost its kernel volume to the other worker's libvirt test once).
pytestmark = pytest.mark.xdist_group("libvirt")

LOCAL = "qemu:///system"
POOL = "labctl"
POOL_DIR = Path("/var/lib/libvirt/labctl")
RUN_ROOT = Path("/var/lib/libvirt/labctl-run")
KNOWN_HOSTS = Path.home() / ".ssh" / "known_hosts"


def _virsh(*args: str, uri: str = LOCAL) -> subprocess.CompletedProcess[str]:
    return virsh(*args, uri=uri)


@pytest.fixture
def libvirtd() -> None:
    """Skip unless libvirtd answers on qemu:///system and the test runs as root."""
    require_libvirtd(LOCAL)
    if os.geteuid() != 0:
        pytest.skip("the two-host test runs sshd and libvirt's qemu:///system as root")


@dataclass
class Sshd:
    port: int
    key: Path

    @property
    def uri(self) -> str:
        return f"qemu+ssh://root@127.0.0.1:{self.port}/system?keyfile={self.key}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sshd(libvirtd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """An sshd on 127.0.0.1 with a throwaway host key and client key; root logs in by key only."""
    if not Path("/usr/sbin/sshd").exists():
        pytest.fail("/usr/sbin/sshd is missing: run scripts/libvirt-setup.sh (it installs openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "PidFile none\nAllowTcpForwarding yes\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    had_known_hosts = KNOWN_HOSTS.exists()
    log = open(d / "sshd.log", "wb")  # noqa: SIM115 - open while sshd runs, closed with it
    proc = harness.popen(["/usr/sbin/sshd", "-f", str(d / "sshd_config"), "-D", "-e"],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # it gets SIGTERM
    try:
        wait_for(lambda: _accepts(port) or proc.poll() is not None, 30, "sshd to listen")
        assert proc.poll() is None, (d / "sshd.log").read_text()
        yield Sshd(port, d / "client_key")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        # libvirt's ssh (--no-verify-host-keys: no_verify=1) recorded the throwaway host key: take it out again
        subprocess.run(["ssh-keygen", "-R", f"[127.0.0.1]:{port}"], capture_output=True, check=False)
        if not had_known_hosts:
            for p in (KNOWN_HOSTS, KNOWN_HOSTS.with_name("known_hosts.old")):
                p.unlink(missing_ok=True)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# The test's sshd has a throwaway host key, and the link crosses hosts as a UDP tunnel:
# both need the user's explicit say-so on the command line (a lab file cannot give it).
INSECURE = ("--no-verify-host-keys", "--unencrypted-links")


def _lab(path: Path, name: str, remote_uri: str) -> Path:
    path.write_text(f"""\
name: {name}
hosts:
  h1: {{uri: "{LOCAL}"}}
  h2: {{uri: "{remote_uri}"}}
networks:
  link: {{}}
guests:
  a:
    host: h1
    memory: 384
    nics: [{{name: eth1, model: e1000, network: link, ip: 10.20.0.1/24}}]
  b:
    host: h2
    memory: 384
    nics: [{{name: eth1, model: virtio-net-pci, network: link, ip: 10.20.0.2/24}}]
""")
    return path


def _image_volumes(image: Image, kernel: Kernel) -> dict[str, str]:
    """volume name -> sha256 of the guest's boot files (root file system, kernel, initramfs,
    modules) in the pool."""
    return {name: digest for name, (_path, digest) in pool_volumes_of(image, kernel).items()}


def _pool_volumes() -> list[str]:
    out = _virsh("vol-list", POOL)
    if out.returncode != 0:
        return []  # no pool yet
    return [line.split()[0] for line in out.stdout.splitlines()[2:] if line.strip()]


def _leftovers(lab: str) -> dict[str, list[str]]:
    """Everything of the lab still on the host: domains, volumes, networks, its directories, QEMUs."""
    prefix = f"labctl-{lab}-"
    domains = _virsh("list", "--all", "--name").stdout.split()
    networks = _virsh("net-list", "--all", "--name").stdout.split()
    return {"domains": [d for d in domains if d.startswith(prefix)],
            "volumes": [v for v in _pool_volumes() if v.startswith(prefix)],
            "networks": [n for n in networks if lab in n],
            "dirs": sorted(p.name for p in RUN_ROOT.glob("*") if p.name.startswith((prefix, f"{lab}."))),
            "qemu": [str(p) for p in pids_matching(f"qemu-system.*guest={prefix}")]}


NOTHING: dict[str, list[str]] = {"domains": [], "volumes": [], "networks": [], "dirs": [], "qemu": []}

# Lab names are global on a libvirt host: each run of the suite has its own (harness.lab_name),
# so that what an earlier run left never meets this one.
HOSTS2, HOSTS2I, HOSTS2U = (harness.lab_name(n) for n in ("hosts2", "hosts2i", "hosts2u"))


def _one_line(text: str) -> str:
    """CLI output with the terminal's line wrapping undone."""
    return " ".join(text.split())


def test_two_hosts_ping_across_the_tunnel(cli: Cli, image: Image, kernel: Kernel, sshd: Sshd, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    lab = _lab(tmp_path / "hosts2.yaml", HOSTS2, sshd.uri)
    assert _leftovers(HOSTS2) == NOTHING
    for vol in _image_volumes(image, kernel):  # make this run take the upload path
        for name in (vol, vol + ".sha256"):
            if name in _pool_volumes():
                assert _virsh("vol-delete", name, "--pool", POOL).returncode == 0

    refused = cli("up", str(lab), "--accel", "tcg", "--no-verify-host-keys", timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr  # the link would be a plain UDP tunnel
    assert "hosts2.yaml:6: networks.link: network link would be a UDP tunnel" in _one_line(refused.stderr)
    assert _leftovers(HOSTS2) == NOTHING and not (cli.state_dir / "labs" / HOSTS2).exists()
    up = cli("up", str(lab), "--accel", "tcg", "--show-command", *INSECURE)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert "network link: udp-tunnel (a.eth1@h1 127.0.0.1:" in up.stderr
        (st,) = json.loads(cli("status", "--json", check=True).stdout)["labs"]
        assert st["backend"] == "libvirt"
        assert {g["name"]: (g["host"], g["state"]) for g in st["guests"]} == \
            {"a": ("h1", "running"), "b": ("h2", "running")}
        assert st["hosts"]["h2"]["remote"] is True and st["hosts"]["h1"]["remote"] is False
        assert st["networks"]["link"]["mechanism"] == "udp-tunnel"

        # the image reached h2 through the upload path, verified against the manifest's sums
        uploaded = " ".join(st["uploads"])
        for vol, sha in _image_volumes(image, kernel).items():
            assert f"uploaded {vol} to pool {POOL} on host h2" in uploaded, st["uploads"]
            assert vol in _pool_volumes() and vol + ".sha256" in _pool_volumes()
            assert (POOL_DIR / (vol + ".sha256")).read_text().split()[0] == sha
        assert f"labctl-{HOSTS2}-b-disk.qcow2" in _pool_volumes()
        backing = _virsh("vol-dumpxml", f"labctl-{HOSTS2}-b-disk.qcow2", "--pool", POOL).stdout
        assert "<backingStore>" in backing and "rootfs.img" in backing

        # the remote guest's console came home through the console stream
        console = (cli.state_dir / "labs" / HOSTS2 / "guests" / "b" / "console.log").read_bytes()
        assert b"LABCTL-READY b" in console

        drv = cli("exec", HOSTS2, "b", "--", "ethtool", "-i", "eth1", check=True).stdout
        assert drv.splitlines()[0] == "driver: virtio_net"
        for guest, peer in (("a", "10.20.0.2"), ("b", "10.20.0.1")):
            ping = cli("exec", HOSTS2, guest, "--", "ping", "-c", "3", "-W", "5", peer)
            assert ping.returncode == 0, f"{guest} -> {peer}: {ping.stdout}{ping.stderr}"

        # gdb reaches the remote guest's gdbstub (on h2's loopback) through ssh -W to h2
        gdb = cli("gdb", HOSTS2, "b", "--batch", "bt 1", "info symbol virtnet_poll", timeout=300)
        assert gdb.returncode == 0, gdb.stdout + gdb.stderr
        assert "#0  " in gdb.stdout and "virtnet_poll in section .text of " in gdb.stdout, gdb.stdout
        assert "detached" in gdb.stdout.lower()
        bdir = cli.state_dir / "labs" / HOSTS2 / "guests" / "b"
        script = (bdir / "gdb-init.gdb").read_text()  # through an SSH forward of the socket on h2
        assert f"target remote {bdir / 'gdb-fwd.sock'}" in script
        # and a scripted (MI) session, as a step's gdb: runs it: break, step, leave the guest running
        monkeypatch.setenv("LABCTL_STATE_DIR", str(cli.state_dir))
        # both QEMUs run as libvirt's QEMU user, as each host's capabilities say (h2 is
        # the same libvirtd, reached over SSH)
        labels = {g: LabState.load(HOSTS2).guests[g].extra["qemu_user"] for g in "ab"}
        assert labels["a"] == labels["b"] and labels["a"] != "+0:+0", labels
        target = gdb_target(LabState.load(HOSTS2), "b")
        assert target.stub.via is not None and target.stub.via.port == sshd.port
        (tmp_path / "gdb").mkdir()  # a step's output directory exists before its gdb session starts
        t = run_breakpoint_session(target.stub, target.vmlinux, [], GdbSpec("run_timer_softirq", hits=1, step=1,
                                                                            timeout=120),
                                   tmp_path / "gdb", monitor=target.monitor)
        assert (t.hits, t.timed_out, t.error) == (1, False, None), t.to_text()
        assert t.hit_stops[0].frame.func == "run_timer_softirq" and t.guest_resumed
        ping = cli("exec", HOSTS2, "b", "--", "ping", "-c", "1", "-W", "5", "10.20.0.1")
        assert ping.returncode == 0, "b no longer runs after gdb detached: " + ping.stdout + ping.stderr
    finally:
        down = cli("down", HOSTS2)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _leftovers(HOSTS2) == NOTHING
    assert pids_matching(f"labctl.backends.libvirt.relay.*{cli.state_dir}/") == []  # its own console relays
    assert not (cli.state_dir / "labs" / HOSTS2).exists()
    assert all(v in _pool_volumes() for v in _image_volumes(image, kernel))  # the image stays for later runs


def test_interrupted_up_on_two_hosts_leaves_nothing(cli: Cli, image: Image, kernel: Kernel, sshd: Sshd,
                                                    tmp_path: Path) -> None:
    lab = _lab(tmp_path / "hosts2i.yaml", HOSTS2I, sshd.uri)
    assert _leftovers(HOSTS2I) == NOTHING
    rootfs = next(POOL_DIR / v for v in _image_volumes(image, kernel) if "rootfs" in v)
    before = rootfs.stat() if (POOL_DIR / (rootfs.name + ".sha256")).exists() else None
    console = cli.state_dir / "labs" / HOSTS2I / "guests" / "b" / "console.log"
    with cli.running("up", str(lab), "--accel", "tcg", *INSECURE) as proc:
        wait_for(lambda: console.exists() and console.stat().st_size > 0 or proc.poll() is not None,
                 600, "guest b to boot on h2")
        assert proc.poll() is None, proc.communicate()
        assert sorted(_leftovers(HOSTS2I)["domains"]) == [f"labctl-{HOSTS2I}-a", f"labctl-{HOSTS2I}-b"]
        assert f"labctl-{HOSTS2I}-b-disk.qcow2" in _pool_volumes()
        if before is not None:  # already uploaded and verified: the marker made this run skip it
            after = rootfs.stat()
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        _out, err = interrupt(proc, 180)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert _leftovers(HOSTS2I) == NOTHING
    assert pids_matching(f"labctl.backends.libvirt.relay.*{cli.state_dir}/") == []  # its own console relays
    assert not (cli.state_dir / "labs" / HOSTS2I).exists()


def test_unreachable_host_is_named(cli: Cli, image: Image, libvirtd: None, tmp_path: Path) -> None:
    uri = f"qemu+ssh://root@127.0.0.1:{_free_port()}/system"
    lab = _lab(tmp_path / "hosts2u.yaml", HOSTS2U, uri)
    up = cli("up", str(lab), "--accel", "tcg", *INSECURE, timeout=300)
    assert up.returncode == 3, up.stdout + up.stderr
    assert f"host h2 ({uri}?no_verify=1) is unreachable" in _one_line(up.stderr)
    assert _leftovers(HOSTS2U) == NOTHING
    assert not (cli.state_dir / "labs" / HOSTS2U).exists()
    doctor = cli("doctor", str(lab), "--backend", "libvirt", "--json")
    assert doctor.returncode == 3
    checks = {c["check"]: c for c in json.loads(doctor.stdout)}
    assert checks[f"host h1: libvirtd ({LOCAL})"]["ok"] is True
    bad = checks[f"host h2: libvirtd ({uri})"]
    assert bad["ok"] is False and "fix:" in bad["detail"]


def test_three_guests_across_hosts_are_refused(cli: Cli, image: Image, tmp_path: Path) -> None:
    lab = tmp_path / "span3.yaml"
    lab.write_text("""\
name: span3
hosts:
  h1: {uri: "qemu:///system"}
  h2: {uri: "qemu+ssh://root@127.0.0.1:1/system"}
networks:
  lan: {}
guests:
  a: {host: h1, nics: [{name: eth1, model: e1000, network: lan}]}
  b: {host: h2, nics: [{name: eth1, model: e1000, network: lan}]}
  c: {host: h2, nics: [{name: eth1, model: e1000, network: lan}]}
""")
    up = cli("up", str(lab), "--accel", "tcg", timeout=300)
    assert up.returncode == 2, up.stdout + up.stderr
    assert "span3.yaml:6: networks.lan: network lan has 3 guests and spans hosts h1, h2" in _one_line(up.stderr)
    assert "Traceback" not in up.stderr
    assert not (cli.state_dir / "labs" / "span3").exists()
    pair = tmp_path / "span2.yaml"
    pair.write_text(lab.read_text().replace("name: span3", "name: span2").split("  c:")[0])
    qemu = cli("up", str(pair), "--backend", "qemu", "--accel", "tcg", timeout=300)
    assert qemu.returncode == 2 and "needs the libvirt backend" in _one_line(qemu.stderr), qemu.stderr
