"""Training courses, end to end: warm start from post-boot snapshots, reset of a crashed guest
while its neighbours run, checkpoints, instances side by side, the capacity refusal."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.up.agent import channel_of, set_clock
from labctl.up.warm import adopt
from tests.conftest import Cli
from tests.integration.conftest import qemu_pids_under, reset_while_pinging

OVER_3_MIN = ("seven labs of two or three TCG guests, each booted cold once to save its post-boot snapshots, then "
              "warm starts, resets, a checkpoint, two instances and a kernel without the agent (190 s on a fresh "
              "machine, where no snapshot is cached yet)")

LAB = """\
name: {name}
networks:
  lan: {{}}
  wire: {{}}
guests:
  a:
    nics:
      - {{name: eth1, model: e1000, network: lan, ip: 10.61.0.1/24}}
      - {{name: eth2, model: virtio-net-pci, network: wire, ip: 10.62.0.1/24}}
  b:
    nics:
      - {{name: eth1, model: rtl8139, network: lan, ip: 10.61.0.2/24}}
      - {{name: eth2, model: virtio-net-pci, network: wire, ip: 10.62.0.2/24}}
  c:
    nics:
      - {{name: eth1, model: virtio-net-pci, network: lan, ip: 10.61.0.3/24}}
"""
#: Every test here that brings this topology up names it "warm": after the first boot, the others start
#: from its post-boot snapshots (the snapshot's key holds the lab's name), as a class's instances do.
LINKS = {"a": ["10.61.0.2", "10.61.0.3", "10.62.0.2"], "b": ["10.61.0.1", "10.61.0.3", "10.62.0.1"],
         "c": ["10.61.0.1", "10.61.0.2"]}
DRIVERS = {"a": {"eth1": "e1000", "eth2": "virtio_net"}, "b": {"eth1": {"8139cp", "8139too"}, "eth2": "virtio_net"},
           "c": {"eth1": "virtio_net"}}


def _lab(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(LAB.format(name=name))
    return path


@contextlib.contextmanager
def _down_after(cli: Cli, *labs: str) -> Iterator[None]:
    """The block, then ``down`` of each lab that is still up."""
    try:
        yield
    finally:
        for lab in labs:
            if (cli.state_dir / "labs" / lab).exists():
                assert cli("down", lab).returncode == 0


def _status(cli: Cli, lab: str) -> dict:
    (data,) = json.loads(cli("status", lab, "--json", check=True).stdout)["labs"]
    return data


def _same_lab_checks(cli: Cli, lab: str) -> dict:
    """Pings on every link, drivers, SSH, clock (one exec a guest); the status table as a comparable dict."""
    for guest, addrs in LINKS.items():
        nics = list(DRIVERS[guest])
        script = (f"for ip in {' '.join(addrs)}; do ping -c 1 -W 3 $ip >/dev/null && echo ping $ip ok; done; "
                  f"for nic in {' '.join(nics)}; do echo $nic $(ethtool -i $nic | head -1); done; date +%s.%N")
        before = time.time()
        out = cli("exec", lab, guest, "--", script, check=True).stdout.splitlines()
        after = time.time()
        for ip in addrs:
            assert f"ping {ip} ok" in out, f"{lab}: {guest} -> {ip}: {out}"
        for line in out:
            nic, _, rest = line.partition(" driver: ")
            if nic in DRIVERS[guest]:
                want = DRIVERS[guest][nic]
                assert rest in (want if isinstance(want, set) else {want}), (guest, nic, line)
                nics.remove(nic)
        assert nics == [], (guest, out)
        # The guest clock is the host's (a restored guest's stopped when it was saved).
        guest_now = float(out[-1])
        if not before - 1.0 <= guest_now <= after + 1.0:
            why = cli("exec", lab, guest, "--", "dmesg | grep -i 'tsc\\|rtc\\|clocksource'; cat /proc/uptime").stdout
            raise AssertionError(f"{lab} {guest}: clock {guest_now - before:+.3f} s from the exec's start, "
                                 f"{guest_now - after:+.3f} s from its end (1 s allowed)\n{why}")
    status = _status(cli, lab)
    return {g["name"]: {"state": g["state"], "nics": g["nics"], "kernel": g["kernel"]["release"]}
            for g in status["guests"]}


STANDBY = "-h /run/labctl-sshd/host_key"  # the standby sshd's command line (guest/init)


def _listener(cli: Cli, lab: str, guest: str) -> str:
    """The command line of the guest's listening sshd (its pid file's)."""
    return cli("exec", lab, guest, "--", "tr '\\0' ' ' < /proc/$(cat /run/sshd.pid)/cmdline", check=True).stdout


def test_a_warm_up_is_indistinguishable_from_a_cold_one(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = _lab(tmp_path, "warm")
    up = cli("up", str(lab), "--accel", "tcg", "--cold")
    assert up.returncode == 0, up.stderr
    with _down_after(cli, "warm"):
        assert {g["started_from"] for g in _status(cli, "warm")["guests"]} == {"boot"}
        cold = _same_lab_checks(cli, "warm")
        # A boot's clock is the RTC's, 0 to 2 s behind (QEMU starts it at a whole second, the kernel
        # reads it whole): up set it to the host's through the agent (guest/init marks each clock line).
        marks = cli("exec", "warm", "a", "--", "cat /run/labctl-boot.log; touch /root/cold-only", check=True).stdout
        assert [m.split()[1:] for m in marks.splitlines()].count(["clock"]) == 1, marks

    up = cli("up", str(lab), "--accel", "tcg")
    assert up.returncode == 0, up.stderr
    with _down_after(cli, "warm"):
        status = _status(cli, "warm")
        assert {g["started_from"] for g in status["guests"]} == {"snapshot"}, status
        assert _same_lab_checks(cli, "warm") == cold
        # SSH answers with this lab's keys (a new pair each up) and the pinned host key.
        assert cli("exec", "warm", "a", "--", "test", "!", "-e", "/root/cold-only").returncode == 0
        console = (cli.state_dir / "labs" / "warm" / "guests" / "a" / "console.log").read_text()
        assert "restored from the post-boot snapshot" in console and "LABCTL-READY" in console
        # gdb follows a restored guest too.
        gdb = cli("gdb", "warm", "a", "--batch", "p init_uts_ns.name.release")
        assert gdb.returncode == 0 and "6.1.0" in gdb.stdout, gdb.stdout + gdb.stderr
        # Each guest's own host key was handed to the standby sshd waiting in its snapshot
        # (guest/init): the sshd that answers is that one, not the boot's sshd reloaded.
        for g in LINKS:
            assert STANDBY in _listener(cli, "warm", g), g
        gdir = cli.state_dir / "labs" / "warm" / "guests" / "a"
        # The agent sets the clock and renames the standby's key file with the image's own bash
        # builtins (guest/builtins.c), running no program: init, the agent's parent, loaded them.
        maps = cli("exec", "warm", "a", "--", "grep -c /usr/lib/labctl/builtins.so /proc/1/maps", check=True)
        assert int(maps.stdout) >= 1
        far = cli("exec", "warm", "a", "--", "enable -f /usr/lib/labctl/builtins.so labctl_clock && "
                  "labctl_clock 2000000000.250000000 && date +%s.%N", check=True).stdout
        assert 2000000000.25 <= float(far) < 2000000005, far
        set_clock(channel_of(gdir))  # the agent's "clock": back to the host's
        guest_now = float(cli("exec", "warm", "a", "--", "date +%s.%N", check=True).stdout)
        assert abs(guest_now - time.time()) < 1.0, guest_now - time.time()
        # Without a standby (it took over already), keys are installed again by reloading sshd,
        # and SSH still answers with the pinned key.
        adopt(gdir)
        assert STANDBY in _listener(cli, "warm", "a")
        assert cli("exec", "warm", "a", "--", "true").returncode == 0

    # --cold boots even with snapshots there.
    up = cli("up", str(lab), "--accel", "tcg", "--cold", "--json")
    assert up.returncode == 0, up.stderr
    with _down_after(cli, "warm"):
        assert {g["started_from"] for g in json.loads(up.stdout)["guests"]} == {"boot"}


ONE = """\
name: {name}
networks: {{lan: {{}}}}
guests:
  g:
    setup: ["echo {version} > /root/version"]
    nics:
      - {{name: eth1, model: virtio-net-pci, network: lan, ip: 10.63.0.1/24}}
"""


def _snapshots_of(cli: Cli, lab: str) -> dict[str, bool]:
    """The lab's post-boot snapshots (key -> in use), as ``labctl snapshot list`` shows them."""
    rows = json.loads(cli("snapshot", "list", "--json", check=True).stdout)["snapshots"]
    return {r["key"]: r["in_use"] for r in rows if r["lab"] == lab}


def test_a_guest_keeps_its_two_newest_snapshots_and_one_in_use_is_never_removed(
        cli: Cli, image: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every change of a lab makes new snapshots (~90 MB a guest): the older ones go when a new one
    is taken, except the newest two, and except one a running guest sits on, wherever it runs."""
    lab = tmp_path / "snapprune.yaml"
    state = tmp_path_factory.mktemp("st", numbered=True)  # short: unix socket names stay under 108 bytes
    other = Cli(state, {**cli.env, "LABCTL_STATE_DIR": str(state)})
    keys: list[str] = []
    for version in (1, 2, 3):
        lab.write_text(ONE.format(name="snapprune", version=version))
        up = cli("up", str(lab), "--accel", "tcg")
        assert up.returncode == 0, up.stderr
        new = set(_snapshots_of(cli, "snapprune")) - set(keys)
        assert len(new) == 1, new
        keys.append(new.pop())
        assert cli("down", "snapprune").returncode == 0
        if version == 1:
            # Restored from its snapshot in another state directory (another shell's LABCTL_STATE_DIR),
            # and kept up: its disk sits on the snapshot's.
            up = other("up", str(lab), "--accel", "tcg", "--json")
            assert up.returncode == 0, up.stderr
            assert {g["started_from"] for g in json.loads(up.stdout)["guests"]} == {"snapshot"}
    try:
        seen = _snapshots_of(cli, "snapprune")
        # 1 is older than the newest two, but the other state directory's QEMU sits on it.
        assert set(seen) == set(keys) and seen[keys[0]] is True, (keys, seen)
        assert other("exec", "snapprune", "g", "--", "cat", "/root/version", check=True).stdout.strip() == "1"
    finally:
        assert other("down", "snapprune").returncode == 0
    lab.write_text(ONE.format(name="snapprune", version=4))
    up = cli("up", str(lab), "--accel", "tcg", "--json")
    assert up.returncode == 0, up.stderr
    with _down_after(cli, "snapprune"):
        seen = _snapshots_of(cli, "snapprune")
        assert set(seen) - set(keys) and set(seen) & set(keys) == {keys[2]}, (keys, seen)
        assert cli("exec", "snapprune", "g", "--", "cat", "/root/version", check=True).stdout.strip() == "4"


def test_a_crashed_guest_is_reset_while_its_neighbours_keep_pinging(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = _lab(tmp_path, "warm")
    assert cli("up", str(lab), "--accel", "tcg").returncode == 0
    with _down_after(cli, "warm"):
        cli("exec", "warm", "a", "--", "ip route add 10.99.0.0/24 via 10.61.0.2 && dd if=/dev/zero of=/root/fill "
            "bs=1M count=64 status=none", check=True)
        # b and c ping each other all through a's reset.
        back = reset_while_pinging(cli, "warm", "a", "b", "10.61.0.3")
        assert back["guest"] == "a" and back["from"] == "snapshot"
        # a is back at its post-boot state: no route, no file, links working, right clock.
        assert "10.99.0.0" not in cli("exec", "warm", "a", "--", "ip", "route", check=True).stdout
        assert cli("exec", "warm", "a", "--", "test", "-e", "/root/fill").returncode == 1
        statuses = {g["name"]: g["state"] for g in _status(cli, "warm")["guests"]}
        assert statuses == {"a": "running", "b": "running", "c": "running"}
        _same_lab_checks(cli, "warm")
        gdir = cli.state_dir / "labs" / "warm" / "guests" / "a"
        assert "sysrq" in (gdir / "console.prev.log").read_text().lower()  # the crash is kept
        # An unknown guest is a usage error.
        bad = cli("reset", "warm", "zz")
        assert bad.returncode == 2 and "no guest 'zz'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_checkpoint_brings_files_and_routes_back(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = _lab(tmp_path, "warm")
    assert cli("up", str(lab), "--accel", "tcg").returncode == 0
    with _down_after(cli, "warm"):
        cli("exec", "warm", "a", "--", "echo step3 > /root/notes && ip route add 10.98.0.0/24 via 10.62.0.2",
            check=True)
        cli("exec", "warm", "b", "--", "ip link set eth2 mtu 1400", check=True)
        save = cli("checkpoint", "save", "warm", "step3", "--json")
        assert save.returncode == 0, save.stderr
        assert json.loads(save.stdout)["guests"] == ["a", "b", "c"]
        # Later changes, on every guest...
        cli("exec", "warm", "a", "--", "rm /root/notes && ip route del 10.98.0.0/24 && touch /root/later", check=True)
        cli("exec", "warm", "b", "--", "ip link set eth2 mtu 1500", check=True)
        cli("exec", "warm", "c", "--", "ip link set eth1 down", check=True)
        restore = cli("checkpoint", "restore", "warm", "step3")
        assert restore.returncode == 0, restore.stderr
        # ...are gone.
        assert cli("exec", "warm", "a", "--", "cat", "/root/notes", check=True).stdout == "step3\n"
        assert cli("exec", "warm", "a", "--", "test", "-e", "/root/later").returncode == 1
        assert "10.98.0.0/24 via 10.62.0.2" in cli("exec", "warm", "a", "--", "ip", "route", check=True).stdout
        assert "mtu 1400" in cli("exec", "warm", "b", "--", "ip", "link", "show", "eth2", check=True).stdout
        _same_lab_checks(cli, "warm")
        listing = json.loads(cli("checkpoint", "list", "warm", "--json", check=True).stdout)
        assert [c["name"] for c in listing["checkpoints"]] == ["step3"]
        missing = cli("checkpoint", "restore", "warm", "nope")
        assert missing.returncode != 0 and "no checkpoint 'nope'" in missing.stderr
        assert cli("checkpoint", "delete", "warm", "step3").returncode == 0
        assert json.loads(cli("checkpoint", "list", "warm", "--json", check=True).stdout)["checkpoints"] == []


def test_two_instances_are_isolated_and_go_down_alone(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = _lab(tmp_path, "warm")
    for inst in ("alice", "bob"):
        up = cli("up", str(lab), "--accel", "tcg", "--instance", inst)
        assert up.returncode == 0, up.stderr
    with _down_after(cli, "warm@alice", "warm@bob"):
        labs = {s["lab"]: s for s in json.loads(cli("status", "--json", check=True).stdout)["labs"]}
        assert set(labs) == {"warm@alice", "warm@bob"}
        ports = [g["ssh"] for s in labs.values() for g in s["guests"]]
        assert len(set(ports)) == 6
        # The second instance restored from the first one's snapshots (instances share them).
        assert {g["started_from"] for g in labs["warm@bob"]["guests"]} == {"snapshot"}
        # The same addresses in both; a marker address on bob's b is reachable from bob's a only.
        cli("exec", "warm@bob", "b", "--", "ip", "addr", "add", "10.61.0.50/24", "dev", "eth1", check=True)
        assert cli("exec", "warm@bob", "a", "--", "ping", "-c", "1", "-W", "3", "10.61.0.50").returncode == 0
        assert cli("exec", "warm@alice", "a", "--", "ping", "-c", "1", "-W", "2", "10.61.0.50").returncode != 0
        assert cli("exec", "warm@alice", "a", "--", "ping", "-c", "1", "-W", "3", "10.61.0.2").returncode == 0
        alice_dir = cli.state_dir / "labs" / "warm@alice"
        assert cli("down", "warm@alice").returncode == 0
        assert not alice_dir.exists() and qemu_pids_under(alice_dir) == []
        assert [s["lab"] for s in json.loads(cli("status", "--json", check=True).stdout)["labs"]] == ["warm@bob"]
        _same_lab_checks(cli, "warm@bob")


def test_the_capacity_refusal_starts_nothing(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = _lab(tmp_path, "cap")
    refused = cli("up", str(lab), "--accel", "tcg", "--instances", "64")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "MiB" in refused.stderr and "Traceback" not in refused.stderr
    assert json.loads(cli("status", "--json", check=True).stdout)["labs"] == []
    assert qemu_pids_under(cli.state_dir) == []


@pytest.fixture(autouse=True)
def _nothing_left(cli: Cli) -> Iterator[None]:
    yield
    assert qemu_pids_under(cli.state_dir) == []


NO_AGENT = """\
name: noagent
networks: {lan: {}}
guests:
  g:
    kernel_args: [module_blacklist=virtio_console]
    nics:
      - {name: eth1, model: e1000, network: lan, ip: 10.64.0.1/24}
"""


def test_a_guest_whose_kernel_runs_no_agent_still_comes_up_with_its_own_key(
        cli: Cli, image: object, tmp_path: Path) -> None:
    """Its boot was to become the snapshot, so only the standby sshd started; without the agent,
    init hands the standby the boot's key and labctl installs the guest's own over SSH."""
    lab = tmp_path / "noagent.yaml"
    lab.write_text(NO_AGENT)
    up = cli("up", str(lab), "--accel", "tcg")
    assert up.returncode == 0, up.stderr
    with _down_after(cli, "noagent"):
        assert "no post-boot snapshot (its agent did not answer" in " ".join(up.stderr.split())
        assert STANDBY in _listener(cli, "noagent", "g")  # SSH answers with the pinned own key
        boot = cli("exec", "noagent", "g", "--", "cat", "/run/labctl-boot.log", check=True).stdout
        assert "sshd started (standby)" in boot and "keys: the standby listens" in boot
