"""The kernel's driver tests in hardware mode (``kselftest: {netif, peer}``): the lab keys, the two
ends worked out from the lab, the net.config, the keys that pass between guests, the files installed
from outside the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.errors import LabctlError, LabFileError
from labctl.lab import load_lab_text
from labctl.steps import drivertests, selftests

LAB = """\
name: drv
networks: {ne1000: {}, nvirtio: {}, other: {}}
guests:
  dut:
    nics:
      - {name: eth1, model: e1000, network: ne1000, ip: [10.71.0.1/24, "fd71::1/64"]}
      - {name: eth2, model: virtio-net-pci, network: nvirtio, ip: 10.72.0.1/24}
      - {name: eth3, model: e1000, network: other}
  peer:
    nics:
      - {name: eth1, model: virtio-net-pci, network: ne1000, ip: [10.71.0.2/24, "fd71::2/64"]}
      - {name: eth2, model: virtio-net-pci, network: nvirtio, ip: "fd72::2/64"}
steps:
  - name: drivers-net
    matrix:
      - {label: e1000, nic: eth1}
    kselftest: {guest: dut, tree: debian, target: drivers/net, tests: [ping.py], netif: "{{nic}}", peer: peer}
"""

KEY = "ssh-ed25519 " + "A" * 68 + " labctl-peer"


def test_the_step_keeps_netif_and_peer_and_a_debian_tree() -> None:
    k = load_lab_text(LAB, "lab.yaml").steps[0].kselftest
    assert k is not None
    assert (k.netif, k.peer, k.target, k.tests, k.from_debian) == ("{{nic}}", "peer", "drivers/net", ("ping.py",), True)


@pytest.mark.parametrize(("edit", "message"), [
    (("netif: \"{{nic}}\", peer: peer", "netif: eth1"),
     "lab.yaml:17: steps[0].kselftest.peer: 'netif' needs 'peer' too"),
    (("netif: \"{{nic}}\", peer: peer", "peer: peer"),
     "lab.yaml:17: steps[0].kselftest.netif: 'peer' needs 'netif' too"),
    (("peer: peer}", "peer: nobody}"), "lab.yaml:17: steps[0].kselftest.peer:"),
    (("peer: peer}", "peer: dut}"), "lab.yaml:17: steps[0].kselftest.peer: the peer is the guest under test"),
    (("netif: \"{{nic}}\"", "netif: \"eth1; reboot\""), "lab.yaml:17: steps[0].kselftest.netif: invalid NIC name"),
])
def test_bad_hardware_mode_keys_name_their_line(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(LabFileError) as e:
        load_lab_text(LAB.replace(*edit), "lab.yaml")
    assert message in str(e.value), str(e.value)


def test_the_two_ends_are_the_nic_and_the_peers_nic_on_its_network() -> None:
    lab = load_lab_text(LAB, "lab.yaml")
    e = drivertests.endpoints(lab, "dut", "eth1", "peer")
    assert (e.local_v4, e.remote_v4, e.local_v6, e.remote_v6) == ("10.71.0.1", "10.71.0.2", "fd71::1", "fd71::2")
    assert e.config() == ("NETIF=eth1\nLOCAL_V4=10.71.0.1\nREMOTE_V4=10.71.0.2\nLOCAL_V6=fd71::1\n"
                          "REMOTE_V6=fd71::2\nREMOTE_TYPE=ssh\nREMOTE_ARGS=10.71.0.2\n")
    assert e.remotes == ("10.71.0.2", "fd71::2")


def test_no_shared_family_and_missing_nics_are_refused() -> None:
    lab = load_lab_text(LAB, "lab.yaml")
    with pytest.raises(LabctlError, match="share no address family"):
        drivertests.endpoints(lab, "dut", "eth2", "peer")  # 10.72.0.1 against fd72::2
    with pytest.raises(LabctlError, match="has no NIC on network other"):
        drivertests.endpoints(lab, "dut", "eth3", "peer")
    with pytest.raises(LabctlError, match="guest dut has no NIC 'eth9' \\(it has eth1, eth2, eth3\\)"):
        drivertests.endpoints(lab, "dut", "eth9", "peer")


def test_only_a_key_passes_from_one_guest_into_the_other() -> None:
    assert drivertests.checked_public_key(KEY + "\n", "dut") == KEY
    for bad in ("", KEY + "\nssh-rsa AAAA evil", "command=\"reboot\" " + KEY, KEY.replace("A", "'", 1)):
        with pytest.raises(LabctlError, match="did not give an ed25519 public key"):
            drivertests.checked_public_key(bad, "dut")
    assert drivertests.checked_host_key(KEY + "\n", "peer") == KEY.rsplit(" ", 1)[0]
    with pytest.raises(LabctlError, match="no ed25519 host key"):
        drivertests.checked_host_key("cat: no such file", "peer")


def test_the_client_pins_the_peers_host_key_and_writes_net_config() -> None:
    lab = load_lab_text(LAB, "lab.yaml")
    e = drivertests.endpoints(lab, "dut", "eth1", "peer")
    host = KEY.rsplit(" ", 1)[0]
    cmd = drivertests.client_command(e, host, "/tmp/k/drivers/net/net.config")
    assert f"10.71.0.2 {host}\nfd71::2 {host}\n" in cmd
    assert "StrictHostKeyChecking yes" in cmd and "accept-new" not in cmd and "BatchMode yes" in cmd
    assert cmd.endswith("ssh 10.71.0.2 true") and "/tmp/k/drivers/net/net.config" in cmd


def test_drivers_net_brings_the_net_library_the_specs_and_ynl(tmp_path: Path) -> None:
    assert drivertests.extras("net") == () and drivertests.extras("net/forwarding") == ()
    assert drivertests.extras("drivers/net/hw") == drivertests.extras("drivers/net")
    tree = tmp_path / "tree"
    for rel in ("tools/testing/selftests/net/lib/py/ksft.py", "tools/testing/selftests/net/lib/py/__pycache__/x.pyc",
                "tools/testing/selftests/net/lib.sh", "Documentation/netlink/specs/ethtool.yaml",
                "tools/net/ynl/lib/ynl.py"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("x")
    root = tmp_path / "install"
    for rel, into in drivertests.extras("drivers/net"):
        selftests._copy_plain(tree / rel, root / into)
    got = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert got == ["net/lib.sh", "net/lib/py/ksft.py", "net/lib/specs/ethtool.yaml", "net/lib/ynl/lib/ynl.py"]


def test_the_nic_under_test_keeps_its_ipv6_addresses_over_a_down_and_up() -> None:
    # stats.py's check_down sets the NIC down and up: without keep_addr_on_down the kernel drops its
    # static IPv6 addresses and ping.py's TCP test (over IPv6) waits for a connection until the timeout
    lab = load_lab_text(LAB, "lab.yaml")
    both = drivertests.endpoints(lab, "dut", "eth1", "peer")
    cmd = drivertests.client_command(both, KEY.rsplit(" ", 1)[0], "/tmp/k/drivers/net/net.config")
    keep = "echo 1 > /proc/sys/net/ipv6/conf/eth1/keep_addr_on_down"
    assert keep in cmd and cmd.index(keep) < cmd.index("ssh 10.71.0.2 true")
    vlan = drivertests.Endpoints("eth1.100", "peer", local_v6="fd71::1", remote_v6="fd71::2")
    assert drivertests.keep_addresses_command(vlan) == "echo 1 > /proc/sys/net/ipv6/conf/eth1.100/keep_addr_on_down"
    v4 = drivertests.Endpoints("eth2", "peer", "10.72.0.1", "10.72.0.2")
    assert "keep_addr_on_down" not in drivertests.client_command(v4, KEY.rsplit(" ", 1)[0], "/tmp/net.config")
