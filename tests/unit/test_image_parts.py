"""Pure parts of the image build: module order, NIC rules, cpio, guest config."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import labctl.image.cpio as initramfs
from labctl.kernel.modules import module_load_order, nic_driver_rules
from labctl.lab import load_lab
from labctl.up import guestconf

ROOT = Path(__file__).resolve().parents[2]

DEP = """kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko kernel/fs/mbcache.ko kernel/lib/crc16.ko
kernel/fs/jbd2/jbd2.ko:
kernel/fs/mbcache.ko:
kernel/lib/crc16.ko:
kernel/drivers/net/ethernet/realtek/8139cp.ko: kernel/drivers/net/mii.ko
kernel/drivers/net/mii.ko:
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
"""
ALIAS = """alias pci:v000010ECd00008139sv*sd*bc*sc*i* 8139cp
alias virtio:d00000001v* virtio_net
alias usb:v0BDAp8150d*dc*dsc*dp*ic*isc*ip*in* rtl8150
alias fs-ext4 ext4
"""


def test_dependencies_load_first() -> None:
    order = module_load_order(DEP, ["ext4"])
    assert order[-1] == "kernel/fs/ext4/ext4.ko"
    assert set(order[:-1]) == {"kernel/fs/jbd2/jbd2.ko", "kernel/fs/mbcache.ko", "kernel/lib/crc16.ko"}


def test_nic_rules_cover_pci_and_virtio_with_dependencies() -> None:
    rules, paths = nic_driver_rules(DEP, ALIAS)
    lines = rules.splitlines()
    assert "pci:v000010ECd00008139sv*sd*bc*sc*i* mii.ko 8139cp.ko" in lines
    assert "virtio:d00000001v* failover.ko net_failover.ko virtio_net.ko" in lines
    assert not any("usb:" in ln for ln in lines)
    assert "kernel/drivers/net/mii.ko" in paths


def test_cpio_is_valid_newc(tmp_path: Path) -> None:
    out = tmp_path / "x.cpio"
    initramfs.write_cpio([initramfs.directory("bin"), initramfs.file("bin/x", b"hello", 0o755),
                          initramfs.chardev("dev/console", 5, 1)], out)
    data = out.read_bytes()
    assert data.startswith(b"070701") and b"TRAILER!!!" in data
    assert len(data) % 4 == 0
    assert b"bin/x\0" in data and b"hello" in data


def test_guest_config_lines() -> None:
    lab = load_lab(ROOT / "tests" / "labs" / "valid" / "three-nics.yaml")
    text = guestconf.render(lab.guests["c"], "52:55:00:00:00:01")
    lines = text.splitlines()
    assert lines[0] == "hostname c"
    assert lines[1] == "nic 52:55:00:00:00:01 mgmt0 10.0.2.15/24"
    assert lines[2].startswith("nic 52:54:00:") and " eth1 - " in lines[2]  # its address: an "addr" record
    assert "queues=2" in lines[2]
    assert "addr 0 eth1 10.10.0.3/24" in lines
    assert not any(line.startswith("sshd ") for line in lines)
    # a boot that becomes the post-boot snapshot with nothing logging in first (guest/init)
    assert "sshd standby" in guestconf.render(lab.guests["c"], "52:55:00:00:00:01", standby_sshd=True).splitlines()


def test_prune_keeps_the_current_build(tmp_path: Path) -> None:
    import json

    from labctl.image.recipe import load_recipe
    from labctl.image.store import ImageStore

    store = ImageStore(tmp_path)
    current = load_recipe("debian-12").key()
    for key, when in ((current, "2026-01-01"), ("old1", "2026-02-01"), ("old2", "2026-03-01")):
        d = store.path_for("debian-12", key)
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"built_at": when, "kernel": {"release": "x"}}))
    removed = store.prune("debian-12", keep=2)
    assert [i.key for i in removed] == ["old1"]
    assert {i.key for i in store.list()} == {current, "old2"}
    # A build whose files a running process has open (a QEMU of another state directory) stays.
    (tmp_path / "debian-12" / "old0").mkdir()
    (tmp_path / "debian-12" / "old0" / "manifest.json").write_text('{"built_at": "2025-01-01"}')
    with open(tmp_path / "debian-12" / "old0" / "manifest.json"):
        assert [i.key for i in store.prune("debian-12", keep=1)] == ["old2"]
    assert [i.key for i in store.prune("debian-12", keep=1)] == ["old0"]  # closed: it goes


def test_a_killed_builds_work_directory_is_removed_unless_something_is_mounted(tmp_path: Path) -> None:
    from labctl.image.build import remove_stale_work

    dead = tmp_path / ".build-0123456789abcdef-999999999"  # no such pid
    (dead / "root" / "usr").mkdir(parents=True)
    mine = tmp_path / f".build-0123456789abcdef-{os.getpid()}"
    mine.mkdir()
    keep = tmp_path / "0123456789abcdef"  # a finished image
    keep.mkdir()
    assert remove_stale_work(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and keep.exists()


def test_one_build_at_a_time(tmp_path: Path) -> None:
    from labctl.errors import ImageError
    from labctl.image.build import build_lock

    with build_lock(tmp_path), pytest.raises(ImageError, match="another labctl is building"), build_lock(tmp_path):
        pass
    with build_lock(tmp_path):  # released
        pass


def test_the_agents_builtins_build_and_check_their_arguments(tmp_path: Path) -> None:
    """guest/builtins.c builds (setup.sh installs gcc and bash-builtins) into a loadable that bash
    enables; labctl_rename renames, labctl_clock refuses anything but SECONDS.NANOSECONDS (a valid
    value is set in a guest: test_warm_reset)."""
    from labctl.image.build import build_agent_builtins

    so = tmp_path / "builtins.so"
    assert build_agent_builtins(so)
    (tmp_path / "old").write_text("key\n")
    script = (f"enable -f {so} labctl_clock labctl_rename || exit 9; "
              "labctl_rename old new && [ ! -e old ] && [ \"$(< new)\" = key ] || exit 8; "
              "labctl_rename missing other 2>/dev/null && exit 7; "
              "for bad in 12 12.5 12.0000000001 x.000000000 12.00000000x -1.000000000 '' "
              "99999999999999999999.000000000; do "
              "labctl_clock \"$bad\" 2>/dev/null; [ $? = 1 ] || { echo \"accepted $bad\"; exit 6; }; done; "
              "labctl_clock 2>/dev/null; [ $? = 2 ] || exit 5; "
              "type -t labctl_clock")
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "builtin"), out.stdout + out.stderr
