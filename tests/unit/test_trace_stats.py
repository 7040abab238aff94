"""Snapshot commands, statistics parsers and deltas on outputs recorded in a real guest."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from labctl.trace.stats import (
    parse_ethtool_info,
    parse_ethtool_stats,
    parse_interrupts,
    parse_link_stats,
    parse_nstat,
    parse_snmp,
    parse_softirqs,
    parse_softnet_stat,
    snapshot_commands,
    snapshot_delta,
    write_delta,
)
from tests.conftest import ROOT

FIX = ROOT / "tests" / "fixtures" / "trace"
GUEST = FIX / "step" / "a"
BEFORE, AFTER = GUEST / "stats" / "before", GUEST / "stats" / "after"


def read(path: Path) -> str:
    return path.read_text()


# --------------------------------------------------------------------------- commands

def test_snapshot_commands_cover_every_kind_and_nic() -> None:
    cmds = snapshot_commands(["eth1", "eth2"])
    for stem in ("nstat", "netstat-s", "snmp", "netstat-proc", "softnet_stat", "interrupts", "softirqs", "ss-tin", "netdev"):
        assert stem in cmds
    for nic in ("eth1", "eth2"):
        for kind in "Sigck":
            assert cmds[f"ethtool-{kind}-{nic}"] == f"ethtool -{kind} {nic} 2>&1"
        assert cmds[f"link-{nic}"] == f"ip -s -j link show dev {nic} 2>&1"
    assert cmds["nstat"].startswith("nstat -a -s -z")  # absolute, history untouched
    assert all(c.endswith(" 2>&1") for c in cmds.values())
    assert len(cmds) == 9 + 2 * 6


def test_the_nic_settings_are_taken_before_the_step_only() -> None:
    """ethtool -i/-g/-c/-k describe the NIC (no delta): after the step only counters are taken."""
    before, after = snapshot_commands(["eth1"]), snapshot_commands(["eth1"], "after")
    assert set(before) - set(after) == {"ethtool-i-eth1", "ethtool-g-eth1", "ethtool-c-eth1", "ethtool-k-eth1"}
    assert after["ethtool-S-eth1"] == before["ethtool-S-eth1"] and "link-eth1" in after


def test_proc_files_are_read_by_bash_itself(tmp_path: Path) -> None:
    """A /proc file is read with bash's builtins (no process in the guest), byte for byte as cat reads
    it; a shell that is not bash runs cat."""
    cmd = snapshot_commands([])["softirqs"]
    assert "mapfile" in cmd and not cmd.startswith("cat ")
    for shell in ("bash", "sh"):
        out = subprocess.run([shell, "-c", cmd], capture_output=True, check=True).stdout
        assert out.split(b"\n")[0] == Path("/proc/softirqs").read_bytes().split(b"\n")[0], shell
    assert subprocess.run(["bash", "-c", cmd.replace("/proc/softirqs", str(tmp_path / "none"))],
                          check=False, capture_output=True).returncode != 0


def test_snapshot_commands_match_the_recorded_files() -> None:
    recorded = {p.stem for p in BEFORE.glob("*.txt")}
    assert recorded == set(snapshot_commands(["eth1", "eth2"]))


def test_snapshot_commands_quote_nic_names() -> None:
    cmds = snapshot_commands(["we ird;x"])
    assert cmds["ethtool-S-we ird;x"] == f"ethtool -S {shlex.quote('we ird;x')} 2>&1"
    assert cmds["link-we ird;x"] == f"ip -s -j link show dev {shlex.quote('we ird;x')} 2>&1"
    assert snapshot_commands([]) == {k: v for k, v in cmds.items() if not k.startswith(("ethtool", "link-"))}


# --------------------------------------------------------------------------- softnet

def test_softnet_decodes_every_hex_column_of_the_61_layout() -> None:
    text = read(AFTER / "softnet_stat.txt")
    rows = parse_softnet_stat(text)
    lines = text.splitlines()
    assert len(rows) == len(lines) == 2
    for row, line in zip(rows, lines):
        fields = [int(f, 16) for f in line.split()]
        assert len(fields) == 13
        assert (row["processed"], row["dropped"], row["time_squeeze"]) == tuple(fields[:3])
        assert (row["received_rps"], row["flow_limit_count"], row["backlog_len"]) == tuple(fields[9:12])
        assert row["cpu"] == fields[12]
    assert rows[0]["processed"] == 0x1C6C and rows[1]["processed"] == 0x1DC7 and rows[1]["cpu"] == 1


def test_softnet_tolerates_old_and_new_layouts_and_junk() -> None:
    old = "0000000a 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000003\n"
    (row,) = parse_softnet_stat(old + "garbage line\n\n")
    assert row == {"processed": 10, "dropped": 1, "time_squeeze": 2, "unused3": 0, "fastroute_hit": 0,
                   "fastroute_success": 0, "fastroute_defer": 0, "fastroute_deferred_out": 0,
                   "cpu_collision": 0, "received_rps": 0, "flow_limit_count": 3, "cpu": 0}
    newer = " ".join(["00000001"] * 15)
    assert parse_softnet_stat(newer)[0]["col14"] == 1
    assert parse_softnet_stat("") == []
    assert parse_softnet_stat("cat: /proc/net/softnet_stat: No such file or directory") == []


# --------------------------------------------------------------------------- snmp / nstat

def test_snmp_pairs_of_lines() -> None:
    text = read(AFTER / "snmp.txt")
    snmp = parse_snmp(text)
    ip_names, ip_values = (line.split()[1:] for line in text.splitlines()[:2])
    assert snmp["Ip"] == {n: int(v) for n, v in zip(ip_names, ip_values)}
    assert snmp["Ip"]["ReasmFails"] == 0 and snmp["Ip"]["InReceives"] == 14896
    assert snmp["Tcp"]["MaxConn"] == -1
    assert {"Ip", "Icmp", "IcmpMsg", "Tcp", "Udp", "UdpLite"} <= set(snmp)


def test_snmp_parses_proc_net_netstat() -> None:
    text = read(AFTER / "netstat-proc.txt")
    tables = parse_snmp(text)
    assert set(tables) == {"TcpExt", "IpExt", "MPTcpExt"}
    header, values = [ln for ln in text.splitlines() if ln.startswith("IpExt:")]
    ext = dict(zip(header.split()[1:], map(int, values.split()[1:])))
    assert tables["IpExt"] == ext and ext["InOctets"] == 243534079
    assert len(tables["TcpExt"]) == len(text.splitlines()[0].split()) - 1


def test_snmp_ignores_netstat_s_and_garbage() -> None:
    assert parse_snmp(read(AFTER / "netstat-s.txt")) == {}
    assert parse_snmp("Ip: A B\nIcmp: 1 2\n") == {}
    assert parse_snmp("Ip: A B C\nIp: 1 2\n") == {"Ip": {"A": 1, "B": 2}}


def test_nstat_absolute_counters() -> None:
    text = read(AFTER / "nstat.txt")
    nstat = parse_nstat(text)
    assert text.startswith("#kernel")
    assert len(nstat) == len(text.splitlines()) - 1
    assert nstat["IpInReceives"] == int(re.search(r"^IpInReceives\s+(\d+)", text, re.MULTILINE)[1])  # type: ignore[index]
    assert nstat["UdpOutDatagrams"] == 36400  # 16600 + 19800 from the two UDP senders
    assert parse_nstat("nstat: command not found\n") == {}


# --------------------------------------------------------------------------- ethtool

def test_ethtool_stats() -> None:
    s1, s2 = parse_ethtool_stats(read(AFTER / "ethtool-S-eth1.txt")), parse_ethtool_stats(read(AFTER / "ethtool-S-eth2.txt"))
    assert len(s1) == 14 and s1["tx_ok"] == 19612 and s1["rx_ok"] == 0
    assert s2["tx_queue_0_packets"] > 19800 and "rx_queue_0_xdp_drops" in s2


@pytest.mark.parametrize("name", ["ethtool-S-missing.txt", "ethtool-S-lo.txt", "ethtool-i-lo.txt", "missing-tool.txt"])
def test_ethtool_error_texts_parse_to_nothing(name: str) -> None:
    text = read(FIX / "misc" / name)
    assert parse_ethtool_stats(text) == {}
    assert parse_ethtool_info(text) == {}


def test_ethtool_info_and_unsupported_coalesce() -> None:
    info = parse_ethtool_info(read(AFTER / "ethtool-i-eth1.txt"))
    assert info["driver"] == "8139cp" and info["bus-info"] == "0000:00:03.0" and info["firmware-version"] == ""
    assert parse_ethtool_info(read(AFTER / "ethtool-i-eth2.txt"))["driver"] == "virtio_net"
    unsupported = read(AFTER / "ethtool-c-eth1.txt")
    assert "Operation not supported" in unsupported
    assert parse_ethtool_stats(unsupported) == {} and parse_ethtool_info(unsupported) == {}


# --------------------------------------------------------------------------- interrupts / softirqs

def test_interrupts() -> None:
    irqs = parse_interrupts(read(AFTER / "interrupts.txt"))
    assert irqs["11"] == {"cpus": [0, 19611], "total": 19611, "name": "IO-APIC 11-fasteoi eth1"}
    assert irqs["LOC"]["name"] == "Local timer interrupts" and len(irqs["LOC"]["cpus"]) == 2
    assert irqs["ERR"] == {"cpus": [0], "total": 0, "name": ""}
    assert parse_interrupts("") == {} and parse_interrupts("no header\n 1: 2 3") == {}


def test_softirqs() -> None:
    soft = parse_softirqs(read(AFTER / "softirqs.txt"))
    assert list(soft) == ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"]
    assert soft["NET_TX"] == [0, 19611] and soft["NET_RX"] == [13301, 5533]
    assert parse_softirqs("garbage") == {}


# --------------------------------------------------------------------------- deltas

def cmd_sent(i: int) -> int:
    """Datagrams the UDP sender of cmd-<i> says it sent."""
    return int(re.search(r"sent (\d+) datagrams", read(GUEST / f"cmd-{i}.out"))[1])  # type: ignore[index]


def test_delta_matches_what_the_workload_sent() -> None:
    delta = snapshot_delta(BEFORE, AFTER)
    assert delta["missing"] == []
    assert delta["ethtool-S-eth1"] == {"tx_ok": cmd_sent(1)} == {"tx_ok": 16600}
    assert delta["ethtool-S-eth2"]["tx_queue_0_packets"] == cmd_sent(2) == 19800
    assert delta["ethtool-S-eth2"]["tx_queue_0_bytes"] == 19800 * (1400 + 42)  # UDP/IP/Ethernet headers
    # 8139cp raises one TX interrupt and one NET_TX softirq per frame on this TCG guest.
    assert delta["interrupts"]["11"]["total"] == 16600
    assert delta["softirqs"]["NET_TX"] == {"cpus": [0, 16600], "total": 16600}
    assert delta["snmp"]["Udp"]["OutDatagrams"] == 16600 + 19800
    assert delta["nstat"]["UdpOutDatagrams"] == 16600 + 19800
    assert delta["snmp"]["Icmp"]["OutEchos"] == 2000  # ping -f -c 2000


def test_link_delta_counts_the_five_pings() -> None:
    """link-eth1 comes from another guest: five pings, five echo requests out and five replies in."""
    delta = snapshot_delta(BEFORE, AFTER)
    assert delta["link-eth1"] == {"rx_packets": 5, "tx_packets": 5, "rx_bytes": 490, "tx_bytes": 490}
    assert parse_link_stats(read(BEFORE / "link-eth1.txt"))["tx_packets"] == 32
    assert parse_link_stats("Device \"eth9\" does not exist.") == {}


def test_delta_keeps_only_changed_counters() -> None:
    delta = snapshot_delta(BEFORE, AFTER)
    for kind in ("nstat", "ethtool-S-eth1"):
        assert all(v != 0 for v in delta[kind].values())
    assert "ReasmFails" not in delta["snmp"]["Ip"]
    assert "ethtool-c-eth1" not in delta and "ethtool-k-eth2" not in delta and "ss-tin" not in delta
    assert "HI" not in delta["softirqs"] and "0" not in delta["interrupts"]


def test_softnet_delta_per_cpu_and_summed() -> None:
    before = [[int(f, 16) for f in ln.split()] for ln in read(BEFORE / "softnet_stat.txt").splitlines()]
    after = [[int(f, 16) for f in ln.split()] for ln in read(AFTER / "softnet_stat.txt").splitlines()]
    soft = snapshot_delta(BEFORE, AFTER)["softnet_stat"]
    for cpu in (0, 1):
        d = soft["per_cpu"][str(cpu)]
        assert [d["processed"], d["dropped"], d["time_squeeze"]] == [a - b for a, b in zip(after[cpu][:3], before[cpu][:3])]
        assert set(d) == {"processed", "dropped", "time_squeeze", "received_rps", "flow_limit_count"}
    assert soft["total"] == {"processed": sum(a[0] - b[0] for a, b in zip(after, before)),
                             "dropped": 0, "time_squeeze": sum(a[2] - b[2] for a, b in zip(after, before))}
    assert soft["total"]["processed"] == 6608
    # Every packet softnet processed was IPv4 (loopback traffic only): the two views agree.
    assert snapshot_delta(BEFORE, AFTER)["snmp"]["Ip"]["InReceives"] == 6608


def test_delta_json_round_trip(tmp_path: Path) -> None:
    shutil.copytree(GUEST / "stats", tmp_path / "stats")
    path = write_delta(tmp_path)
    assert path == tmp_path / "stats" / "delta.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(snapshot_delta(BEFORE, AFTER)))


def test_delta_with_missing_and_empty_files(tmp_path: Path) -> None:
    shutil.copytree(GUEST / "stats", tmp_path / "stats")
    (tmp_path / "stats" / "after" / "nstat.txt").unlink()
    (tmp_path / "stats" / "after" / "softnet_stat.txt").write_text("")
    (tmp_path / "stats" / "before" / "ethtool-S-eth1.txt").write_text("netlink error: Operation not supported\n")
    delta = snapshot_delta(tmp_path / "stats" / "before", tmp_path / "stats" / "after")
    assert delta["missing"] == ["nstat"]
    assert delta["softnet_stat"] == {"per_cpu": {}, "total": {"processed": 0, "dropped": 0, "time_squeeze": 0}}
    assert delta["ethtool-S-eth1"] == {}
    assert delta["ethtool-S-eth2"]["tx_queue_0_packets"] == 19800


def test_write_delta_without_snapshots(tmp_path: Path) -> None:
    path = write_delta(tmp_path / "guest")
    assert json.loads(path.read_text()) == {"missing": []}
