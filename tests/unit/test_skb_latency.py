"""Per-packet latency analysis on recorded real traces (tests/fixtures/skb) and small hand-made ones."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import pytest

from labctl.steps.skbprobes import kprobe_definitions, probe_names, record_argv
from labctl.trace.skbevents import parse_line, parse_report
from labctl.trace.skblatency import analyze_dir, analyze_text, end_to_end, stage_times, why_not_followed
from labctl.trace.skbpath import Packet, follow

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "skb"


def fixture(name: str) -> str:
    return gzip.decompress((FIX / name).read_bytes()).decode()


def followed(packets: list[Packet]) -> list[Packet]:
    return [p for p in packets if p.dev != "mgmt0" and p.is_data() and why_not_followed(p) is None]


# -- parsing ------------------------------------------------------------------

def test_parse_tracepoint_kprobe_and_kretprobe_lines() -> None:
    ev = parse_line("          iperf3-142   [000]    42.068248717: skb_copy_datagram_iovec: "
                    "skbaddr=0xffff888005780500 len=13032")
    assert ev is not None
    assert (ev.comm, ev.pid, ev.cpu, ev.ts, ev.name) == ("iperf3", 142, 0, 42_068_248_717, "skb_copy_datagram_iovec")
    assert ev.addr("skbaddr") == 0xFFFF888005780500 and ev.int("len") == 13032
    probe = parse_line("     ksoftirqd/0-14    [001]   166.852851563: ip_rcv_core:          (ffffffff818748f0) "
                       "skb=0xffff88801ef33d00 proto=6")
    assert probe is not None and probe.comm == "ksoftirqd/0" and probe.cpu == 1
    assert probe.addr("skb") == 0xFFFF88801EF33D00 and probe.int("proto") == 6
    ret = parse_line("          <idle>-0     [000]    42.080002653: skb_try_coalesce_ret: "
                     "(ffffffff817bfb20 <- ffffffff818921ea) ret=1")
    assert ret is not None and ret.comm == "<idle>" and ret.int("ret") == 1
    napi = parse_line("          <idle>-0     [000]    42.067909345: napi_poll:            napi poll on napi struct "
                      "0xffff88801fbdac30 for device eth1 work 11 budget 64")
    assert napi is not None and napi.fields["dev"] == "eth1" and napi.fields["work"] == "11"


def test_drop_markers_get_the_next_event_time() -> None:
    text = ("cpus=2\n"
            "  a-1 [000] 1.000000000: consume_skb: skbaddr=0x10\n"
            "CPU:1 [12 EVENTS DROPPED]\n"
            "  a-1 [000] 1.500000000: consume_skb: skbaddr=0x20\n"
            "  b-2 [001] 2.000000000: consume_skb: skbaddr=0x30\n"
            "CPU:0 [EVENTS DROPPED]\n"
            "  a-1 [000] 3.000000000: consume_skb: skbaddr=0x40\n")
    log = parse_report(text)
    assert [(d.cpu, d.ts, d.count) for d in log.drops] == [(1, 2_000_000_000, 12), (0, 3_000_000_000, None)]
    assert log.dropped_events == 12 and len(log.events) == 4 and log.unparsed == 0


# -- hand-made sequences: the rules ---------------------------------------------

def _lines(*rows: tuple[float, str, str]) -> str:
    return "\n".join(f"  iperf3-7 [000] {ts:.9f}: {name}: {body}" for ts, name, body in rows)


RX = ("napi_gro_receive_entry", "dev=eth1 skbaddr=0xa00 len=1500")


def test_reused_address_starts_a_new_packet_and_the_old_one_is_not_stitched() -> None:
    text = _lines((1.0, *RX), (1.1, "napi_gro_receive_exit", "ret=3"),
                  (1.2, "netif_receive_skb", "dev=eth1 skbaddr=0xa00 len=1500"),
                  (1.3, "ip_rcv_core", "(ffff) skb=0xa00 ihl=69 tot_len=56325 proto=6 tcpoff=128"),
                  (1.4, "tcp_v4_rcv", "(ffff) skb=0xa00 len=1480 doff=128"),
                  # freed silently (no copy seen); the address comes back for the next frame
                  (2.0, *RX), (2.1, "napi_gro_receive_exit", "ret=3"),
                  (2.2, "netif_receive_skb", "dev=eth1 skbaddr=0xa00 len=1500"),
                  (2.3, "ip_rcv_core", "(ffff) skb=0xa00 ihl=69 tot_len=56325 proto=6 tcpoff=128"),
                  (2.4, "tcp_v4_rcv", "(ffff) skb=0xa00 len=1480 doff=128"),
                  (2.5, "skb_copy_datagram_iovec", "skbaddr=0xa00 len=1448"))
    corr = follow(parse_report(text))
    first, second = corr.rx
    assert first.point("copy") is None and why_not_followed(first) is not None
    assert second.t["entry"] == 2_000_000_000 and why_not_followed(second) is None
    assert end_to_end(second) == 500_000_000
    assert second.payload == 1500 - 20 - 32


def test_repeated_stage_without_a_start_event_is_a_new_partial_packet() -> None:
    text = _lines((1.0, *RX), (1.2, "netif_receive_skb", "dev=eth1 skbaddr=0xa00 len=1500"),
                  (2.2, "netif_receive_skb", "dev=eth1 skbaddr=0xa00 len=1500"))
    corr = follow(parse_report(text))
    assert len(corr.rx) == 2
    assert corr.rx[1].point("entry") is None and corr.rx[1].problem == "its start was not traced"


def test_gro_merge_is_followed_through_its_head_only_when_lengths_add_up() -> None:
    def run(netif_len: int) -> list[Packet]:
        text = _lines((1.0, "napi_gro_receive_entry", "dev=eth1 skbaddr=0xa00 len=1500"),
                      (1.1, "napi_gro_receive_exit", "ret=2"),
                      (1.2, "napi_gro_receive_entry", "dev=eth1 skbaddr=0xb00 len=1500"),
                      (1.3, "napi_gro_receive_exit", "ret=1"),
                      (1.4, "netif_receive_skb", f"dev=eth1 skbaddr=0xa00 len={netif_len}"),
                      (1.5, "ip_rcv_core", "(ffff) skb=0xa00 ihl=69 tot_len=0 proto=6 tcpoff=128"),
                      (1.6, "tcp_v4_rcv", "(ffff) skb=0xa00 len=2928 doff=128"),
                      (1.7, "skb_copy_datagram_iovec", "skbaddr=0xa00 len=2896"))
        return follow(parse_report(text)).rx

    head, member = run(1500 + 1448)
    assert member.head is head and why_not_followed(member) is None
    assert stage_times(member)["driver_netif"] == 200_000_000 and member.payload == 1448
    head, member = run(1500 + 1000)
    assert why_not_followed(head) is None
    assert why_not_followed(member) == "its GRO merge could not be verified (lengths do not add up)"


def test_coalesced_segment_is_delivered_by_the_next_copy_of_its_target() -> None:
    text = _lines((1.0, *RX), (1.05, "napi_gro_receive_exit", "ret=3"),
                  (1.1, "netif_receive_skb", "dev=eth1 skbaddr=0xa00 len=1500"),
                  (1.2, "ip_rcv_core", "(f) skb=0xa00 ihl=69 tot_len=0 proto=6 tcpoff=128"),
                  (1.3, "tcp_v4_rcv", "(f) skb=0xa00 len=1480 doff=128"),
                  (1.4, "napi_gro_receive_entry", "dev=eth1 skbaddr=0xb00 len=1500"),
                  (1.45, "napi_gro_receive_exit", "ret=3"),
                  (1.5, "netif_receive_skb", "dev=eth1 skbaddr=0xb00 len=1500"),
                  (1.6, "ip_rcv_core", "(f) skb=0xb00 ihl=69 tot_len=0 proto=6 tcpoff=128"),
                  (1.7, "tcp_v4_rcv", "(f) skb=0xb00 len=1480 doff=128"),
                  (1.8, "skb_try_coalesce", "(f) to=0xa00 from=0xb00"),
                  (1.81, "skb_try_coalesce_ret", "(f <- f) ret=1"),
                  (2.0, "skb_copy_datagram_iovec", "skbaddr=0xa00 len=2896"))
    a, b = follow(parse_report(text)).rx
    assert b.into is a and b.point("copy") == a.point("copy") == 2_000_000_000
    assert why_not_followed(a) is None and why_not_followed(b) is None


def test_a_drop_disturbs_packets_in_flight_and_no_packet_spans_it() -> None:
    text = "  iperf3-7 [000] 1.000000000: napi_gro_receive_entry: dev=eth1 skbaddr=0xa00 len=1500\nCPU:0 [5 EVENTS DROPPED]\n  iperf3-7 [000] 1.500000000: netif_receive_skb: dev=eth1 skbaddr=0xa00 len=1500"
    corr = follow(parse_report(text))
    assert corr.rx[0].disturbed and why_not_followed(corr.rx[0]) == "trace events were lost while it was in flight"
    assert corr.rx[1].point("entry") is None  # the rest is a fragment, never joined to the first
    assert corr.disturbed_by_drops == 1


def test_transmit_follows_the_clone_and_finds_the_write_by_sequence_number() -> None:
    text = _lines((1.0, "tcp_sendmsg", "(f) sk=0x5 size=3000 wseq=4294966296"),  # wraps around 2**32
                  (1.2, "tcp_transmit_skb", "(f) sk=0x5 skb=0xc00 clone=1 seq=4294966296 end_seq=2000"),
                  (1.3, "ip_queue_xmit", "(f) skb=0xce8"), (1.35, "ip_output", "(f) skb=0xce8"),
                  (1.4, "dev_queue_xmit", "(f) skb=0xce8"),
                  (1.45, "net_dev_queue", "dev=eth1 skbaddr=0xce8 len=3066"),
                  (1.5, "net_dev_xmit", "dev=eth1 skbaddr=0xce8 len=3066 rc=0"),
                  (2.0, "tcp_transmit_skb", "(f) sk=0x5 skb=0xc00 clone=1 seq=4294966296 end_seq=2000"))
    tx = follow(parse_report(text)).tx
    assert tx[0].t["app"] == 1_000_000_000 and tx[0].payload == 3000 and why_not_followed(tx[0]) is None
    assert stage_times(tx[0]) == {"app_tcp": 200_000_000, "tcp_ip": 100_000_000, "ip_dev": 100_000_000,
                                  "dev_xmit": 100_000_000}
    assert tx[1].retransmit


# -- recorded real traces --------------------------------------------------------

@pytest.mark.parametrize("name,direction", [("rx-e1000-gro.txt.gz", "rx"), ("rx-rtl8139.txt.gz", "rx"),
                                            ("rx-virtio.txt.gz", "rx"), ("tx-virtio-gso.txt.gz", "tx")])
def test_every_followed_packet_has_stages_that_add_up(name: str, direction: str) -> None:
    corr = follow(parse_report(fixture(name)))
    packets = followed(corr.rx if direction == "rx" else corr.tx)
    assert len(packets) > 40
    for p in packets:
        st = stage_times(p)
        assert all(v >= 0 for v in st.values()), (p.id, st)
        assert sum(st.values()) == end_to_end(p)


@pytest.mark.parametrize("name", ["rx-e1000-gro.txt.gz", "rx-rtl8139.txt.gz", "rx-virtio.txt.gz"])
def test_most_received_data_segments_are_followed(name: str) -> None:
    summary, _ = analyze_text(fixture(name))
    rx = summary["rx"]
    assert rx["data_segments"] > 500
    assert rx["followed_pct"] >= 90, rx["not_followed"]
    assert rx["stages"]["tcp_app"]["count"] == rx["followed"]


def test_real_trace_reuses_addresses_and_each_use_is_its_own_packet() -> None:
    corr = follow(parse_report(fixture("rx-e1000-gro.txt.gz")))
    by_addr: dict[int, list[Packet]] = {}
    for p in followed(corr.rx):
        by_addr.setdefault(p.addr, []).append(p)
    reused = [ps for ps in by_addr.values() if len(ps) > 1]
    assert len(reused) > 10
    for ps in reused:  # each use of the address is a different frame with its own entry time
        assert len({p.t["entry"] for p in ps}) == len(ps)
    merged = [p for p in followed(corr.rx) if p.head is not None]
    assert merged and all(p.unverified is False for p in merged)
    assert any(p.into is not None for p in followed(corr.rx))


def test_real_trace_with_lost_events_reports_them_and_never_follows_across_a_gap() -> None:
    text = fixture("rx-e1000-drops-oldprobes.txt.gz")
    log = parse_report(text)
    assert log.drops and log.dropped_events > 0
    summary, _ = analyze_text(text)
    assert summary["lost"]["drop_markers"] == len(log.drops)
    assert summary["rx"]["not_followed"]["trace events were lost while it was in flight"] > 0
    corr = follow(log)
    gaps = [d.ts for d in log.drops]
    for p in followed(corr.rx):
        start, end = p.point("entry"), p.point("copy")
        assert start is not None and end is not None
        assert not any(start < g <= end for g in gaps), p.id


def test_software_gso_frames_complete_their_skb() -> None:
    corr = follow(parse_report(fixture("tx-virtio-gso.txt.gz")))
    cut = [p for p in followed(corr.tx) if p.segments]
    assert cut and all(p.segments >= 2 for p in cut)
    summary, _ = analyze_text(fixture("tx-virtio-gso.txt.gz"))
    assert summary["tx"]["segmented_in_software"] >= len(cut)


def test_analyze_dir_writes_csv_and_timeline(tmp_path: Path) -> None:
    (tmp_path / "skb-report.txt").write_text(fixture("rx-rtl8139.txt.gz"))
    (tmp_path / "skb-kprobe-profile.txt").write_text((FIX / "kprobe-profile-rtl8139.txt").read_text())
    summary = analyze_dir(tmp_path)
    assert summary is not None and summary["files"] == ["skb-latency-rx.csv", "skb-latency-tx.csv",
                                                         "skb-timeline.txt"]
    assert summary["lost"]["kprobe_misses"]["ip_rcv_core"] > 0
    rows = list(csv.DictReader(io.StringIO((tmp_path / "skb-latency-rx.csv").read_text())))
    yes = [r for r in rows if r["followed"] == "yes"]
    assert len(yes) == summary["rx"]["by_nic"]["eth1"]["followed"] + summary["rx"]["by_nic"].get(
        "mgmt0", {}).get("followed", 0)
    for r in yes:
        stages = [float(r[k]) for k in ("driver_netif_us", "netif_ip_us", "ip_tcp_us", "tcp_app_us")]
        assert min(stages) >= 0 and sum(stages) == pytest.approx(float(r["end_to_end_us"]), abs=0.0015)
    timeline = (tmp_path / "skb-timeline.txt").read_text()
    assert "irq_handler_entry" in timeline and "skb_copy_datagram_iovec" in timeline
    assert analyze_dir(tmp_path / "nothing") is None


def test_probe_definitions_use_the_kernel_offsets() -> None:
    defs = kprobe_definitions({"skb_cb": 40, "skb_len": 112, "skb_data": 208, "tcp_write_seq": 1852})
    assert "seq=+40(%si):u32 end_seq=+44(%si):u32" in defs[3]
    assert "wseq=+1852(%di):u32" in defs[2] and "proto=+9(+208(%di)):u8" in defs[0]
    assert probe_names()[0] == "ip_rcv_core" and "skb_try_coalesce_ret" in probe_names()
    argv = record_argv(None)
    assert argv[:4] == ["trace-cmd", "record", "-C", "mono"] and "labctl_skb" in argv
