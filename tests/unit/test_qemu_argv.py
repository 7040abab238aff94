"""The QEMU command line is data: built from the plan, checked here."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.backends.base import GuestPlan
from labctl.backends.qemu.argv import build_argv, opt
from labctl.backends.qemu.machines import QemuBackend
from labctl.errors import MachineError
from labctl.image.store import Image
from labctl.lab import load_lab
from labctl.lab.addresses import mgmt_mac
from labctl.net.plan import ALONE, DIRECT, SWITCH, plan_networks
from tests.conftest import fake_kernel

ROOT = Path(__file__).resolve().parents[2]


def _plans(tmp_path: Path, lab_file: Path) -> dict[str, GuestPlan]:
    lab = load_lab(lab_file)
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": ["quiet"], "kernel": {"release": "6.1"}})
    segs = plan_networks(lab, tmp_path / "net")
    plans = {}
    for i, g in enumerate(lab.guests.values()):
        ports = {n.name: next(p for p in segs[n.network].ports if p.guest == g.name and p.nic == n.name)
                 for n in g.nics}
        plans[g.name] = GuestPlan(lab.name, g, tmp_path / g.name, img, "tcg", 40000 + i,
                                  mgmt_mac(lab.name, g.name), ports, ("console=ttyS0", "quiet"),
                                  fake_kernel(tmp_path / "kernel"), tmp_path / "initrd.img")
    return plans


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_three_nic_models_become_their_qemu_devices(tmp_path: Path) -> None:
    plans = _plans(tmp_path, ROOT / "labs" / "quickstart.yaml")
    devices = {g: _pairs(build_argv(p), "-device") for g, p in plans.items()}
    assert any(d.startswith("rtl8139,netdev=lab0,mac=52:54:00:") for d in devices["a"])
    assert any(d.startswith("e1000,netdev=lab0,") for d in devices["b"])
    assert any(d.startswith("virtio-net-pci,netdev=lab0,") for d in devices["c"])


def test_management_nic_is_restricted_slirp_on_loopback(tmp_path: Path) -> None:
    plan = _plans(tmp_path, ROOT / "labs" / "quickstart.yaml")["a"]
    argv = build_argv(plan)
    (mgmt,) = [n for n in _pairs(argv, "-netdev") if n.startswith("user,")]
    assert "restrict=on" in mgmt
    assert "hostfwd=tcp:127.0.0.1:40000-:22" in mgmt
    assert f"virtio-net-pci,netdev=mgmt,mac={plan.mgmt_mac}" in _pairs(argv, "-device")
    assert plan.mgmt_mac.startswith("52:55:00:")
    qmp = _pairs(argv, "-qmp")[0]
    assert qmp.startswith("unix:") and qmp.endswith(",server=on,wait=off")
    assert _pairs(argv, "-accel") == ["tcg"]


def test_gdbstub_is_a_unix_socket_in_the_guest_directory(tmp_path: Path) -> None:
    """The gdb protocol reaches QEMU's monitor (qRcmd): never a TCP port."""
    for plan in _plans(tmp_path, ROOT / "labs" / "quickstart.yaml").values():
        argv = build_argv(plan)
        assert "-s" not in argv  # QEMU's default gdbstub on tcp::1234
        assert _pairs(argv, "-gdb") == ["chardev:gdb0"]
        assert f"socket,id=gdb0,path={plan.dir / 'gdb.sock'},server=on,wait=off" in _pairs(argv, "-chardev")
        # the only TCP anywhere is SSH's forward on 127.0.0.1
        assert [a for a in argv if "tcp:" in a] == [n for n in _pairs(argv, "-netdev") if n.startswith("user,")]


def test_three_members_share_a_switch_two_link_directly(tmp_path: Path) -> None:
    lab = load_lab(ROOT / "labs" / "quickstart.yaml")
    seg = plan_networks(lab, tmp_path)["lan"]
    assert seg.mechanism == SWITCH
    assert {p.remote for p in seg.ports} == {seg.switch_socket}
    assert len({p.local for p in seg.ports}) == 3
    two = tmp_path / "two.yaml"
    two.write_text("name: two\nnetworks: {l: {}, lone: {}}\nguests:\n"
                   "  a: {nics: [{name: e0, model: e1000, network: l}, {name: e1, model: e1000, network: lone}]}\n"
                   "  b: {nics: [{name: e0, model: e1000, network: l}]}\n")
    segs = plan_networks(load_lab(two), tmp_path)
    a, b = segs["l"].ports
    assert segs["l"].mechanism == DIRECT and a.remote == b.local and b.remote == a.local
    assert segs["lone"].mechanism == ALONE


def test_commas_in_paths_are_escaped() -> None:
    assert opt("/tmp/a,b") == "/tmp/a,,b"


def test_macs_are_deterministic(tmp_path: Path) -> None:
    a = _plans(tmp_path, ROOT / "labs" / "quickstart.yaml")
    b = _plans(tmp_path, ROOT / "labs" / "quickstart.yaml")
    assert build_argv(a["c"]) == build_argv(b["c"])
    assert mgmt_mac("x", "a") != mgmt_mac("x", "b")


def test_qemu_runs_under_its_strictest_sandbox(tmp_path: Path) -> None:
    for plan in _plans(tmp_path, ROOT / "labs" / "quickstart.yaml").values():
        (sandbox,) = _pairs(build_argv(plan), "-sandbox")
        assert sandbox.split(",") == ["on", "obsolete=deny", "elevateprivileges=deny", "spawn=deny",
                                      "resourcecontrol=deny"]


def test_control_channels_for_warm_start_are_private_files_and_the_console_appends(tmp_path: Path) -> None:
    import dataclasses

    plan = _plans(tmp_path, ROOT / "labs" / "quickstart.yaml")["a"]
    argv = build_argv(plan)
    chardevs = _pairs(argv, "-chardev")
    # the agent's FIFOs (agent.in, agent.out): a pipe chardev, always open, so the idle agent blocks
    assert f"pipe,id=agent0,path={plan.dir / 'agent'}" in chardevs
    assert "virtserialport,bus=vser0.0,chardev=agent0,name=org.labctl.agent.0" in _pairs(argv, "-device")
    # a restored guest's console begins with the boot its snapshot was taken after: QEMU appends
    assert f"file,id=serial0,path={plan.console},append=on" in chardevs
    assert _pairs(argv, "-serial") == ["chardev:serial0"]
    assert "-incoming" not in argv
    warm = build_argv(dataclasses.replace(plan, warm=True))
    assert _pairs(warm, "-incoming") == ["defer"]
    # the same machine, waiting for its state, its RAM file mapped privately (a boot's shared)
    assert warm[:len(argv)] == [a.replace("share=on", "share=off") for a in argv]


def test_a_restart_keeps_the_command_line_and_toggles_incoming(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from labctl.backends.base import GuestRecord
    from labctl.backends.qemu.machines import QemuBackend

    launched: list[list[str]] = []
    passed: list[list[int] | None] = []
    monkeypatch.setattr(QemuBackend, "_launch",
                        lambda self, rec, fds=None: launched.append(rec.argv) or passed.append(fds) or rec)
    rec = GuestRecord("a", "qemu", 1, str(tmp_path), "c", "q", 1, "tcg", argv=["qemu", "-m", "512", "-incoming", "defer"])
    QemuBackend().restart(rec, incoming=False)
    QemuBackend().restart(rec, incoming=True)
    assert launched == [["qemu", "-m", "512"], ["qemu", "-m", "512", "-incoming", "defer"]]

    # A guest on taps: its netdevs name the queues opened again, which QEMU inherits.
    launched.clear()
    passed.clear()
    tapped = GuestRecord("b", "qemu", 1, str(tmp_path), "c", "q", 1, "tcg", argv=[
        "qemu", "-netdev", "tap,id=lab0,fds=5:6,vhost=off", "-device", "virtio-net-pci,netdev=lab0,mq=on,vectors=6",
        "-netdev", "tap,id=lab1,fd=7,vhost=off"])
    QemuBackend().restart(tapped, incoming=True, taps={"lab0": (11, 12), "lab1": (13,)})
    assert launched == [["qemu", "-netdev", "tap,id=lab0,fds=11:12,vhost=off", "-device",
                         "virtio-net-pci,netdev=lab0,mq=on,vectors=6", "-netdev", "tap,id=lab1,fd=13,vhost=off",
                         "-incoming", "defer"]]
    assert passed == [[11, 12, 13]]
    with pytest.raises(MachineError, match="netdev lab1 was not opened again"):
        QemuBackend().restart(tapped, incoming=True, taps={"lab0": (11, 12)})


def test_snapshot_keys_are_shared_by_instances_and_follow_the_lab(tmp_path: Path) -> None:
    import dataclasses

    from labctl.up.snapshots import key as snapshot_key

    def key(plan: GuestPlan) -> str:
        return snapshot_key(plan, QemuBackend())

    lab = ROOT / "labs" / "quickstart.yaml"
    plan = _plans(tmp_path / "labs" / "quickstart" / "guests", lab)["a"]
    twin = dataclasses.replace(_plans(tmp_path / "labs" / "quickstart@bob" / "guests", lab)["a"],
                               lab="quickstart@bob", ssh_port=41234)
    assert key(twin) == key(plan)  # another instance, run directory and SSH port: the same snapshot
    nic = dataclasses.replace(plan.guest.nics[0], model="e1000")
    assert key(dataclasses.replace(plan, guest=dataclasses.replace(plan.guest, nics=(nic,)))) != key(plan)
    assert key(dataclasses.replace(plan, guest=dataclasses.replace(plan.guest, memory=1024))) != key(plan)


def test_multiqueue_network_is_taps_on_a_bridge_only_when_allowed(tmp_path: Path) -> None:
    """queues: 2 makes the rps lab's 'multi' network a tap network (root, qemu backend); the
    other network stays a direct link, and without taps everything is dgram."""
    from labctl.net.plan import TAP, TapDev

    lab = load_lab(ROOT / "labs" / "rps.yaml")
    segs = plan_networks(lab, tmp_path, taps=True)
    assert segs["single"].mechanism == DIRECT and segs["multi"].mechanism == TAP
    devs = [p.local for p in segs["multi"].ports]
    assert devs == [TapDev("lt1m0", "lb1", 2), TapDev("lt1m1", "lb1", 2)]
    assert all(len(d.name) <= 15 for d in devs)
    assert {s.mechanism for s in plan_networks(lab, tmp_path).values()} == {DIRECT}
    assert "lt1m1 on bridge lb1 (2 queues)" in str(segs["multi"].to_dict()["ports"])


def test_tap_netdev_takes_the_inherited_queues_and_virtio_gets_mq(tmp_path: Path) -> None:
    import dataclasses

    from labctl.backends.qemu.argv import lab_nic_args
    from labctl.net.plan import TapDev

    lab = load_lab(ROOT / "labs" / "rps.yaml")
    port = plan_networks(lab, tmp_path, taps=True)["multi"].ports[1]
    port = dataclasses.replace(port, local=dataclasses.replace(port.local, fds=(7, 8)))
    assert isinstance(port.local, TapDev)
    nic = lab.guests["receiver"].nic("eth2")
    assert lab_nic_args(nic, port) == ["-netdev", "tap,id=lab1,fds=7:8,vhost=off",
                                       "-device", f"virtio-net-pci,netdev=lab1,mac={nic.mac},mq=on,vectors=6"]
    single = dataclasses.replace(port, local=dataclasses.replace(port.local, queues=1, fds=(9,)))
    assert lab_nic_args(nic, single)[1] == "tap,id=lab1,fd=9,vhost=off"
    assert not lab_nic_args(nic, single)[3].endswith("vectors=6")
