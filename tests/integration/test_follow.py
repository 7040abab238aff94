"""Where did my packet go: packets followed through real guests' kernels and wires, and every drop.

One lab, booted once for the module: a — r — b, r a router with strict rp_filter, b with an
nftables rule that drops UDP to port 9, a with a second address (10.1.9.1) r has no route back to.
``labctl up`` runs its two steps and leaves it up, so the module reads their bundle and then follows
live on the same guests:

* step ``paths`` follows ICMP and UDP port 9: two pings a → b (each request answered by b's kernel, each
  reply delivered to ping on a, with r's forwarding hop), one from 10.1.9.1 (dropped on r for
  IP_RPFILTER), one datagram to b:9 (dropped on b for NETFILTER_DROP by the rule, named with its table
  and chain); its drops table says the same;
* step ``lossy`` loses everything a sends (netem loss 100% on a.eth1): lost on the wire, netem named;
* a bpftrace program on b during ``paths``: its map and histogram in the summary and the report;
* live: a ping hop by hop on every guest in order, the wire seen on the host side; a netfilter drop
  with its rule; bad filters and unknown guests refused with exit 2 before anything starts;
* in the browser (labctl serve, Debian's chromium): the lab page follows, and the dropped ping's hops
  are lit in turn on the topology, r marked where it died.
"""

from __future__ import annotations

OVER_3_MIN = ("over 3 min only on a loaded host: one lab of three TCG guests booted and two steps run (its setup: 100 s "
              "at load 6, 220 s at load 13 on this 2-core host), then three live follows on it (two in a terminal, one "
              "from the browser), each putting probes into three guests; the file: 2.4 min at load 6, 5.6 at load 13")

import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.trace.tef import validate_trace
from tests import harness
from tests.conftest import Cli, new_cli
from tests.integration.conftest import wait_for

LAB = "followlab"
LAB_YAML = """\
name: followlab
networks: {n1: {}, n2: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio-net-pci, network: n1, ip: 10.1.0.1/24}]
    setup:  # a's ARP names its eth1 address whatever the packet's source (r's rp_filter would drop it)
      - ip route add 10.2.0.0/24 via 10.1.0.254
      - ip addr add 10.1.9.1/32 dev lo
      - sysctl -qw net.ipv4.conf.all.arp_announce=2 net.ipv4.conf.eth1.arp_announce=2
  r:
    nics:
      - {name: eth1, model: e1000, network: n1, ip: 10.1.0.254/24}
      - {name: eth2, model: virtio-net-pci, network: n2, ip: 10.2.0.254/24}
    setup: ["sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.eth1.rp_filter=1"]
  b:
    nics: [{name: eth1, model: virtio-net-pci, network: n2, ip: 10.2.0.1/24}]
    setup:
      - ip route add 10.1.0.0/24 via 10.2.0.254
      - nft add table inet filter
      - nft add chain inet filter input '{ type filter hook input priority 0; policy accept; }'
      - nft add rule inet filter input udp dport 9 counter drop
steps:
  - name: paths
    follow: {filter: "icmp or udp port 9"}
    trace:
      b:
        stats: false
        bpftrace: {script: "tracepoint:net:netif_receive_skb { @len = hist(args->len); @rx[str(args->name)] = count(); }"}
    run:
      - {guest: a, command: "ping -c 2 -i 0.3 10.2.0.1"}
      - {guest: a, command: "ping -c 1 -W 1 -I 10.1.9.1 10.2.0.1; true"}
      - {guest: a, command: "echo x | nc -u -w1 10.2.0.1 9; true"}
  - name: lossy
    impair: {a.eth1: {loss: 100%}}
    follow: {filter: "icmp", guests: [a, r]}
    run:
      - {guest: a, command: "ping -c 2 -i 0.3 -W 1 10.2.0.254; true"}
"""


@pytest.fixture(scope="module")
def lab(image: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, Path, dict[str, Any]]]:
    """The lab up with its steps run: the CLI, the steps' bundle and its summary."""
    cli = new_cli(tmp_path_factory, "fol")
    assert cli.tracked is not None
    cli.tracked.test = f"test_follow lab (first used by {harness.current_test()})"
    d = tmp_path_factory.mktemp("followlab")
    (d / "lab.yaml").write_text(LAB_YAML)
    try:
        up = cli("up", str(d / "lab.yaml"), "--out", str(d / "runs"), "--json", timeout=1500)
        assert up.returncode == 0, up.stdout + up.stderr
        bundle = Path(json.loads(up.stdout)["bundle"])
        yield cli, bundle, json.loads((bundle / "summary.json").read_text())
    finally:
        harness.teardown(cli.tracked)


def _step(summary: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in summary["steps"] if s["name"] == name)


def test_the_steps_bundle_has_every_drop_with_where_and_why(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    cli, bundle, summary = lab
    rows = {(r["guest"], r["reason"]): r for r in _step(summary, "paths")["drops"]["rows"]}
    nf = rows[("b", "NETFILTER_DROP")]
    assert nf["count"] == 1 and nf["dev"] == "eth1" and nf["headers"][0].startswith("UDP 10.1.0.1:")
    assert nf["rules"] == ["nftables rule 'udp dport 9 counter drop' (table inet filter, chain input, handle 2)"]
    rp = rows[("r", "IP_RPFILTER")]
    assert rp["function"].startswith("ip_rcv_finish_core") and len(rp["headers"]) == 1
    assert rp["headers"][0].startswith("ICMP echo-request 10.1.9.1 > 10.2.0.1")
    lossy = {(r["guest"], r["reason"], r["protocol"]): r["count"] for r in _step(summary, "lossy")["drops"]["rows"]}
    assert lossy[("a", "QDISC_DROP", "IPv4")] == 2  # the pings netem lost (IPv6's neighbour discovery too)
    # each guest's drop instance is made once and emptied for each step: the first step's drops are its own
    assert not {k for k in lossy if k[1] in ("NETFILTER_DROP", "IP_RPFILTER")}, lossy
    # and removed when the steps are over (the lab stays up)
    for g in ("a", "r", "b"):
        left = cli("exec", LAB, g, "--", "ls /sys/kernel/tracing/instances; grep labctl /sys/kernel/tracing/dynamic_events")
        assert "labctl" not in left.stdout, (g, left.stdout)
    html = (bundle / "report.html").read_text()
    assert "Drops" in html and "NETFILTER_DROP" in html and "Followed packets" in html


def test_the_step_follows_each_packet_to_its_end(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    _, bundle, summary = lab
    step = _step(summary, "paths")
    doc = json.loads((bundle / step["dir"] / "journey.json").read_text())
    ends = sorted((p["end"]["kind"], p["packet"].split(" id ")[0].split(":")[0]) for p in doc["packets"])
    assert ends == [("answered", "ICMP echo-request 10.1.0.1 > 10.2.0.1")] * 2 + [
        ("delivered", "ICMP echo-reply 10.2.0.1 > 10.1.0.1")] * 2 + [
        ("dropped", "ICMP echo-request 10.1.9.1 > 10.2.0.1"), ("dropped", "UDP 10.1.0.1")], ends
    by_reason = {p["end"].get("reason"): p["end"] for p in doc["packets"]}
    assert by_reason["IP_RPFILTER"]["guest"] == "r"
    assert by_reason["NETFILTER_DROP"]["guest"] == "b" and "by nft inet filter input handle 2 ('udp dport 9 counter drop')" in by_reason[
        "NETFILTER_DROP"]["text"]
    assert doc["totals"]["out_of_order_hops"] == 0
    lossy = json.loads((bundle / _step(summary, "lossy")["dir"] / "journey.json").read_text())
    # both echo requests lost on the wire; besides them, an error back to ping on a may be delivered when a's
    # ARP for r (lost too) fails while ping still waits: it depends on the neighbour's state at the step's start
    lost = [p for p in lossy["packets"] if p["end"]["kind"] == "lost"]
    assert [p["packet"].split(" id ")[0] for p in lost] == ["ICMP echo-request 10.1.0.1 > 10.2.0.254"] * 2, lossy
    assert all("netem loss 100% (labctl's impairment of a.eth1)" in p["end"]["text"] for p in lost)
    assert all(p["end"]["kind"] == "delivered" and p["end"]["guest"] == "a" for p in lossy["packets"] if p not in lost)
    timeline = json.loads(gzip.decompress((bundle / step["dir"] / "journey-trace.json.gz").read_bytes()))
    assert validate_trace(timeline) == [] and any(e["ph"] == "s" for e in timeline["traceEvents"])


def test_a_steps_bpftrace_program_leaves_its_maps(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    _, bundle, summary = lab
    b = _step(summary, "paths")["bpftrace"]["b"]
    assert b["probes"] == 1 and b["hists"]["@len"][""] and sum(x["count"] for x in b["hists"]["@len"][""]) > 0
    assert dict(b["maps"]["@rx"]["entries"])["eth1"] >= 3  # two ping requests and the datagram, at least
    assert "b @len" in (bundle / "report.html").read_text()  # its histogram drawn


def _follow(cli: Cli, filt: str, count: int, guest: str, command: str, *extra: str) -> tuple[list[dict[str, Any]], str]:
    """``labctl follow LAB FILTER -c COUNT --json`` while ``command`` runs on ``guest`` once it follows."""
    with cli.running("follow", LAB, filt, "-c", str(count), "--json", "--duration", "120", *extra) as proc:
        out: list[str] = []
        err: list[str] = []
        readers = [threading.Thread(target=lambda f=f, into=into: into.extend(iter(f.readline, "")), daemon=True)
                   for f, into in ((proc.stdout, out), (proc.stderr, err))]
        for t in readers:
            t.start()
        wait_for(lambda: any("following" in line for line in err) or proc.poll() is not None, 180, "follow to start")
        cli("exec", LAB, guest, "--", command, timeout=120)
        proc.wait(timeout=180)
        for t in readers:
            t.join(timeout=10)
    assert proc.returncode == 0, "".join(err)
    return [json.loads(line) for line in out if line.strip()], "".join(err)


def test_a_ping_and_a_netfilter_drop_are_followed_live(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    """One live follow: a ping hop by hop through the router, and a datagram to its netfilter rule."""
    cli = lab[0]
    # a's neighbour r made sure first: a request queued for an ARP reply leaves from the softirq, not ping
    packets, err = _follow(cli, "(icmp and host 10.2.0.1) or udp port 9", 3, "a",
                           "ping -c 1 -W 5 10.1.0.254 >/dev/null; ping -c 1 10.2.0.1; echo y | nc -u -w1 10.2.0.1 9; true")
    (udp,) = [p for p in packets if p["packet"].startswith("UDP")]
    end = udp["end"]
    assert (end["kind"], end["guest"], end["reason"]) == ("dropped", "b", "NETFILTER_DROP")
    assert end["text"].startswith("dropped on b by nft inet filter input handle 2 ('udp dport 9 counter drop') ("), end
    request, reply = sorted((p for p in packets if p is not udp), key=lambda p: "reply" in p["packet"])
    assert request["end"]["kind"] == "answered" and request["end"]["guest"] == "b"
    assert reply["end"]["text"].startswith("delivered to ping (pid ") and reply["end"]["guest"] == "a"
    hops = [(h["guest"], h["where"], h.get("dev")) for h in request["hops"]]
    assert hops == [("a", "net_dev_queue", "eth1"), ("a", "net_dev_start_xmit", "eth1"),
                    ("a", "a.eth1 → r.eth1", None), ("r", "netif_receive_skb", "eth1"), ("r", "ip_forward", None),
                    ("r", "net_dev_queue", "eth2"), ("r", "net_dev_start_xmit", "eth2"),
                    ("r", "r.eth2 → b.eth1", None), ("b", "netif_receive_skb", "eth1"), ("b", "ip_local_deliver", None),
                    ("b", "nft inet filter input", None)]  # b's input chain (its setup's nft rules), a hop of its own
    assert request["hops"][0]["task"].startswith("ping (") and reply["hops"][-1]["where"] == "skb_copy_datagram_iovec"
    for p in packets:
        times = [h["t_us"] for h in p["hops"]]
        assert times == sorted(times) and p["out_of_order"] == 0
        assert all("seen on the host side at both ends" in h["note"] for h in p["hops"] if h["point"] == "wire")
    assert "clocks mapped onto the host's within" not in err  # --json: the bounds are in the last line
    assert "clock bounds a ±" in err


def test_bad_filters_and_guests_are_refused_before_anything_starts(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    cli = lab[0]
    for args, says in ((("icmp and hst 1",), "syntax error"), (("portrange 1-9",), "does not follow by 'portrange'"),
                       (("icmp", "--guests", "a,z"), "has no guest 'z'")):
        res = cli("follow", LAB, *args, timeout=120)
        assert res.returncode == 2 and says in res.stderr, res.stderr
    left = cli("exec", LAB, "a", "--", "grep -c labctl_ /sys/kernel/tracing/dynamic_events; ls /sys/kernel/tracing/instances",
               timeout=60)
    assert left.stdout.split() == ["0"], left.stdout
    assert not list((cli.state_dir / "labs" / LAB / "captures").glob("*.json"))


def test_the_lab_page_lights_each_hop_and_marks_the_drop(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    pw_sync = pytest.importorskip("playwright.sync_api")
    from tests.integration.test_web_tools import CHROMIUM, browser_page, read_serve

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is missing (setup.sh)")
    cli = lab[0]
    csp: list[str] = []
    with cli.running("serve", "--listen", "127.0.0.1:0") as serve:
        urls = read_serve(serve, {"base", "owner"})
        with pw_sync.sync_playwright() as pw:
            page = browser_page(pw, urls["owner"], csp)
            page.goto(urls["base"] + "/lab/" + LAB)
            expect = pw_sync.expect
            page.fill("#follow-filter", "icmp and src host 10.1.9.1")
            page.click("#follow-start")
            # "following" only once the probes are on in every guest (before that the ping would pass unseen)
            expect(page.locator("#follow-status")).to_contain_text("following 'icmp and src", timeout=120_000)
            cli("exec", LAB, "a", "--", "ping -c 1 -W 1 -I 10.1.9.1 10.2.0.1; true", timeout=120)
            expect(page.locator("#packets li.dropped").first).to_contain_text("IP_RPFILTER", timeout=60_000)
            svg = page.locator("#topology svg")
            expect(svg).to_have_attribute("data-end", "dropped", timeout=30_000)  # once every hop was lit
            assert svg.get_attribute("data-played") == "a,a.eth1 → r.eth1,r"
            expect(page.locator('#topology svg g.guest.dropmark[data-guest="r"]')).to_have_count(1)
            # Its hops, each with its note, as the API (and labctl follow --json) has them, then its end.
            shown = json.loads(page.evaluate("fetch('/api/lab/" + LAB + "/packets').then((r) => r.text())"))
            pkt = next(p for p in shown["packets"] if "10.1.9.1" in p["packet"])
            rows = page.locator("#hops li.hop:not(.end)")
            expect(rows).to_have_count(len(pkt["hops"]))
            texts = rows.all_text_contents()
            for hop, text in zip(pkt["hops"], texts, strict=True):
                where = hop["where"] if hop["point"] == "wire" else f"{hop['guest']} {hop['where']}"
                assert text.startswith(where) and (hop.get("note") or "") in text, (hop, text)
            assert texts[0].startswith("a net_dev_queue eth1") and any("a.eth1 → r.eth1" in t for t in texts), texts
            assert any(h.get("note") for h in pkt["hops"]), pkt  # the wire hop's, at least (the host side's captures)
            expect(page.locator("#hops li.end.dropped")).to_contain_text("IP_RPFILTER")
            page.click("#follow-stop")
            expect(page.locator("#follow-status")).to_contain_text("not following", timeout=60_000)
            page.context.browser.close()
    assert csp == []
    left = cli("exec", LAB, "r", "--", "grep -c labctl_ /sys/kernel/tracing/dynamic_events", timeout=60)
    assert left.stdout.split() == ["0"], left.stdout
