"""Packets followed through a lab, from recorded real traces (tests/fixtures/follow: a lab a — r — b on
Debian's 6.1 kernel under TCG; step ``paths``: three pings a → b through the router r, one ping from a's
second address that r's rp_filter drops, one UDP datagram b's nftables rule drops; step ``lossy``: six
pings a → r with netem loss 50% on a.eth1). labctl.trace.hops, .clocks, .journey, .journeyfiles, .drops."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from labctl.trace.clocks import Alignment, Clock
from labctl.trace.drops import netfilter_note, protocol_name, table
from labctl.trace.hops import DROP_REASONS, Event, drop_header, identity, parse_line, parse_text, reason_name
from labctl.trace.journey import Correlator
from labctl.trace.journeyfiles import JOURNEY_JSON, JOURNEY_TRACE, analyze, journeys_of, read_inputs, timeline
from labctl.trace.tef import validate_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "follow"
DEV_QUEUE = next(line for line in (FIX / "paths" / "follow" / "a.txt").read_text().splitlines()
                 if " dev_queue: " in line and "ping-200" in line)  # the second ping (the first waited for ARP)


def test_a_probe_line_gives_the_packet_it_saw() -> None:
    ev = parse_line(DEV_QUEUE, "a")
    assert ev is not None and (ev.point, ev.comm, ev.pid, ev.irq, ev.dev) == ("dev_queue", "ping", 200, False, "eth1")
    assert ev.ts == 25_451_420_000
    h = identity(ev)
    assert h is not None and h.describe() == "ICMP echo-request 10.1.0.1 > 10.2.0.1 id 200 seq 2"
    assert h.key() == (0x0A010001, 0x0A020001, 1, 0x7AA8, 0, (8, 200, 2))  # id=43130 as read little-endian


def test_drop_lines_symbol_with_module_and_the_plain_tracepoint() -> None:
    line = (FIX / "paths" / "b" / "drops.txt").read_text().splitlines()
    ev = next(e for e in (parse_line(x, "b") for x in line) if e is not None)
    assert ev.fields["loc"] == "nft_do_chain+0x47f/0x5e0 [nf_tables]" and reason_name(ev) == "NETFILTER_DROP"
    assert str(drop_header(ev).describe()).startswith("UDP 10.1.0.1:")  # type: ignore[union-attr]
    # a kernel without event probes records the tracepoint itself (6.1's format)
    tp = parse_line("  <idle>-0 [000] ..s1. 12.000001: kfree_skb: skbaddr=0xffff888005fa4d00 protocol=2048 "
                    "location=0xffffffff817c0afe reason: QDISC_DROP", "a")
    assert tp is not None and tp.point == "drop" and tp.fields["loc"] == "0xffffffff817c0afe"
    assert reason_name(tp) == "QDISC_DROP" and tp.irq


def test_marker_lines_and_lost_events_are_counted() -> None:
    events, lost = parse_text("bash-245 [000] ..... 601.104503: tracing_mark_write: labctl-sync 0.3\n"
                              "CPU:0 [LOST 17 EVENTS]\n", "a")
    assert [(e.point, e.fields["marker"]) for e in events] == [("marker", "0.3")] and lost == 17


def test_a_clock_round_intersects_its_samples() -> None:
    mk = [Event("a", ts, "marker", "bash", 1, 0, False, {"marker": m}) for ts, m in ((100, "0.0"), (200, "0.1"))]
    # sample 0.0 bounds host - guest within [950, 1080], sample 0.1 within [950, 1030]: the round, [950, 1030]
    clock = Clock.from_samples({"0.0": (1050, 1180), "0.1": (1150, 1230)}, mk)
    assert clock.rounds[0].offset == 990 and clock.bound_ns == 40 and clock.host(300) == 1290
    later = [*mk, Event("a", 10_100, "marker", "bash", 1, 0, False, {"marker": "1.0"})]
    drifting = Clock.from_samples({"0.0": (1050, 1180), "0.1": (1150, 1230), "1.0": (11_180, 11_200)}, later)
    assert [r.offset for r in drifting.rounds] == [990, 1090]
    assert drifting.host(5_125) == 5_125 + 990 + 50  # interpolated between the rounds
    assert drifting.drift_ppm() == pytest.approx(10050.3, abs=0.1)


def test_alignment_balances_the_fastest_packet_each_way_within_bounds() -> None:
    al = Alignment()
    al.learn("a", "r", -2_000_000)  # r's clock reads 1.75 ms early: into r looks negative
    al.learn("r", "a", 1_500_000)
    al.learn("r", "b", 200_000)
    al.learn("b", "r", -300_000)
    al.solve({"a": 3_000_000.0, "r": 3_000_000.0, "b": 500_000.0})
    assert al.at("b") == 0.0  # the tightest bound anchors
    assert al.at("r") == pytest.approx(250_000)  # both ways: the fastest each way equal (-50 µs both)
    assert al.at("a") == pytest.approx(250_000 - 1_750_000)
    al.solve({"a": 500_000.0, "r": 3_000_000.0, "b": 400_000.0})
    assert al.at("a") == -900_000  # never beyond the round trips' bounds (a's and the anchor's together)


def test_the_paths_step_gives_every_packet_its_path_and_end() -> None:
    got = journeys_of(FIX / "paths")
    assert got is not None
    js, facts = got
    ends = sorted((j.end.kind, j.header.describe().split(" id ")[0]) for j in js)
    assert ends == [("answered", "ICMP echo-request 10.1.0.1 > 10.2.0.1")] * 3 + [
        ("delivered", "ICMP echo-reply 10.2.0.1 > 10.1.0.1")] * 3 + [
        ("dropped", "ICMP echo-request 10.1.9.1 > 10.2.0.1"), ("dropped", "UDP 10.1.0.1:34555 > 10.2.0.1:9")]
    assert all(j.out_of_order == 0 for j in js) and set(facts["clocks"]) == {"a", "r", "b"}
    rp = next(j for j in js if j.end.reason == "IP_RPFILTER")
    assert rp.end.guest == "r" and rp.end.where.startswith("ip_rcv_finish_core") and {h.guest for h in rp.hops} == {"a", "r"}
    nf = next(j for j in js if j.end.reason == "NETFILTER_DROP")
    assert nf.end.guest == "b" and "table inet filter, chain input" in nf.end.text and "udp dport 9" in nf.end.text
    reply = next(j for j in js if j.end.kind == "delivered")
    assert reply.end.text.startswith("delivered to ping (pid 200) on a")
    route = [(h.guest, h.where, h.dev) for h in reply.hops]
    assert route == [("b", "net_dev_queue", "eth1"), ("b", "net_dev_start_xmit", "eth1"),
                     ("b", "b.eth1 → r.eth2", None), ("r", "netif_receive_skb", "eth2"), ("r", "ip_forward", None),
                     ("r", "net_dev_queue", "eth1"), ("r", "net_dev_start_xmit", "eth1"),
                     ("r", "r.eth1 → a.eth1", None), ("a", "netif_receive_skb", "eth1"), ("a", "ip_local_deliver", None),
                     ("a", "skb_copy_datagram_iovec", None)]
    assert all(b.t >= a.t for j in js for a, b in zip(j.hops, j.hops[1:], strict=False))
    assert "seen on the host side at both ends" in reply.hops[2].note


def test_netem_loss_is_lost_on_the_wire_and_named() -> None:
    got = journeys_of(FIX / "lossy")
    assert got is not None
    lost = [j for j in got[0] if j.end.kind == "lost"]
    assert len(lost) == 3
    assert all("lost on the wire a.eth1 → r.eth1: netem loss 50% (labctl's impairment of a.eth1)" in j.end.text
               for j in lost)


def test_a_slower_guest_stream_does_not_split_a_packet() -> None:
    """Live, r's events may arrive before a's: nothing is judged until every guest's stream is past it."""
    data = json.loads((FIX / "paths" / "follow" / "inputs.json").read_text())
    topo, wire = read_inputs(data)
    by_guest = {g: parse_text((FIX / "paths" / "follow" / f"{g}.txt").read_text(), g)[0] for g in data["guests"]}
    clocks = {g: Clock.from_samples({m: (v[0], v[1]) for m, v in data["samples"][g].items()},
                                    [e for e in evs if e.point == "marker"]) for g, evs in by_guest.items()}
    corr = Correlator(topo, clocks, wire)
    for ev in by_guest["r"] + by_guest["b"]:
        corr.add(ev)
    assert corr.settle({"r": 10**15, "b": 10**15, "a": 0}) == []  # a's stream has not come that far
    for ev in by_guest["a"]:
        corr.add(ev)
    js = corr.settle({"r": 10**15, "b": 10**15, "a": 10**15})
    assert len([j for j in js if j.header.proto == 1 and j.end.kind != "dropped"]) == 6


def test_analyze_writes_journey_json_and_a_valid_timeline(tmp_path: Path) -> None:
    shutil.copytree(FIX / "paths", tmp_path / "step")
    piece = analyze(tmp_path / "step")
    assert piece is not None and piece["totals"]["packets"] == 8 and piece["paths"][0]["end"]["kind"] == "dropped"
    doc = json.loads((tmp_path / "step" / JOURNEY_JSON).read_text())
    assert len(doc["packets"]) == 8 and doc["packets"][0]["hops"][0]["delta_us"] is None
    got = journeys_of(tmp_path / "step")
    assert got is not None
    tl = timeline(*got)
    assert validate_trace(tl) == []
    flows = [e for e in tl["traceEvents"] if e["ph"] in "stf"]
    assert {e["id"] for e in flows} == {j.id for j in got[0]}
    assert (tmp_path / "step" / JOURNEY_TRACE).stat().st_size > 0


def test_the_drops_table_counts_network_drops_and_leaves_local_frees_out() -> None:
    events = []
    for g in ("a", "r", "b"):
        events += parse_text((FIX / "paths" / g / "drops.txt").read_text(), g)[0]
    rows, local = table(events)
    assert [(r.guest, r.function, r.reason, r.count) for r in rows] == [
        ("a", "icmp_rcv", "NO_SOCKET", 3), ("b", "nft_do_chain", "NETFILTER_DROP", 1),
        ("r", "ip_rcv_finish_core.constprop.0", "IP_RPFILTER", 1)]
    assert local > 0 and rows[2].headers == ["ICMP echo-request 10.1.9.1 > 10.2.0.1 id 204 seq 1"]


DROPS = Path(__file__).resolve().parents[1] / "fixtures" / "drops"  # one 6.1 guest: see its README


def test_two_reasons_at_one_drop_site_are_two_rows_and_a_swapped_protocol_is_read() -> None:
    events, _ = parse_text((DROPS / "a" / "drops.txt").read_text(), "a")
    rows, local = table(events)
    assert [(r.where, r.reason, r.dev, r.protocol, r.count) for r in rows] == [
        ("ip_rcv_core+0x236/0x310", "IP_CSUM", "lo", "IPv4", 3),
        ("ip_rcv_core+0x236/0x310", "IP_INHDR", "lo", "IPv4", 3),
        ("kfree_skb_list_reason+0x1e/0x30", "QDISC_DROP", "dummy9", "IPv4", 1),  # proto=8: 0x0800 in host order
        ("kfree_skb_list_reason+0x1e/0x30", "QDISC_DROP", "dummy9", "IPv6", 1)]  # proto=34525: network order
    assert local == 4 and rows[0].headers == ["UDP 127.0.0.1:4000 > 127.0.0.1:9"] * 3


def test_the_drops_summary_and_compare_keep_each_reason_of_a_site(tmp_path: Path) -> None:
    from labctl.report.droptable import drops_metrics, summarize_drops

    step = tmp_path / "step"
    shutil.copytree(DROPS / "a", step / "a")
    got = summarize_drops(step)
    assert got is not None and got["total"] == 8 and got["guests"]["a"]["local_frees"] == 4
    assert [(r["function"], r["reason"], r["protocol"]) for r in got["rows"]] == [
        ("ip_rcv_core", "IP_CSUM", "IPv4"), ("ip_rcv_core", "IP_INHDR", "IPv4"),
        ("kfree_skb_list_reason", "QDISC_DROP", "IPv4"), ("kfree_skb_list_reason", "QDISC_DROP", "IPv6")]
    m = drops_metrics({"drops": got})
    assert {k: v[0] for k, v in m.items()} == {
        "drops.a.total": 8.0, "drops.a.ip_rcv_core.IP_CSUM": 3.0, "drops.a.ip_rcv_core.IP_INHDR": 3.0,
        "drops.a.kfree_skb_list_reason.QDISC_DROP": 2.0}


@pytest.mark.parametrize("proto, name", [("2048", "IPv4"), ("8", "IPv4"), ("34525", "IPv6"), ("56710", "IPv6"),
                                         ("1544", "ARP"), ("0", "none"), ("4660", "0x1234")])
def test_a_drops_protocol_is_named_in_either_byte_order(proto: str, name: str) -> None:
    line = ("  python3-174 [000] b..1.  47.554116: drop: (skb.kfree_skb) skb=0xffff888017132300 "
            f"proto={proto} reason=45 dev=\"dummy9\" loc=kfree_skb_list_reason+0x1e/0x30")
    ev = parse_line(line, "a")
    assert ev is not None and protocol_name(ev) == name


RULESET_IPT = """table ip filter { # handle 3
\tchain INPUT { # handle 1
\t\ttype filter hook input priority filter; policy accept;
\t\tudp dport 9 counter packets 4 bytes 120 drop # handle 2
\t\tcounter packets 9 bytes 900 accept # handle 3
\t}
}
"""


def test_netfilter_rules_are_named_by_the_counter_that_moved() -> None:
    before = RULESET_IPT.replace("packets 4", "packets 1").replace("packets 9", "packets 2")
    assert netfilter_note(before, RULESET_IPT) == (
        "nftables rule 'udp dport 9 counter drop' (table ip filter, chain INPUT, handle 2)")
    policy = RULESET_IPT.replace("policy accept", "policy drop")
    assert netfilter_note(policy, policy) == "the policy of table ip filter chain INPUT (no rule's counter moved)"
    assert netfilter_note("", "") is None


class _QuietFollower:
    """A follower whose guests' streams bring a clock round's markers, then ``lines`` (nothing else)."""

    def __init__(self, lines: list[str]) -> None:
        from labctl.pktfilter import parse
        from labctl.trace import Topology, Wire

        self.guests, self.wire, self.node = ["a"], Wire(), parse("icmp")
        self.probes: dict[str, object] = {}
        self.reasons: dict[str, list[str]] = {}
        self.topo = Topology(guests=("a",))
        marks = [ln for ln in (FIX / "paths" / "follow" / "a.txt").read_text().splitlines() if "labctl-sync 0." in ln]
        self.samples = {"a": {ln.rsplit(" ", 1)[1]: (0, 1000) for ln in marks}}
        self.lines = "\n".join(marks + lines) + "\n"
        self.beats = self.rounds = 0

    def topology(self) -> object:
        return self.topo

    def pipe(self, guest: str) -> object:
        data = [self.lines.encode()]

        class Pipe:
            def recv(self, timeout: float) -> bytes | None:
                import time

                time.sleep(min(timeout, 0.05))
                return data.pop() if data else None

            def close(self) -> None:
                pass

        return Pipe()

    def clock(self, guest: str, markers: list[Event]) -> Clock:
        return Clock.from_samples(self.samples[guest], markers)

    def heartbeat(self) -> None:
        self.beats += 1

    def sync(self) -> None:
        self.rounds += 1

    def read_wire(self, look: bool = True) -> None:
        pass


def test_a_live_follow_sends_heartbeats_only_while_a_followed_packet_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each heartbeat and clock sample costs a TCG guest's sshd a wake-up: none while nothing is followed."""
    import time

    from labctl.follow import livefollow

    monkeypatch.setattr(livefollow, "RESYNC", 0.2)
    monkeypatch.setattr(livefollow, "IDLE_RESYNC", 60.0)
    quiet = _QuietFollower([])
    until = time.monotonic() + 1.5
    livefollow.LiveFollow(quiet, lambda j: None).run(lambda: time.monotonic() > until)  # type: ignore[arg-type]
    assert (quiet.beats, quiet.rounds) == (0, 0)
    busy = _QuietFollower([DEV_QUEUE])  # a ping's first hop: in flight until its end or 0.5 s of quiet
    until = time.monotonic() + 1.5
    livefollow.LiveFollow(busy, lambda j: None).run(lambda: time.monotonic() > until)  # type: ignore[arg-type]
    assert busy.beats >= 2 and busy.rounds >= 1


# enum skb_drop_reason of 6.12.117+deb12-amd64, read by labctl.kernel.enum_names from its -dbg (first 13)
REASONS_612 = ["SKB_NOT_DROPPED_YET", "SKB_CONSUMED", "NOT_SPECIFIED", "NO_SOCKET", "SOCKET_CLOSE", "SOCKET_FILTER",
               "SOCKET_RCVBUFF", "UNIX_DISCONNECT", "UNIX_SKIP_OOB", "PKT_TOO_SMALL", "TCP_CSUM", "NETFILTER_DROP",
               "OTHERHOST"]


def test_a_drop_reason_is_named_by_its_own_kernels_enum() -> None:
    """6.12's numbers are not 6.1's: 11 is NETFILTER_DROP on 6.12, IP_RPFILTER on 6.1."""
    line = ("  <idle>-0 [000] ..s2. 9.5: drop: (skb.kfree_skb) skb=0xffff888005e85b00 reason=11 proto=2048 "
            'dev="eth1" loc=nft_do_chain+0x47f/0x5e0 [nf_tables]')
    ev = parse_line(line, "new")
    assert ev is not None
    assert reason_name(ev, REASONS_612) == "NETFILTER_DROP"
    assert reason_name(ev) == DROP_REASONS[11] == "IP_RPFILTER"  # 6.1's table: a bundle of before
    ev.fields["reason"] = "99"
    assert reason_name(ev, REASONS_612) == "reason 99"
    ev.fields["reason"] = "7"  # a value the kernel's enum leaves unnamed is shown by number
    assert reason_name(ev, [*REASONS_612[:7], "", *REASONS_612[8:]]) == "reason 7"
    ev.fields["reason"] = "11"
    rows, _ = table([ev], REASONS_612)
    assert [(r.guest, r.function, r.reason) for r in rows] == [("new", "nft_do_chain", "NETFILTER_DROP")]
