"""Today's datapath, followed: IPv6 through a router, a TTL that runs out on it, ARP for nobody.

One lab, booted once for the module: labs/dual-stack-router.yaml (a in a bridge, r forwarding IPv4 and
IPv6, b behind an active-backup bond) with these steps instead of its own, each following:

* ``ipv6``: three IPv6 pings a → b through r: each request's full path (a's bridge and NIC, the wire,
  r's ip6_forward, b's bond member, ip6_input) answered by b's kernel, each reply's delivered to ping
  on a; none missing, no hop out of order;
* ``ttl``: a ping with TTL 1 and an IPv6 one with hop limit 1: each request dropped on r at
  ip_forward/ip6_forward ("TTL exceeded; time-exceeded sent to a"), never "delivered" by the copy
  ping reads from its error queue; the time-exceeded itself delivered to ping on a;
* ``arp``: a ping to 10.1.0.99, which nobody has: each of a's ARP requests followed to r, unanswered;
  the echo request dropped on a (NEIGH_FAILED) and answered by a host-unreachable;
* ``vlan``: ``icmp and vlan 10`` while a pings r over VLAN 10 (br0.10 to eth1.10) and over the untagged
  network (br0 to eth1): only the VLAN pings' journeys, with every hop (r's virtio-net leaves the tag
  in the frame: its receive and its driver's hops read the packet inside it), the wire's tag said;
* live: ``labctl follow LAB ip6 ...`` hop by hop, the same ends; ``vlan 10 and icmp`` the same way as
  the step; a filter starting with '-' refused.
"""

from __future__ import annotations

OVER_3_MIN = ("one lab of three TCG guests booted (a bridge, a router, a bond) and four follow steps run, then three "
              "live follows on it, each putting probes into three guests")

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness
from tests.conftest import Cli, new_cli
from tests.integration.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
LAB = "follow6"
STEPS = """\
steps:
  - name: ipv6
    follow: {filter: "icmp6 and host fd00:1::2 and host fd00:2::2"}
    run:
      - {guest: a, command: "ping -6 -c 3 -i 0.3 -W 2 fd00:2::2", timeout: 60}
  - name: ttl
    follow: {filter: "icmp or (icmp6 and host fd00:1::2)"}
    run:
      - {guest: a, command: "ping -c 1 -t 1 -W 2 10.2.0.2; ping -6 -c 1 -t 1 -W 2 fd00:2::2; true", timeout: 60}
  - name: arp
    follow: {filter: "arp host 10.1.0.99 or (icmp and host 10.1.0.2 and not host 10.2.0.2)"}
    run:
      - {guest: a, command: "ping -c 1 -W 6 10.1.0.99; true", timeout: 60}
  - name: vlan
    follow: {filter: "icmp and vlan 10"}
    run:
      - {guest: a, command: "ping -c 2 -i 0.3 -W 2 10.10.0.1 && ping -c 2 -i 0.3 -W 2 10.1.0.1", timeout: 60}
"""


def lab_yaml() -> str:
    text = (ROOT / "labs" / "dual-stack-router.yaml").read_text()
    return text.split("\nsteps:", 1)[0].replace("name: dual-stack-router", f"name: {LAB}") + "\n" + STEPS


@pytest.fixture(scope="module")
def lab(image: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, Path, dict[str, Any]]]:
    cli = new_cli(tmp_path_factory, "fol6")
    assert cli.tracked is not None
    cli.tracked.test = f"test_follow_ipv6 lab (first used by {harness.current_test()})"
    d = tmp_path_factory.mktemp("follow6")
    (d / "lab.yaml").write_text(lab_yaml())
    try:
        up = cli("up", str(d / "lab.yaml"), "--out", str(d / "runs"), "--json", timeout=1800)
        assert up.returncode == 0, up.stdout + up.stderr
        bundle = Path(json.loads(up.stdout)["bundle"])
        yield cli, bundle, json.loads((bundle / "summary.json").read_text())
    finally:
        harness.teardown(cli.tracked)


def _packets(bundle: Path, summary: dict[str, Any], step: str) -> list[dict[str, Any]]:
    s = next(x for x in summary["steps"] if x["name"] == step)
    doc = json.loads((bundle / s["dir"] / "journey.json").read_text())
    assert doc["totals"]["out_of_order_hops"] == 0, doc["totals"]
    return list(doc["packets"])


def _hops(p: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(h["guest"], h["where"], h.get("dev")) for h in p["hops"]]


A_OUT = [("a", "net_dev_queue", "br0"), ("a", "net_dev_start_xmit", "br0"), ("a", "net_dev_queue", "eth1"),
         ("a", "net_dev_start_xmit", "eth1"), ("a", "a.eth1 → r.eth1", None), ("r", "netif_receive_skb", "eth1")]


def test_ipv6_pings_through_the_router_are_followed_hop_by_hop(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    _, bundle, summary = lab
    packets = _packets(bundle, summary, "ipv6")
    requests = [p for p in packets if "echo-request" in p["packet"]]
    replies = [p for p in packets if "echo-reply" in p["packet"]]
    assert len(requests) == 3 and len(replies) == 3, [p["packet"] for p in packets]
    for p in requests:
        assert p["packet"].startswith("ICMPv6 echo-request fd00:1::2 > fd00:2::2 id ")
        assert p["end"]["kind"] == "answered" and p["end"]["guest"] == "b", p["end"]
        assert _hops(p) == [*A_OUT, ("r", "ip6_forward", None), ("r", "net_dev_queue", "eth2"),
                            ("r", "net_dev_start_xmit", "eth2"), ("r", "r.eth2 → b.eth1", None),
                            ("b", "netif_receive_skb", "eth1"), ("b", "ip6_input", None)], _hops(p)
    for p in replies:
        assert p["end"]["kind"] == "delivered" and p["end"]["text"].startswith("delivered to ping (pid ")
        where = _hops(p)
        assert where[:4] == [("b", "net_dev_queue", "bond0"), ("b", "net_dev_start_xmit", "bond0"),
                             ("b", "net_dev_queue", "eth1"), ("b", "net_dev_start_xmit", "eth1")], where
        assert ("r", "ip6_forward", None) in where and where[-1] == ("a", "skb_copy_datagram_iovec", None)


def test_a_ttl_that_runs_out_on_the_router_is_its_drop_and_answer(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    _, bundle, summary = lab
    packets = _packets(bundle, summary, "ttl")
    by = {p["packet"].split(" id ")[0]: p for p in packets if "echo-request" in p["packet"]}
    v4, v6 = by["ICMP echo-request 10.1.0.2 > 10.2.0.2"], by["ICMPv6 echo-request fd00:1::2 > fd00:2::2"]
    assert v4["end"]["kind"] == "dropped" and v4["end"]["guest"] == "r"
    assert v4["end"]["text"] == "dropped on r at ip_forward: TTL exceeded; time-exceeded sent to a", v4["end"]
    assert v6["end"]["text"] == "dropped on r at ip6_forward: hop limit exceeded; time-exceeded sent to a", v6["end"]
    assert _hops(v4) == [*A_OUT, ("r", "ip_forward", None)] and _hops(v6) == [*A_OUT, ("r", "ip6_forward", None)]
    errors = [p for p in packets if "time-exceeded" in p["packet"]]
    assert sorted(p["packet"].split()[0] for p in errors) == ["ICMP", "ICMPv6"], packets
    assert all(p["packet"].endswith((" > 10.1.0.2", " > fd00:1::2")) for p in errors), errors
    # ping reads the error itself (a raw socket) or only the copy in its error queue (a ping socket)
    assert all(p["end"]["guest"] == "a" and (p["end"]["kind"] == "delivered" or "error queue" in p["end"]["text"])
               for p in errors), errors
    assert not [p for p in packets if p["end"]["kind"] == "delivered" and "echo-request" in p["packet"]]


def test_arp_for_an_address_nobody_has(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    _, bundle, summary = lab
    packets = _packets(bundle, summary, "arp")
    asks = [p for p in packets if p["packet"] == "ARP who-has 10.1.0.99 tell 10.1.0.2"]
    assert len(asks) == 3, [p["packet"] for p in packets]  # net.ipv4.neigh.default.mcast_solicit
    for p in asks:
        assert p["end"]["kind"] == "unanswered" and "nobody has 10.1.0.99 (r took it in" in p["end"]["text"]
        assert _hops(p) == [*A_OUT, ("r", "arp_rcv", None)], _hops(p)
    (ping,) = [p for p in packets if p["packet"].startswith("ICMP echo-request 10.1.0.2 > 10.1.0.99")]
    assert ping["end"]["kind"] == "dropped" and ping["end"]["reason"] == "NEIGH_FAILED", ping["end"]
    assert ping["end"]["text"].endswith("; host-unreachable sent to a"), ping["end"]
    (unreach,) = [p for p in packets if p["packet"].startswith("ICMP host-unreachable")]
    assert unreach["end"]["guest"] == "a" and unreach["end"]["kind"] in ("delivered", "consumed"), unreach["end"]


def _follow(cli: Cli, filt: str, seconds: int, guest: str, command: str) -> list[dict[str, Any]]:
    """``labctl follow LAB FILTER --json`` for ``seconds`` while ``command`` runs on ``guest`` once it follows."""
    with cli.running("follow", LAB, filt, "--json", "--duration", str(seconds)) as proc:
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
    return [json.loads(line) for line in out if line.strip()]


def test_ipv6_and_a_ttl_exceeded_followed_live(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    cli = lab[0]
    packets = _follow(cli, "ip6 and icmp6 and (host fd00:2::2 or src host fd00:1::1)", 40, "a",
                      "ping -6 -c 1 -W 3 fd00:2::2; ping -6 -c 1 -t 1 -W 2 fd00:2::2; true")
    ends = sorted((p["packet"].split(" id ")[0], p["end"]["text"].split(" (pid")[0]) for p in packets
                  if "echo" in p["packet"] or "time-exceeded" in p["packet"])
    assert ends == [("ICMPv6 echo-reply fd00:2::2 > fd00:1::2", "delivered to ping"),
                    ("ICMPv6 echo-request fd00:1::2 > fd00:2::2", "answered by b's kernel (ICMPv6 echo reply sent)"),
                    ("ICMPv6 echo-request fd00:1::2 > fd00:2::2",
                     "dropped on r at ip6_forward: hop limit exceeded; time-exceeded sent to a"),
                    ("ICMPv6 time-exceeded fd00:1::1 > fd00:1::2",
                     ("delivered to the kernel (ip6_input) on a: an ICMPv6 error, for the socket that sent the "
                      "packet it quotes (its error queue)"))], ends
    assert all(p["out_of_order"] == 0 for p in packets)
    request = next(p for p in packets if p["end"]["kind"] == "answered")
    assert _hops(request)[:len(A_OUT)] == A_OUT and ("r", "ip6_forward", None) in _hops(request)


def test_a_filter_that_would_be_an_option_is_refused(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    cli = lab[0]
    for filt in ("-w/tmp/x", " --version"):
        res = cli("follow", LAB, "--", filt, timeout=120)
        assert res.returncode == 2 and "cannot start with '-'" in res.stderr, res.stderr


# a's ping to r over VLAN 10: from br0.10 through the bridge (the tag in skb->vlan_tci) and its e1000 (which
# inserts it), into r's virtio-net, which strips none: r sees the packet inside the tag until the stack
# takes it out, and its own reply with the tag pushed into the frame before its driver
VLAN_OUT = [("a", "net_dev_queue", "br0.10"), ("a", "net_dev_start_xmit", "br0.10"), ("a", "net_dev_queue", "br0"),
            ("a", "net_dev_start_xmit", "br0"), ("a", "net_dev_queue", "eth1"), ("a", "net_dev_start_xmit", "eth1"),
            ("a", "a.eth1 → r.eth1", None), ("r", "netif_receive_skb", "eth1"), ("r", "ip_local_deliver", None)]
VLAN_BACK = [("r", "net_dev_queue", "eth1.10"), ("r", "net_dev_start_xmit", "eth1.10"), ("r", "net_dev_queue", "eth1"),
             ("r", "net_dev_start_xmit", "eth1"), ("r", "r.eth1 → a.eth1", None), ("a", "netif_receive_skb", "eth1"),
             ("a", "netif_receive_skb", "br0"), ("a", "ip_local_deliver", None), ("a", "skb_copy_datagram_iovec", None)]


def _vlan_journeys(packets: list[dict[str, Any]], count: int) -> None:
    """Only the pings over VLAN 10 (``count`` each way), each with its every hop and the VLAN at them."""
    assert sorted(p["packet"].split(" id ")[0] for p in packets) == (
        ["ICMP echo-reply 10.10.0.1 > 10.10.0.2"] * count + ["ICMP echo-request 10.10.0.2 > 10.10.0.1"] * count), [
        (p["packet"], _hops(p)) for p in packets]
    for p in packets:
        request = "echo-request" in p["packet"]
        assert _hops(p) == (VLAN_OUT if request else VLAN_BACK), _hops(p)
        assert p["vlans"] == [10] and p["out_of_order"] == 0, p
        notes = {(h["guest"], h["where"], h.get("dev")): h.get("note", "") for h in p["hops"]}
        wire = ("a", "a.eth1 → r.eth1", None) if request else ("r", "r.eth1 → a.eth1", None)
        # (then, maybe, that the receiver's hops are shown later within the clocks' bounds)
        assert notes[wire].startswith("seen on the host side at both ends; tagged VLAN 10"), notes
        assert notes[("r", "netif_receive_skb" if request else "net_dev_start_xmit", "eth1")] == (
            "tagged VLAN 10 in the frame"), notes
        vdev = ("a", "net_dev_queue", "br0.10") if request else ("r", "net_dev_queue", "eth1.10")
        assert notes[vdev] == ("VLAN 10 on br0" if request else "VLAN 10 on eth1"), notes
        assert p["end"]["kind"] == ("answered" if request else "delivered"), p["end"]


def test_a_vlan_is_followed_and_only_its_journeys_are_kept(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    _, bundle, summary = lab
    _vlan_journeys(_packets(bundle, summary, "vlan"), 2)  # the two untagged pings to 10.1.0.1: not kept


def test_a_vlan_followed_live_and_a_misplaced_vlan_refused(lab: tuple[Cli, Path, dict[str, Any]]) -> None:
    cli = lab[0]
    packets = _follow(cli, "vlan 10 and icmp", 40, "a", "ping -c 1 -W 3 10.10.0.1; ping -c 1 -W 3 10.1.0.1; true")
    _vlan_journeys(packets, 1)
    res = cli("follow", LAB, "icmp or vlan 10", timeout=120)
    assert res.returncode == 2 and "'vlan' only ANDed with the whole filter" in res.stderr, res.stderr
