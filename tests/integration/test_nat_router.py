"""A guest's firewall and NAT as data on real guests: labs/nat-router.yaml, booted once for the
module (a behind r, which masquerades out of eth2 towards b and drops IPv6 pings from a to itself;
b has no route back to a's network).

* a's ping reaches b with r's address as its source, as a capture in b shows, and is answered;
* an IPv6 ping from a to r is dropped by the lab's nft rule (its counter says so, its comment
  names it) while IPv6 through r to b works; ``status --json`` has the firewall;
* followed live, a's masqueraded ping is one journey each way, r's hop saying the rewrite (SNAT
  out, the reply's rewrite back) and the conntrack state, and the IPv6 ping r drops is "dropped on r
  by nft inet labctl input handle N (comment 'no IPv6 pings from a')";
* ``reset`` of r brings its rules back after they were flushed;
* a rule nft refuses fails ``up`` at its lab line (exit 2), nothing left running.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness
from tests.conftest import ROOT, Cli, new_cli
from tests.integration.conftest import qemu_pids_under, wait_for

OVER_3_MIN = ("one lab of three TCG guests booted, one live follow with probes in all three, a guest reset and a "
              "second lab that nft refuses (booted until the check)")
LAB = ROOT / "labs" / "nat-router.yaml"
NAME = "nat-router"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, image: object) -> Iterator[Cli]:
    """The lab up."""
    cli = new_cli(tmp_path_factory, "nat")
    assert cli.tracked is not None
    cli.tracked.test = "tests/integration/test_nat_router.py (the module's lab)"
    try:
        up = cli("up", str(LAB), "--json")
        assert up.returncode == 0, up.stdout + up.stderr
        yield cli
    finally:
        harness.teardown(cli.tracked)


def _sh(cli: Cli, guest: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return cli("exec", NAME, guest, "--timeout", str(timeout), "--", command, timeout=timeout + 60)


def _ping(cli: Cli, guest: str, target: str, six: bool = False) -> bool:
    out = _sh(cli, guest, f"ping {'-6 ' if six else ''}-c 1 -W 3 {target} >/dev/null 2>&1 && echo ok || echo lost").stdout
    return "ok" in out.split()


def test_a_masquerading_router_gives_inner_pings_its_own_source(lab: Cli) -> None:
    cli = lab
    # a capture in b, the outer guest, of the first echo request it sees
    _sh(cli, "b", "rm -f /tmp/cap.txt /tmp/cap.err; setsid sh -c 'timeout 90 tcpdump -l -n -i eth1 -c 1 "
                  "icmp and icmp[icmptype] == icmp-echo > /tmp/cap.txt 2> /tmp/cap.err' "
                  "</dev/null >/dev/null 2>&1 &")
    for _ in range(60):
        if "listening on" in _sh(cli, "b", "cat /tmp/cap.err").stdout:
            break
        time.sleep(1)
    assert _ping(cli, "a", "10.2.0.2")  # answered: b has no route to 10.1.0.0/24, only to r
    captured = ""
    for _ in range(30):
        captured = _sh(cli, "b", "cat /tmp/cap.txt").stdout
        if "ICMP echo request" in captured:
            break
        time.sleep(1)
    assert "IP 10.2.0.1 > 10.2.0.2: ICMP echo request" in captured, captured
    assert "10.1.0.2" not in captured, captured


def test_an_ipv6_ping_is_dropped_by_the_labs_rule(lab: Cli) -> None:
    cli = lab
    assert not _ping(cli, "a", "fd00:1::1", six=True)  # r's input chain drops it
    assert _ping(cli, "a", "fd00:2::2", six=True)  # through r (forwarded) it goes
    chain = _sh(cli, "r", "nft list chain inet labctl input").stdout
    (rule,) = [ln for ln in chain.splitlines() if "icmpv6 type echo-request" in ln]
    assert 'drop comment "no IPv6 pings from a"' in rule and "counter packets 0 " not in rule, chain
    # the lab's nft file was loaded too (its table counts what r forwards)
    assert "forwarded by r" in _sh(cli, "r", "nft list table inet fwdcount").stdout
    status = json.loads(cli("status", NAME, "--json", check=True).stdout)
    (r,) = [g for g in status["labs"][0]["guests"] if g["name"] == "r"]
    assert r["firewall"]["nat"][0] == {"type": "masquerade", "out": "eth2"}
    assert r["firewall"]["filter"]["input"]["rules"] == [
        'ip6 saddr fd00:1::2 icmpv6 type echo-request counter drop comment "no IPv6 pings from a"']
    text = cli("status", NAME, check=True).stdout
    assert "r firewall: nat: masquerade out eth2; dnat in eth2 tcp 8080 → 10.1.0.2:80" in " ".join(text.split()), text


def _follow(cli: Cli, filt: str, seconds: int, guest: str, command: str) -> list[dict[str, Any]]:
    """``labctl follow LAB FILTER --json`` for ``seconds`` while ``command`` runs on ``guest`` once it follows."""
    with cli.running("follow", NAME, filt, "--json", "--duration", str(seconds)) as proc:
        out: list[str] = []
        err: list[str] = []
        readers = [threading.Thread(target=lambda f=f, into=into: into.extend(iter(f.readline, "")), daemon=True)
                   for f, into in ((proc.stdout, out), (proc.stderr, err))]
        for t in readers:
            t.start()
        wait_for(lambda: any("following" in line for line in err) or proc.poll() is not None, 180, "follow to start")
        _sh(cli, guest, command)
        proc.wait(timeout=180)
        for t in readers:
            t.join(timeout=10)
    assert proc.returncode == 0, "".join(err)
    return [json.loads(line) for line in out if line.strip()]


def _notes(p: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(h["guest"], h["where"]): h.get("note", "") for h in p["hops"]}


@pytest.fixture(scope="module")
def followed(lab: Cli) -> list[dict[str, Any]]:
    """One live follow (its set-up costs most) of a's masqueraded ping to b and its IPv6 ping r drops."""
    return _follow(lab, "(icmp and host 10.2.0.2) or (icmp6 and host fd00:1::2 and host fd00:1::1)", 30, "a",
                   "ping -c 1 -W 3 10.2.0.2; ping -6 -c 1 -W 2 fd00:1::1; true")


def test_a_masqueraded_ping_is_followed_as_one_journey_with_its_snat_hop(followed: list[dict[str, Any]]) -> None:
    packets = [p for p in followed if p["packet"].startswith("ICMP ")]
    (request,) = [p for p in packets if "echo-request" in p["packet"]]
    (reply,) = [p for p in packets if "echo-reply" in p["packet"]]
    assert request["packet"].startswith("ICMP echo-request 10.1.0.2 > 10.2.0.2 id "), request["packet"]
    ident = request["packet"].split(" id ")[1].split()[0]
    assert request["end"]["text"] == "answered by b's kernel (ICMP echo reply sent)", request["end"]
    notes = _notes(request)
    assert notes[("r", "net_dev_queue")] == f"SNAT 10.1.0.2 id {ident} → 10.2.0.1 id {ident}", notes
    assert ("b", "ip_local_deliver") in notes and ("a", "net_dev_queue") in notes  # both sides of r: one journey
    assert "conntrack " in notes[("r", "ip_forward")], notes
    assert notes[("r", "ip_forward")] in ("conntrack new", "conntrack established"), notes  # a's earlier pings
    rnotes = _notes(reply)
    assert rnotes[("r", "ip_forward")] == (f"DNAT 10.2.0.1 id {ident} → 10.1.0.2 id {ident} (the reply, rewritten "
                                           "back); conntrack established, reply"), rnotes
    assert reply["end"]["kind"] == "delivered" and reply["end"]["guest"] == "a", reply["end"]
    assert request["out_of_order"] == reply["out_of_order"] == 0


def test_an_ipv6_ping_dropped_by_an_nft_rule_is_named_with_its_rule(lab: Cli, followed: list[dict[str, Any]]) -> None:
    (request,) = [p for p in followed if p["packet"].startswith("ICMPv6 echo-request")]
    chain = _sh(lab, "r", "nft -a list chain inet labctl input").stdout
    (handle,) = [ln.rsplit("# handle ", 1)[1].strip() for ln in chain.splitlines() if "no IPv6 pings" in ln]
    assert request["end"]["kind"] == "dropped" and request["end"]["text"].startswith(
        f"dropped on r by nft inet labctl input handle {handle} (comment 'no IPv6 pings from a') (NETFILTER_DROP at "
    ), request["end"]
    assert request["hops"][-1]["where"] == "nft inet labctl input", request["hops"]


def test_reset_of_the_router_brings_its_rules_back(lab: Cli) -> None:
    cli = lab
    _sh(cli, "r", "nft flush ruleset")
    assert not _ping(cli, "a", "10.2.0.2")  # no masquerade: b's answer has no way back
    reset = json.loads(cli("reset", NAME, "r", "--json", check=True).stdout)
    assert [g["guest"] for g in reset["guests"]] == ["r"]
    assert _ping(cli, "a", "10.2.0.2")
    assert "masquerade" in _sh(cli, "r", "nft list table inet labctl").stdout


def test_a_rule_nft_refuses_fails_up_at_its_line(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "bad-rule.yaml"
    lab.write_text("name: bad-rule\nnetworks: {n: {}}\nguests:\n  g:\n    memory: 256\n"
                   "    nics:\n      - {name: eth1, model: e1000, network: n, ip: \"fd00:5::1/64\"}\n"
                   "    firewall:\n      filter:\n        input:\n          rules:\n"
                   "            - \"ip6 saddr fd00:5::/64 accept\"\n"
                   "            - \"ip6 saddr fd00:1::/64 tcp dport 22 dropp\"\n")
    up = cli("up", str(lab))
    assert up.returncode == 2, up.stdout + up.stderr
    assert (f"{lab}:13: guests.g.firewall.filter.input.rules[1]: guest g: nft refused rule "
            "'ip6 saddr fd00:1::/64 tcp dport 22 dropp': syntax error") in up.stderr, up.stderr
    assert "rules[0]" not in up.stderr
    assert not (cli.state_dir / "labs" / "bad-rule").exists() and qemu_pids_under(cli.state_dir) == []
