"""The foundation, end to end: three guests, three NIC models, one network."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

from tests import harness
from tests.conftest import ROOT, Cli
from tests.integration.conftest import qemu_pids_under

LAB = ROOT / "labs" / "quickstart.yaml"
ADDRS = {"a": "10.10.0.1", "b": "10.10.0.2", "c": "10.10.0.3"}
DRIVERS = {"a": {"8139cp", "8139too"}, "b": {"e1000"}, "c": {"virtio_net"}}


def test_three_guests_ping_each_other_with_the_right_drivers(cli: Cli, image: object) -> None:
    up = cli("up", str(LAB), "--accel", "auto")
    assert up.returncode == 0, up.stderr
    try:
        # The table names every guest with its NIC model and driver.
        for guest, model in (("a", "rtl8139"), ("b", "e1000"), ("c", "virtio-net-pci")):
            assert any(guest in line and model in line for line in up.stdout.splitlines()), up.stdout

        run_dir = cli.state_dir / "labs" / "quickstart"
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
        qmp = run_dir / "guests" / "a" / "qmp.sock"
        assert stat.S_ISSOCK(os.stat(qmp).st_mode)

        status = json.loads(cli("status", "--json", check=True).stdout)
        (lab,) = status["labs"]
        guests = {g["name"]: g for g in lab["guests"]}
        assert set(guests) == {"a", "b", "c"}
        for name, g in guests.items():
            assert g["state"] == "running"
            host, port = g["ssh"].rsplit(":", 1)
            assert host == "127.0.0.1"
            _assert_ssh_only_on_loopback(int(port))
            assert g["nics"][0]["driver"] in DRIVERS[name]

        for name, addr_ip in ADDRS.items():
            # The NIC carries the lab's name and address, and its model's driver.
            drv = cli("exec", "quickstart", name, "--", "ethtool", "-i", "eth1", check=True).stdout
            driver = drv.splitlines()[0].split(": ", 1)[1]
            assert driver in DRIVERS[name], drv
            addr = cli("exec", "quickstart", name, "--", "ip", "-4", "-o", "addr", "show", "eth1", check=True)
            assert f"{addr_ip}/24" in addr.stdout
            for other, ip in ADDRS.items():
                if other != name:
                    ping = cli("exec", "quickstart", name, "--", "ping", "-c", "2", "-W", "3", ip)
                    assert ping.returncode == 0, f"{name} -> {other}: {ping.stdout}{ping.stderr}"

        # exec returns the remote command's exit status, and a shell line works.
        assert cli("exec", "quickstart", "a", "--", "sh -c 'exit 7'").returncode == 7
        assert cli("exec", "quickstart", "a", "--", "false").returncode == 1

        # labctl ssh puts OpenSSH in its place: a shell on the guest, here reading its commands from stdin.
        shell = harness.run([sys.executable, "-m", "labctl", "ssh", "quickstart", "c"], cwd=ROOT, env=cli.env,
                            input="echo on-$(hostname)-$((6*7))\n", capture_output=True, text=True, timeout=120)
        assert shell.returncode == 0, shell.stderr
        name = cli("exec", "quickstart", "c", "--", "hostname", check=True).stdout.strip()
        assert shell.stdout.strip() == f"on-{name}-42", shell.stdout

        # Management traffic never shares a lab NIC: mgmt0 is its own NIC.
        links = cli("exec", "quickstart", "b", "--", "ip", "-o", "link", check=True).stdout
        assert "mgmt0" in links and "eth1" in links

        # A second up of the same lab is refused and leaves the running one alone.
        again = cli("up", str(LAB))
        assert again.returncode == 5
        assert "already up" in again.stderr
        assert "Traceback" not in again.stderr
        assert cli("exec", "quickstart", "a", "--", "true").returncode == 0
    finally:
        down = cli("down", "quickstart")
    assert down.returncode == 0, down.stderr
    assert not (cli.state_dir / "labs" / "quickstart").exists()
    assert qemu_pids_under(cli.state_dir) == []
    assert not list(cli.state_dir.rglob("*.sock"))


def _assert_ssh_only_on_loopback(port: int) -> None:
    """The forwarded SSH port answers on 127.0.0.1 and on no other address."""
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    addrs = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    for addr in addrs - {"127.0.0.1", "127.0.1.1"}:
        s = socket.socket()
        s.settimeout(2)
        try:
            assert s.connect_ex((addr, port)) != 0, f"SSH port {port} reachable on {addr}"
        finally:
            s.close()


def test_down_all_takes_two_labs_down(cli: Cli, image: object, tmp_path: Path) -> None:
    """Two different labs run at once; down --all stops both."""
    labs = []
    for name, net in (("solo-a", "10.20.0"), ("solo-b", "10.30.0")):
        f = tmp_path / f"{name}.yaml"
        f.write_text(f"name: {name}\nnetworks: {{n: {{}}}}\nguests:\n  g:\n    nics:\n"
                     f"      - {{name: eth0, model: e1000e, network: n, ip: {net}.1/24}}\n")
        labs.append(f)
    procs = [cli.popen("up", str(f)) for f in labs]
    for p in procs:
        _out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    status = json.loads(cli("status", "--json", check=True).stdout)
    assert sorted(lab["lab"] for lab in status["labs"]) == ["solo-a", "solo-b"]
    # The lab may name its NIC eth0 (the kernel's own name for it).
    drv = cli("exec", "solo-a", "g", "--", "ethtool -i eth0 | head -1", check=True).stdout
    assert "e1000e" in drv
    assert cli("down", "--all").returncode == 0
    assert json.loads(cli("status", "--json", check=True).stdout)["labs"] == []
    assert qemu_pids_under(cli.state_dir) == []
