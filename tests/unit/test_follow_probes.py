"""What labctl writes into a guest's tracefs to follow packets and catch drops (labctl.follow.probes), the
drops section and its figures for labctl compare (labctl.report.droptable), and labctl follow's refusals
before anything starts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.follow.probes import (
    POINTS,
    Caps,
    definitions,
    drop_definition,
    drop_filter,
    point_definition,
    remove_command,
    results,
    setup_command,
    sync_command,
)
from labctl.pktfilter import kernel_filter, parse
from labctl.report.comparison import _metric_rows
from labctl.report.droptable import drops_metrics, summarize_drops

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "follow"
OFF = {"skb_data": 208, "skb_head": 200, "skb_nh": 184, "skb_dev": 16, "dev_name": 0,
       "skb_protocol": 180}  # Debian's 6.1.0-56


def test_follow_points_fetch_the_ip_header_where_it_is_at_each_point() -> None:
    by = {p.name: p for p in POINTS}
    rx = point_definition("labctl_t", by["netif_rx"], OFF, set())
    assert rx.startswith("e:labctl_t/netif_rx net.netif_receive_skb skb=$skbaddr:x64 dev=+0(+16($skbaddr)):string ")
    assert "saddr=+12(+208($skbaddr)):u32" in rx and "l4b=+24(+208($skbaddr)):u32" in rx
    tx = point_definition("labctl_t", by["xmit"], OFF, {"dport"})
    assert tx.startswith("e:labctl_t/xmit net.net_dev_start_xmit skb=$skbaddr:x64")
    assert "saddr=+26(+208($skbaddr)):u32" in tx and "dport=+36(+208($skbaddr)):u16" in tx  # after the Ethernet header
    fwd = point_definition("labctl_t", by["ip_fwd"], OFF, set())
    assert fwd.startswith("p:labctl_t/ip_fwd ip_forward skb=%di:x64") and "saddr=+12(+208(%di)):u32" in fwd
    tcp = point_definition("labctl_t", by["tcp_rcv"], OFF, set())
    assert "vi=-20(+208(%di)):u8" in tcp  # IP's header already pulled


@pytest.mark.parametrize(("text", "tcp", "udp"), [
    ("icmp", False, False), ("tcp port 5201", True, False), ("port 53", True, True), ("udp or icmp", False, True),
    ("host 10.0.0.1", True, True), ("icmp or host 10.0.0.1", True, True), ("not icmp", True, True),
    ("icmp6", False, False), ("tcp and (icmp or udp)", False, False)])
def test_a_protocols_own_points_are_probed_only_for_a_filter_that_can_match_it(text: str, tcp: bool, udp: bool) -> None:
    """tcp_v4_rcv sees every TCP segment a guest takes in, skb_consume_udp every UDP datagram read:
    for ``icmp`` they would cost a stream's every packet and never record one."""
    names = {d.split()[0].split("/")[1] for d in definitions("labctl_t", parse(text), OFF, True, True)[0]}
    assert ({"tcp_rcv", "tcp6_rcv"} & names != set()) is tcp and ({"udp_read", "udp6_read"} & names != set()) is udp, names
    assert {"raw_read", "sock_read"} <= names or "icmp6" in text or text.startswith("tcp and")  # a raw socket reads any protocol


def test_the_drop_probe_has_a_window_around_data_and_the_symbol_last() -> None:
    d = drop_definition("labctl_d", OFF, reason=True, symbol=True)
    assert d.startswith("e:labctl_d/drop skb.kfree_skb skb=$skbaddr:x64 proto=$protocol:u16 ")
    assert "w0=-24(+208($skbaddr)):x64" in d and "w8=+40(+208($skbaddr)):x64" in d
    assert d.endswith(" reason=$reason:u32 loc=$location:symbol")  # the location last: a symbol has spaces
    old = drop_definition("labctl_d", None, reason=False, symbol=False)
    assert "reason" not in old and "dev=" not in old and old.endswith("loc=$location:x64")


def test_a_followed_guests_drops_are_filtered_on_the_header_at_three_places() -> None:
    """A drop is kept when the filter matches the IPv4 header at skb->data, after an Ethernet header, or
    20 bytes before it (IP's pulled); only the fields the filter reads are fetched, before the symbol."""
    filt, _ = kernel_filter(parse("udp port 9"))
    args, drop_filt = drop_filter(OFF, filt)
    assert "h0_proto=+9(+208($skbaddr)):u8" in args and "h14_dport=+36(+208($skbaddr)):u16" in args
    assert "hm20_vi=-20(+208($skbaddr)):u8" in args and "saddr" not in args
    assert drop_filt.count(" || (h") == 2 and drop_filt.startswith("(h0_vi >= 69 && h0_vi <= 79 && (h0_proto == 17")
    assert "(hm20_sport == 0x900 || hm20_dport == 0x900)" in drop_filt and " proto" not in drop_filt
    d = drop_definition("labctl_f", OFF, reason=True, symbol=True, extra=args)
    assert args in d and d.endswith(" loc=$location:symbol")
    net = drop_filter(OFF, kernel_filter(parse("net 10.1.0.0/16"))[0])
    assert "h14_sb1=+27(+208($skbaddr)):u8" in net[0] and "(h14_sb0 == 10 && h14_sb1 == 1)" in net[1]


def test_a_heartbeat_is_not_answered() -> None:
    cmd = sync_command("t")
    assert 'echo "labctl-sync $n" > trace_marker' in cmd and '[ "$n" = hb ] || echo "$n"' in cmd


def test_setup_sets_each_filter_and_says_what_the_kernel_refused() -> None:
    filt, extra = kernel_filter(parse("icmp"))
    defs = [point_definition("labctl_t", p, OFF, extra) for p in POINTS[:2]]
    cmd = setup_command("t", defs, {"dev_queue": filt}, 8192)
    assert ("echo 'vi >= 69 && vi <= 79 && proto == 1' > /sys/kernel/tracing/instances/labctl-t/events/labctl_t/"
            "dev_queue/filter") in cmd
    assert "echo mono > /sys/kernel/tracing/instances/labctl-t/trace_clock" in cmd and "options/overwrite" in cmd
    assert results("labctl-ok dev_queue\nlabctl-fail enable xmit\n") == (["dev_queue"], ["enable xmit"])
    assert "echo -:labctl_t/xmit" in remove_command("t", ["xmit"])


def test_capabilities_and_a_killed_labctls_groups() -> None:
    caps = Caps.parse("tracefs=1\neprobes=1\nreason=1\nsymbol=1\nkprobes=1\nlabctl_f999999x1\nlabctl_d12x3\n")
    assert caps.eprobes and caps.reason and caps.groups == ("labctl_d12x3", "labctl_f999999x1")
    assert not Caps.parse("tracefs=1\n").eprobes


def test_the_drops_section_and_compare_count_an_absent_function_as_zero(tmp_path: Path) -> None:
    shutil.copytree(FIX / "paths", tmp_path / "paths", ignore=shutil.ignore_patterns("follow"))
    got = summarize_drops(tmp_path / "paths")
    assert got is not None and got["total"] == 5
    nf = next(r for r in got["rows"] if r["reason"] == "NETFILTER_DROP")
    assert nf["rules"] == ["nftables rule 'udp dport 9 counter drop' (table inet filter, chain input, handle 2)"]
    m = drops_metrics({"drops": got})
    assert m["drops.r.ip_rcv_finish_core.constprop.0.IP_RPFILTER"][0] == 1.0 and m["drops.b.total"][0] == 1.0
    quiet = {"drops": {"total": 0, "guests": {g: {"drops": 0} for g in "arb"}, "rows": []}}
    rows = {r["key"]: r for r in _metric_rows([quiet], [{"drops": got}])}
    row = rows["drops.b.nft_do_chain.NETFILTER_DROP"]
    assert (row["change"], row["label"]) == (1.0, "b: nft_do_chain (NETFILTER_DROP)")
    # a side of two repeats, one without the drop: its mean is over both (found by two real runs)
    rows = {r["key"]: r for r in _metric_rows([quiet], [{"drops": got}, quiet])}
    row = rows["drops.b.nft_do_chain.NETFILTER_DROP"]
    assert (row["a"]["n"], row["b"]["n"], row["b"]["mean"], row["change"]) == (1, 2, 0.5, 0.5)


def _follow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labctl", "follow", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_bad_filters_exit_2_before_anything_starts() -> None:
    res = _follow("no-such-lab", "icmp and hst 10.0.0.1")
    assert res.returncode == 2 and "bad filter 'icmp and hst 10.0.0.1': tcpdump: syntax error" in res.stderr
    res = _follow("no-such-lab", "vlan or icmp")  # libpcap takes it, labctl does not
    assert res.returncode == 2 and "takes 'vlan' only ANDed with the whole filter" in res.stderr, res.stderr
    res = _follow("no-such-lab", "icmp and vlan 10")  # libpcap checks it as 'vlan 10 and (icmp)': past the filter
    assert "bad filter" not in res.stderr and "no-such-lab" in res.stderr, res.stderr
    res = _follow("no-such-lab", "--", "-w/tmp/x")  # never handed to tcpdump as an option
    assert res.returncode == 2 and "cannot start with '-'" in res.stderr, res.stderr
    res = _follow("no-such-lab", "icmp", "-c", "0")
    assert res.returncode == 2 and "-c must be at least 1" in res.stderr


def test_ipv6_and_arp_points_fetch_skb_protocol_and_their_own_header() -> None:
    by = {p.name: p for p in POINTS}
    rx6 = point_definition("labctl_t", by["netif_rx6"], OFF, set())
    assert rx6.startswith("e:labctl_t/netif_rx6 net.netif_receive_skb skb=$skbaddr:x64 dev=+0(+16($skbaddr)):string "
                          "pr=+180($skbaddr):u16 vi=+0(+208($skbaddr)):u8 ")
    assert "nxt=+6(+208($skbaddr)):u8" in rx6 and "d6d=+36(+208($skbaddr)):u32" in rx6 and "l4a=+40(" in rx6
    tcp6 = point_definition("labctl_t", by["tcp6_rcv"], OFF, {"dport"})
    assert tcp6.startswith("p:labctl_t/tcp6_rcv tcp_v6_rcv ") and "vi=-40(+208(%di)):u8" in tcp6
    assert "dport=+2(+208(%di)):u16" in tcp6
    arp = point_definition("labctl_t", by["xmit_arp"], OFF, {"tpb0"})
    assert "pr=+180($skbaddr):u16" in arp and "tpa=+38(+208($skbaddr)):u32" in arp and "tpb0=+38(" in arp
    assert "vi=" not in arp
    assert "pr=" not in point_definition("labctl_t", by["xmit"], OFF, set())  # IPv4's as before


def test_drops_are_filtered_per_family_with_the_tracepoints_own_protocol() -> None:
    """The probes' ``pr`` is skb->protocol read little-endian; the drop tracepoint's ``proto`` is host order."""
    f6, _ = kernel_filter(parse("icmp6 and host fd00::1"), 6)
    fa, _ = kernel_filter(parse("arp host 10.1.0.99"), 0x806)
    assert f6 is not None and fa is not None
    args, filt = drop_filter(OFF, {6: f6, 0x806: fa})
    assert "h6_m40_nxt=-34(+208($skbaddr)):u8" in args and "ha_14_tpa=+38(+208($skbaddr)):u32" in args
    assert "(proto == 0x86dd && h6_0_vi >= 96" in filt and "(proto == 0x806 && (ha_0_spa == 0x6300010a" in filt
    assert filt.count("(proto == ") == 5 and " pr " not in filt and "pr ==" not in filt.replace("proto ==", "")
    d = drop_definition("labctl_d", OFF, reason=True, symbol=True)
    assert "wm2=-40(+208($skbaddr)):x64" in d and "w11=+64(+208($skbaddr)):x64" in d
