"""A packet's identity through NAT, its conntrack state and the nftables chain and rule at its hops
(labctl.trace.nfhops, labctl.trace.journey), and its hops in order and on time (labctl.trace.clocks).

The recorded traces (tests/fixtures/follow48) are two steps' follow directories of a real run of
labs/nat-router.yaml on the image's Debian 6.1 kernel (its steps: ``masq``, a ping from a to b that r
masquerades, followed with ``icmp and host 10.2.0.2``; ``drop6``, an IPv6 ping from a to r that r's
input chain drops, followed with ``icmp6 and host fd00:1::2``)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from labctl.follow.probes import definitions
from labctl.pktfilter import parse
from labctl.trace import nfhops
from labctl.trace.clocks import BUCKET_NS, Alignment, Clock, Round
from labctl.trace.hops import Event, parse_ipv4
from labctl.trace.journey import Correlator
from labctl.trace.journeyfiles import journeys_of
from labctl.trace.pathmodel import Journey, Topology
from tests.unit.test_follow_answers import ECHO, TOPO, ev, v4

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "follow48"


def _recorded(step: str) -> list[Journey]:
    got = journeys_of(FIX / step)
    assert got is not None
    return got[0]


def _hops(j: Journey) -> list[tuple[str, str, str | None, str]]:
    return [(h.guest, h.where, h.dev, h.note) for h in j.hops]


def test_a_masqueraded_ping_is_one_journey_each_way_with_the_rewrite_at_its_hop() -> None:
    js = _recorded("masq")
    assert [j.header.describe().rsplit(" id ", 1)[0] for j in js] == [
        "ICMP echo-request 10.1.0.2 > 10.2.0.2", "ICMP echo-reply 10.2.0.2 > 10.2.0.1"] * 2
    ident = struct.unpack(">H", js[0].header.l4[4:6])[0]
    first, second = js[0], js[2]
    assert [(g, w, d) for g, w, d, _ in _hops(first)] == [
        ("a", "net_dev_queue", "eth1"), ("a", "net_dev_start_xmit", "eth1"), ("a", "a.eth1 → r.eth1", None),
        ("r", "netif_receive_skb", "eth1"), ("r", "nft inet labctl nat_prerouting", None), ("r", "ip_forward", None),
        ("r", "nft inet fwdcount forward", None), ("r", "nft inet labctl nat_postrouting", None),
        ("r", "net_dev_queue", "eth2"), ("r", "net_dev_start_xmit", "eth2"), ("r", "r.eth2 → b.eth1", None),
        ("b", "netif_receive_skb", "eth1"), ("b", "ip_local_deliver", None)]
    notes = {w: n for _, w, _, n in _hops(first)}
    assert notes["net_dev_queue"] == f"SNAT 10.1.0.2 id {ident} → 10.2.0.1 id {ident}"
    assert notes["nft inet labctl nat_postrouting"] == "conntrack new"  # the NAT chain sees a connection's first
    assert notes["r.eth2 → b.eth1"] == "seen on the host side at both ends"  # looked up by its name there
    assert (first.end.kind, first.end.text) == ("answered", "answered by b's kernel (ICMP echo reply sent)")
    assert {w: n for _, w, _, n in _hops(second)}["ip_forward"] == "conntrack established"
    assert "nft inet labctl nat_postrouting" not in [w for _, w, _, _ in _hops(second)]
    for reply in (js[1], js[3]):
        fwd = next(n for g, w, _, n in _hops(reply) if (g, w) == ("r", "ip_forward"))
        assert fwd == (f"DNAT 10.2.0.1 id {ident} → 10.1.0.2 id {ident} (the reply, rewritten back); "
                       "conntrack established, reply")
        assert reply.end.text.startswith("delivered to ping (pid ") and reply.end.guest == "a"
        assert _hops(reply)[-1][:2] == ("a", "skb_copy_datagram_iovec")
    assert all(j.out_of_order == 0 for j in js)


def test_an_ipv6_ping_dropped_by_an_nft_rule_names_the_rule() -> None:
    (j,) = [j for j in _recorded("drop6") if j.header.is_echo(1)]
    assert j.end.kind == "dropped" and j.end.reason == "NETFILTER_DROP"
    assert j.end.text == ("dropped on r by nft inet labctl input handle 4 (comment 'no IPv6 pings from a') "
                          "(NETFILTER_DROP at nft_do_chain+0x47f/0x5e0 [nf_tables])")
    assert _hops(j)[-1] == ("r", "nft inet labctl input", None, "conntrack new")
    # the neighbour discovery around it: taken in by ndisc (6.1's icmpv6_rcv frees it with kfree_skb), not dropped
    nd = [x for x in _recorded("drop6") if "neighbour" in x.header.describe()]
    assert len(nd) == 4 and {x.end.kind for x in nd} == {"consumed"}, [x.end.text for x in nd]


def _tcp(src: str, dst: str, sport: int, dport: int, seq: int = 1000, ipid: int = 7) -> bytes:
    raw = v4(src, dst, 64, struct.pack(">HHII", sport, dport, seq, 0), ipid=ipid)
    return raw[:9] + b"\x06" + raw[10:]


def test_the_rewrite_is_named_with_its_ports_and_only_what_nat_leaves_alone_ties_it() -> None:
    before, after = parse_ipv4(_tcp("10.0.1.1", "192.0.2.9", 40000, 80)), parse_ipv4(
        _tcp("192.0.2.1", "192.0.2.9", 61000, 80))
    assert before is not None and after is not None
    assert nfhops.rewrite(before, after) == "SNAT 10.0.1.1:40000 → 192.0.2.1:61000"
    dnat = parse_ipv4(_tcp("192.0.2.9", "10.0.1.5", 5555, 80))
    pre = parse_ipv4(_tcp("192.0.2.9", "192.0.2.1", 5555, 8080))
    assert pre is not None and dnat is not None
    assert nfhops.rewrite(pre, dnat) == "DNAT 192.0.2.1:8080 → 10.0.1.5:80"
    fwd = ev("r", 1.0, "ip_fwd", _tcp("10.0.1.1", "192.0.2.9", 40000, 80))
    out = ev("r", 1.1, "dev_queue", _tcp("192.0.2.1", "192.0.2.9", 61000, 80))
    assert nfhops.continues(fwd, out, before, after)
    other = parse_ipv4(_tcp("192.0.2.1", "192.0.2.9", 61000, 80, ipid=8))  # another packet, the skb reused
    assert other is not None and not nfhops.continues(fwd, out, before, other)
    rx = ev("r", 0.9, "netif_rx", _tcp("10.0.1.1", "192.0.2.9", 40000, 80), dev="eth1")
    assert not nfhops.continues(out, rx, after, before)  # a receive is a new skb, never a rewrite


def test_conntrack_states_and_the_rule_by_its_counter_or_the_chains_policy() -> None:
    def at(ct: int) -> Event:
        return Event("r", 0, "nft", "", 0, 0, True, {"ct": hex(ct)})

    assert [nfhops.ct_state(at(x)) for x in (0xFFFF888006AEBD02, 0xFFFF888006AEBD00, 0xFFFF888006AEBD03, 7, 0)] == [
        "new", "established", "established, reply", "untracked", "none"]
    ruleset = ("table inet filter { # handle 3\n\tchain forward { # handle 1\n"
               "\t\ttype filter hook forward priority filter; policy accept;\n"
               "\t\ttcp dport 22 counter packets 0 bytes 0 drop comment \"no ssh\" # handle 7\n"
               "\t\tudp dport 53 counter packets 0 bytes 0 drop # handle 8\n\t}\n"
               "\tchain input { # handle 2\n\t\ttype filter hook input priority filter; policy drop;\n"
               "\t\tct state established accept # handle 9\n\t}\n}\n")
    chain = Event("r", 0, "nft", "", 0, 0, True, {"tfam": "1", "table": "filter", "chain": "forward"})
    assert nfhops.dropping_rule(chain, ruleset) == "nft inet filter forward (one of the rules with handles 7, 8)"
    later = ruleset.replace("counter packets 0 bytes 0 drop comment", "counter packets 1 bytes 60 drop comment")
    assert nfhops.dropping_rule(chain, ruleset, later) == "nft inet filter forward handle 7 (comment 'no ssh')"
    other = ruleset.replace("udp dport 53 counter packets 0 bytes 0 drop", "udp dport 53 counter packets 2 bytes 96 drop")
    # a rule without a comment is named by its own text, its counter's figures left out
    assert nfhops.dropping_rule(chain, ruleset, other) == "nft inet filter forward handle 8 ('udp dport 53 counter drop')"
    chain.fields["chain"] = "input"
    assert nfhops.dropping_rule(chain, ruleset) == "nft inet filter input's policy drop"


def test_the_nft_probe_comes_only_with_the_modules_offsets() -> None:
    off = {"skb_data": 208, "skb_head": 200, "skb_nh": 184, "skb_dev": 16, "dev_name": 304, "skb_protocol": 180}
    defs, _ = definitions("labctl_t", parse("icmp"), off, True, True)
    assert not [d for d in defs if "nft_do_chain" in d] and not [d for d in defs if " ct=" in d]
    nft = {"skb_nfct": 104, "chain_table": 64, "chain_name": 88, "table_name": 384, "table_family": 372}
    defs, filters = definitions("labctl_t", parse("icmp"), {**off, **nft}, True, True)
    (d,) = [d for d in defs if "nft_do_chain" in d]  # ICMP is IPv4 only: no nft6
    assert d.startswith("p:labctl_t/nft nft_do_chain skb=+0(%di):x64 ct=+104(+0(%di)):x64 "
                        "chain=+0(+88(%si)):string table=+0(+384(+64(%si))):string tfam=+372(+64(%si)):u8 "
                        "vi=+0(+208(+0(%di))):u8"), d
    assert "nft" in filters and [x for x in defs if x.startswith("p:labctl_t/ip_fwd ") and " ct=+104(%di):x64" in x]


def test_an_echo_request_ends_once_its_reply_is_seen_whatever_the_guests_boot_clocks_say() -> None:
    # b booted 100 s after a: its trace clock is 100 s behind; mapped, b's hops come last
    clocks = {"a": Clock([Round(0, 0.0, 1000.0)]), "r": Clock([Round(0, 0.0, 1000.0)]),
              "b": Clock([Round(0, 100e9, 1000.0)])}
    corr = Correlator(TOPO, clocks)
    req = v4("10.1.0.1", "10.2.0.1", 64, ECHO)
    reply = v4("10.2.0.1", "10.1.0.1", 64, struct.pack(">BBHHH", 0, 0, 0, 301, 1))
    for e in [ev("a", 1000.0, "dev_queue", b"\0" * 14 + req, dev="eth1", at=14),
              ev("a", 1000.1, "xmit", b"\0" * 14 + req, dev="eth1", at=14),
              ev("r", 1001.0, "netif_rx", req, dev="eth1"), ev("r", 1001.1, "ip_fwd", req),
              ev("r", 1001.2, "dev_queue", b"\0" * 14 + req, dev="eth2", at=14),
              ev("r", 1001.3, "xmit", b"\0" * 14 + req, dev="eth2", at=14),
              ev("b", -98998.0, "netif_rx", req, dev="eth1"), ev("b", -98997.9, "ip_local", req),
              ev("b", -98997.0, "dev_queue", b"\0" * 14 + reply, dev="eth1", at=14)]:
        corr.add(e)
    now = int(1010e6)  # every stream 8 ms past the request's last hop: well inside the quiet wait
    got = corr.settle({"a": now, "r": now, "b": now}, quiet_ns=int(10e9))
    assert [(j.header.describe().split(" id ")[0], j.end.kind) for j in got] == [
        ("ICMP echo-request 10.1.0.1 > 10.2.0.1", "answered")]


def test_the_alignment_follows_a_drifting_mapping_by_the_crossings_around_each_packet() -> None:
    align = Alignment()
    # r's mapped clock drifts: at 0 s both ways take 1 ms; 20 s later r's is 10 ms early
    for k in range(4):
        t = k * BUCKET_NS // 4
        align.learn("a", "r", 1_000_000, t)
        align.learn("r", "a", 1_000_000, t)
        align.learn("a", "r", -9_000_000, 20 * 10**9 + t)
        align.learn("r", "a", 11_000_000, 20 * 10**9 + t)
    align.solve({"a": 20e6, "r": 20e6})
    assert align.at("a", 0) == 0.0 and align.at("r", 0) == 0.0
    assert align.at("r", 20 * 10**9) == 10_000_000.0
    assert align.at("r") == 5_000_000.0  # the whole run's fastest both ways: right at neither end
    clock = Clock([Round(0, 0.0, 1000.0), Round(2 * 10**9, 10.0, 1000.0)])
    assert clock.bound_at(10**9) == 1000.0  # within the rounds: their bound
    assert clock.bound_at(4 * 10**9) == pytest.approx(1000.0 + 1e-6 * 2e9)  # 2 s past: + the rate's doubt


def test_what_another_guests_stream_brought_first_under_the_new_name_joins_the_packet() -> None:
    # live, b's stream may bring the masqueraded request before r's brings the rewrite
    inner, outer = v4("10.1.0.2", "10.2.0.2", 64, ECHO), v4("10.2.0.1", "10.2.0.2", 63, ECHO)
    fwd = ev("r", 1.1, "ip_fwd", inner)
    out = ev("r", 1.2, "dev_queue", b"\0" * 14 + outer, dev="eth2", at=14)
    out.fields["skb"] = fwd.skb  # the same skb, rewritten by POSTROUTING's masquerade
    events = [ev("b", 2.0, "netif_rx", outer, dev="eth1"), ev("b", 2.1, "ip_local", outer),
              ev("a", 0.0, "dev_queue", b"\0" * 14 + inner, dev="eth1", at=14),
              ev("a", 0.1, "xmit", b"\0" * 14 + inner, dev="eth1", at=14),
              ev("r", 1.0, "netif_rx", inner, dev="eth1"), fwd, out,
              ev("r", 1.3, "xmit", b"\0" * 14 + outer, dev="eth2", at=14)]
    events[4].fields["skb"] = fwd.skb
    corr = Correlator(TOPO, {g: Clock() for g in TOPO.guests})
    for e in events:
        corr.add(e)
    (j,) = corr.settle(None)
    assert [(h.guest, h.where) for h in j.hops][-4:] == [
        ("r", "net_dev_start_xmit"), ("r", "r.eth2 → b.eth1"), ("b", "netif_receive_skb"), ("b", "ip_local_deliver")]
    assert [h.note for h in j.hops if h.where == "net_dev_queue" and h.guest == "r"] == [
        "SNAT 10.1.0.2 id 301 → 10.2.0.1 id 301"]


def test_a_hop_on_a_bridge_port_a_bond_member_or_a_vlan_says_so() -> None:
    from labctl.follow.follower import iface_roles
    from labctl.lab import load_lab

    lab = load_lab(str(Path(__file__).resolve().parents[2] / "labs" / "dual-stack-router.yaml")).to_dict()
    roles = {g: iface_roles(spec) for g, spec in lab["guests"].items()}
    assert roles == {"a": {"eth1": "port of br0", "br0.10": "VLAN 10 on br0"}, "r": {"eth1.10": "VLAN 10 on eth1"},
                     "b": {"eth1": "member of bond0 (active-backup)", "eth2": "member of bond0 (active-backup)"}}
    topo = Topology(TOPO.nets, guests=TOPO.guests, ifaces={("a", "eth1"): "port of br0"})
    corr = Correlator(topo, {g: Clock() for g in topo.guests})
    req = v4("10.1.0.1", "10.2.0.1", 64, ECHO)
    for e in (ev("a", 0.0, "dev_queue", b"\0" * 14 + req, dev="br0", at=14),
              ev("a", 0.1, "dev_queue", b"\0" * 14 + req, dev="eth1", at=14)):
        corr.add(e)
    (j,) = corr.settle(None)
    assert [(h.dev, h.note) for h in j.hops] == [("br0", ""), ("eth1", "port of br0")]


def test_the_totals_compare_counts_and_the_reports_paths_carry_the_rewrites_and_the_rules() -> None:
    from labctl.report.journeys import _hop_name, follow_metrics
    from labctl.trace.pathmodel import paths, totals

    masq, drop6 = _recorded("masq"), _recorded("drop6")
    assert totals(masq)["nat_rewritten"] == 4 and "dropped_by_rule" not in totals(masq)
    rule = "r: nft inet labctl input handle 4 (comment 'no IPv6 pings from a')"
    assert totals(drop6)["dropped_by_rule"] == {rule: 1}
    metrics = follow_metrics({"follow": {"totals": totals(drop6)}})
    assert metrics[f"follow.rule.{rule}"][0] == 1.0 and metrics["follow.nat"][0] == 0.0
    names = [_hop_name(h) for p in paths(masq) for h in p["hops"]]
    assert any(n.startswith("r net_dev_queue eth2 · SNAT 10.1.0.2 id ") for n in names), names


def test_paths_put_dropped_and_lost_first_then_the_most_taken() -> None:
    """paths(): a group per path and end; dropped and lost ones first, then by how many packets took it."""
    from labctl.trace.hops import Header
    from labctl.trace.pathmodel import End, Hop, Journey, paths

    def journey(i: int, guest: str, kind: str) -> Journey:
        hops = [Hop("a", "xmit", "net_dev_start_xmit", "eth1", 1000 * i), Hop(guest, "netif_rx", "netif_receive_skb", "eth1",
                                                                          1000 * i + 500)]
        return Journey(Header(0, 0, 0, 0, 0, None, b""), hops, End(kind, guest, kind), id=i)

    js = [journey(1, "b", "delivered"), journey(2, "c", "delivered"), journey(3, "c", "delivered"),
          journey(4, "b", "dropped")]
    out = paths(js)
    assert [(p["end"]["kind"], p["count"]) for p in out] == [("dropped", 1), ("delivered", 2), ("delivered", 1)]
    assert out[1]["packets"] == [2, 3] and out[1]["hops"][1]["p50_us"] == 0.5
