"""QEMU runs as libvirt's unprivileged user on qemu:///system, and the lab still works.

One lab of three guests on this machine's libvirtd: a direct link between a
and b (unix dgram sockets) and a switched network of a, b and c (labctl's
switch). The test reads QEMU's real and effective uid from /proc, checks that
every control channel (gdbstub socket, link sockets, switch socket, the
guest's volumes) is reachable only by QEMU's user and root, pings over both
networks, attaches gdb, and after ``down`` finds nothing of the lab: no
domain, no volume of it in the pool, no directory of it on the host.

QEMU's user is what libvirt says (the DAC base label in its capabilities),
never an assumed uid. Lab names carry this process's pid: libvirt domain
names are global to libvirtd, which other test runs on the machine share.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from labctl.image.store import Image
from labctl.kernel.cached import Kernel
from labctl.state.runstate import LabState
from tests import harness
from tests.conftest import Cli
from tests.integration.conftest import pids_matching, pool_volumes_of, require_libvirtd, virsh

#: One worker for libvirt's tests: they share libvirtd's pool and its kernel volumes
#: (an up on one worker lost its kernel volume to the other worker's libvirt test once).
pytestmark = pytest.mark.xdist_group("libvirt")

URI = "qemu:///system"
POOL_DIR = Path("/var/lib/libvirt/labctl")
RUN_ROOT = Path("/var/lib/libvirt/labctl-run")
NAME = f"lvu{harness.RUN_ID}"  # lab names are global on a libvirt host: this run's own
LAB = f"""\
name: {NAME}
networks:
  link: {{}}
  lan: {{}}
guests:
  a:
    memory: 320
    nics:
      - {{name: eth1, model: e1000, network: link, ip: 10.61.0.1/24}}
      - {{name: eth2, model: virtio-net-pci, network: lan, ip: 10.62.0.1/24}}
  b:
    memory: 320
    nics:
      - {{name: eth1, model: virtio-net-pci, network: link, ip: 10.61.0.2/24}}
      - {{name: eth2, model: e1000, network: lan, ip: 10.62.0.2/24}}
  c:
    memory: 320
    nics: [{{name: eth1, model: virtio-net-pci, network: lan, ip: 10.62.0.3/24}}]
"""


@pytest.fixture
def libvirtd() -> tuple[int, int]:
    """QEMU's (uid, gid) on qemu:///system, from libvirt's capabilities; skip without libvirtd or root."""
    require_libvirtd(URI)
    if os.geteuid() != 0:
        pytest.skip("qemu:///system and the host's labctl-run directory need root")
    caps = virsh("capabilities", uri=URI)
    assert caps.returncode == 0, caps.stderr
    m = re.search(r"<model>dac</model>.*?<baselabel type='qemu'>\+(\d+):\+(\d+)</baselabel>", caps.stdout, re.DOTALL)
    assert m, "libvirt reports no DAC base label"
    return int(m.group(1)), int(m.group(2))


def _status_ids(pid: int) -> dict[str, list[int]]:
    """Uid/Gid lines of /proc/PID/status: [real, effective, saved, filesystem]."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: [int(x) for x in v.split()] for k, v in (ln.split(":", 1) for ln in lines) if k in ("Uid", "Gid")}


def _leftovers() -> dict[str, list[str]]:
    """Everything of the lab still on this host: domains, pool volumes, directories, QEMUs, switches."""
    prefix = f"labctl-{NAME}-"
    domains = virsh("list", "--all", "--name", uri=URI).stdout.split()
    return {"domains": [d for d in domains if d.startswith(prefix)],
            "volumes": sorted(p.name for p in POOL_DIR.glob(prefix + "*")),
            "dirs": sorted(p.name for p in RUN_ROOT.glob(f"*{NAME}*")),
            "qemu": [str(p) for p in pids_matching(f"qemu-system.*guest={prefix}")],
            "switch": [str(p) for p in pids_matching(f"labctl.net.switch {RUN_ROOT}/{NAME}.net/")]}


NOTHING: dict[str, list[str]] = {"domains": [], "volumes": [], "dirs": [], "qemu": [], "switch": []}


def _private(path: Path, uid: int, mode: int) -> None:
    """``path`` belongs to QEMU's user and nobody else may use it (``mode``)."""
    st = os.lstat(path)
    assert (st.st_uid, stat.S_IMODE(st.st_mode) & 0o077) == (uid, 0), f"{path}: {st.st_uid} {st.st_mode:o}"
    assert stat.S_IMODE(st.st_mode) & 0o700 == mode & 0o700, f"{path}: {st.st_mode:o}"


def test_qemu_runs_unprivileged_and_the_lab_works(cli: Cli, image: Image, kernel: Kernel, libvirtd: tuple[int, int],
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uid, gid = libvirtd
    assert uid != 0, ("libvirt runs QEMU as root here: run scripts/libvirt-setup.sh "
                      "(it takes out the old 'QEMU as root' setting)")
    assert _leftovers() == NOTHING
    volumes = pool_volumes_of(image, kernel)
    for vol in volumes:  # make this run place the image: on this machine, a hard link
        for name in (vol, vol + ".sha256"):
            if (POOL_DIR / name).exists():
                assert virsh("vol-delete", name, "--pool", "labctl", uri=URI).returncode == 0
    lab = tmp_path / "user.yaml"
    lab.write_text(LAB)
    up = cli("up", str(lab), "--backend", "libvirt", "--accel", "tcg", timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        monkeypatch.setenv("LABCTL_STATE_DIR", str(cli.state_dir))
        state = LabState.load(NAME)
        assert state.networks["link"]["mechanism"] == "unix-dgram" and state.networks["lan"]["mechanism"] == "switch"
        assert state.uploads == []  # nothing was sent: the image volumes are the cached files themselves
        for vol, (cached, sha) in volumes.items():
            assert (POOL_DIR / vol).stat().st_ino == cached.stat().st_ino, vol
            assert (POOL_DIR / (vol + ".sha256")).read_text().split()[0] == sha

        # QEMU's real and effective uid (and gid) are libvirt's unprivileged user's
        for name, rec in state.guests.items():
            assert rec.pid > 0, name
            ids = _status_ids(rec.pid)
            assert ids["Uid"][:2] == [uid, uid], f"QEMU of {name} runs as uid {ids['Uid']}, not {uid}"
            assert ids["Gid"][:2] == [gid, gid], f"QEMU of {name} runs as gid {ids['Gid']}, not {gid}"
            assert rec.extra["qemu_user"] == f"+{uid}:+{gid}"

        # every control channel is QEMU's user's (and root's) alone
        net = RUN_ROOT / f"{NAME}.net"
        _private(net, uid, 0o700)
        switch = net / "n1-switch.sock"
        _private(switch, uid, 0o600)
        (sw,) = state.switches
        assert _status_ids(sw.pid)["Uid"][:2] == [uid, uid]  # the switch gave up root too
        for name, rec in state.guests.items():
            assert rec.gdb == f"{RUN_ROOT}/labctl-{NAME}-{name}/gdb.sock"
            _private(Path(rec.gdb).parent, uid, 0o700)
            for vol in rec.extra["volumes"]:
                _private(Path(vol), uid, 0o600)
            domxml = virsh("dumpxml", f"labctl-{NAME}-{name}", uri=URI).stdout
            assert f"<label>+{uid}:+{gid}</label>" in domxml and "relabel='no'" in domxml
            kernel = re.search(r"<kernel>(.*)</kernel>", domxml)
            assert kernel and os.stat(kernel.group(1)).st_uid == 0  # the shared image stays root's
        assert stat.S_IMODE(RUN_ROOT.stat().st_mode) == 0o711 and RUN_ROOT.stat().st_uid == 0

        # the lab still works: a direct link, a switched network, gdb
        for guest, peer in (("a", "10.61.0.2"), ("b", "10.61.0.1"), ("a", "10.62.0.3"),
                            ("c", "10.62.0.2"), ("b", "10.62.0.1")):
            ping = cli("exec", NAME, guest, "--", "ping", "-c", "2", "-W", "5", peer)
            assert ping.returncode == 0, f"{guest} -> {peer}: {ping.stdout}{ping.stderr}"
        gdb = cli("gdb", NAME, "b", "--batch", "info registers rip", timeout=300)
        assert gdb.returncode == 0, gdb.stdout + gdb.stderr
        assert re.search(r"^rip\s+0xffffffff[0-9a-f]+", gdb.stdout, re.MULTILINE), gdb.stdout
        assert "detached" in gdb.stdout.lower()
        st = json.loads(cli("status", "--json", check=True).stdout)["labs"][0]
        assert {g["name"]: g["state"] for g in st["guests"]} == {"a": "running", "b": "running", "c": "running"}
    finally:
        down = cli("down", NAME, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _leftovers() == NOTHING
    assert not (cli.state_dir / "labs" / NAME).exists()
    assert all((POOL_DIR / v).exists() for v in volumes)  # the image stays, as a cache


def test_two_labs_placing_the_same_volume_at_once_both_get_it(tmp_path: Path) -> None:
    """Two ups on one host place the same kernel volume at the same moment (a shared kernel): each
    gets the one verified volume. Without the lock around the check and the upload, the second took
    the first's half-uploaded volume (its marker not written yet) for a leftover and deleted it."""
    require_libvirtd(URI)
    import hashlib
    import threading

    from labctl.backends.libvirt import storage
    from labctl.backends.libvirt.api import connection

    blob = tmp_path / "kernel.bin"
    blob.write_bytes(os.urandom(24 << 20))
    sha = hashlib.sha256(blob.read_bytes()).hexdigest()
    name = f"kernel-racetest{harness.RUN_ID}-{sha[:12]}"
    results: list[object] = []

    def place() -> None:
        try:
            with connection(URI) as conn:
                pool = storage.ensure_pool(conn)
                results.append(storage.ensure_file(conn, pool, name, blob, sha, blob.stat().st_size, False))
        except Exception as exc:  # noqa: BLE001 - the test reports what either side met
            results.append(exc)

    try:
        for _ in range(3):
            threads = [threading.Thread(target=place) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            got = results[-2:]
            assert all(isinstance(r, tuple) for r in got), got
            assert {r[0] for r in got if isinstance(r, tuple)} == {str(POOL_DIR / name)}
            assert sum(r[1] is not None for r in got if isinstance(r, tuple)) <= 1  # uploaded once at most
            assert hashlib.sha256((POOL_DIR / name).read_bytes()).hexdigest() == sha
            with connection(URI) as conn:  # the next round starts from nothing again
                pool = storage.ensure_pool(conn)
                for vol in (name, name + storage.MARKER):
                    storage.delete_volume(pool, vol)
    finally:
        with connection(URI) as conn:
            pool = storage.ensure_pool(conn)
            for vol in (name, name + storage.MARKER):
                storage.delete_volume(pool, vol)
