"""A guest's firewall as data (labctl.lab.firewall) and how nft's errors in the guest map back to
the lab file (labctl.up.nftload); the file's problems are golden (tests/labs/invalid/firewall-problems)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from labctl.errors import LabFileError
from labctl.lab import Firewall, load_lab, load_lab_text, settings_text
from labctl.lab.firewall import file_problem, rule_problem
from labctl.up.nftload import FILE, command, problems

LAB = """\
name: fw
networks: {inner: {}, outer: {}}
guests:
  r:
    nics:
      - {name: eth1, model: e1000, network: inner, ip: [10.1.0.1/24, "fd00:1::1/64"]}
      - {name: eth2, model: e1000, network: outer, ip: [10.2.0.1/24, "fd00:2::1/64"]}
    firewall:
      nat:
        masquerade: [{out: eth2, src: 10.1.0.0/24}]
        snat: [{out: eth1, to: "[fd00:1::9]:61000-62000"}]
        dnat: [{in: eth2, proto: udp, port: "5000-5010", to: "10.1.0.2:6000"}, {in: eth2, to: 10.1.0.3}]
      filter:
        input: {policy: drop, rules: ["ct state established,related accept", "tcp dport { 22, 80 } accept"]}
        forward: {}
"""


def _fw(text: str = LAB) -> Firewall:
    fw = load_lab_text(text, "lab.yaml").guests["r"].firewall
    assert fw is not None
    return fw


def test_the_script_is_one_table_with_a_chain_per_hook_and_nat_chains() -> None:
    script, lines = _fw().script()
    assert script.splitlines() == [
        "table inet labctl",
        "delete table inet labctl",
        "table inet labctl {",
        "  chain input {",
        "    type filter hook input priority filter; policy drop;",
        "    ct state established,related accept",
        "    tcp dport { 22, 80 } accept",
        "  }",
        "  chain forward {",
        "    type filter hook forward priority filter; policy accept;",
        "  }",
        "  chain nat_prerouting {",
        "    type nat hook prerouting priority dstnat; policy accept;",
        '    iifname "eth2" udp dport 5000-5010 dnat ip to 10.1.0.2:6000',
        '    iifname "eth2" dnat ip to 10.1.0.3',
        "  }",
        "  chain nat_postrouting {",
        "    type nat hook postrouting priority srcnat; policy accept;",
        '    oifname "eth2" ip saddr 10.1.0.0/24 masquerade',
        '    oifname "eth1" snat ip6 to [fd00:1::9]:61000-62000',
        "  }",
        "}",
    ]
    # each line knows its lab line: the second rule is line 14 of the lab, the masquerade line 10
    assert (lines[7].line, lines[7].path) == (14, "guests.r.firewall.filter.input.rules[1]")
    assert (lines[19].line, lines[19].path) == (10, "guests.r.firewall.nat.masquerade[0]")
    assert lines[20].path == "guests.r.firewall.nat.snat[0]"


def test_the_dict_form_gives_the_same_script_and_the_summary_lines() -> None:
    fw = _fw()
    again = Firewall.from_dict(fw.to_dict())
    assert again.script()[0] == fw.script()[0]
    lab = load_lab_text(LAB, "lab.yaml")
    assert settings_text(lab.guests["r"].to_dict()) == [
        ("firewall: nat: masquerade out eth2 from 10.1.0.0/24; snat out eth1 to [fd00:1::9]:61000-62000; "
         "dnat in eth2 udp 5000-5010 → 10.1.0.2:6000; dnat in eth2 → 10.1.0.3"),
        "firewall: filter input (policy drop): 2 rules",
        "firewall: filter forward (policy accept): 0 rules",
    ]


def test_a_rule_is_one_line_without_semicolons_and_with_balanced_braces() -> None:
    assert rule_problem("tcp dport { 22, 80 } accept") is None
    assert rule_problem("tcp dport 22 accept; flush ruleset") is not None
    assert rule_problem("tcp dport 22 accept\nflush ruleset") == "a rule is one line"
    assert rule_problem("tcp dport } 22 {") == "its braces are not balanced"
    assert rule_problem("x" * 1001) is not None


# nft 1.0.6's own output in a Debian 12 guest (labs/nat-router.yaml's r), for a script with a
# misspelt verdict and a bad meta key, and for an included file.
NFT_OUTPUT = """\
/run/labctl-fw/main.nft:7:21-21: Error: syntax error, unexpected newline
  tcp dport 22 dropp
                    ^
/run/labctl-fw/main.nft:8:3-10: Error: syntax error, unexpected foo, known keys are length, protocol
  meta foo bar
  ^^^^^^^^
/run/labctl-fw/lab-file.nft:2:3-25: Error: Could not process rule: Operation not supported
  tcp dport 22 masquerade
  ^^^^^^^^^^^^^^^^^^^^^^^
"""


def test_nft_errors_name_the_lab_line_and_the_nft_file_line(tmp_path: Path) -> None:
    (tmp_path / "r.nft").write_text("table ip z {\n  chain c\n}\n")
    (tmp_path / "lab.yaml").write_text(
        "name: fw\nnetworks: {n: {}}\nguests:\n  r:\n    nics: [{name: eth1, model: e1000, network: n}]\n"
        "    firewall:\n      file: r.nft\n      filter:\n        input:\n          rules:\n"
        "            - tcp dport 22 dropp\n            - meta foo bar\n")
    fw = load_lab(str(tmp_path / "lab.yaml")).guests["r"].firewall
    assert fw is not None and fw.file is not None
    cmd, lines = command(fw)
    assert cmd.endswith("nft -c -f /run/labctl-fw/main.nft && nft -f /run/labctl-fw/main.nft")
    assert fw.script(FILE)[0].splitlines()[0] == 'include "/run/labctl-fw/lab-file.nft"'
    got = [str(p) for p in problems(NFT_OUTPUT, "r", fw, lines, "lab.yaml")]
    assert got == [
        ("lab.yaml:11: guests.r.firewall.filter.input.rules[0]: guest r: nft refused rule 'tcp dport 22 dropp': "
         "syntax error, unexpected newline"),
        ("lab.yaml:12: guests.r.firewall.filter.input.rules[1]: guest r: nft refused rule 'meta foo bar': "
         "syntax error, unexpected foo, known keys are length, protocol"),
        (f"{tmp_path / 'r.nft'}:2: guests.r.firewall.file: guest r: nft refused line 2 of r.nft: "
         "Could not process rule: Operation not supported"),
    ]
    assert problems("nft: command not found", "r", fw, lines, "lab.yaml") == []


def test_the_nft_file_is_read_with_the_lab_and_is_in_its_dict(tmp_path: Path) -> None:
    (tmp_path / "r.nft").write_text("flush ruleset\n")
    (tmp_path / "lab.yaml").write_text("name: fw\nnetworks: {n: {}}\nguests:\n  r:\n"
                                       "    nics: [{name: eth1, model: e1000, network: n}]\n    firewall: {file: r.nft}\n")
    guest = load_lab(str(tmp_path / "lab.yaml")).guests["r"].to_dict()
    assert guest["firewall"]["file"]["text"] == "flush ruleset\n"
    assert guest["firewall"]["file"]["sha256"] == hashlib.sha256(b"flush ruleset\n").hexdigest()


def test_an_nft_file_outside_the_lab_directory_or_another_users_is_refused(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    (tmp_path / "outside.nft").write_text("flush ruleset\n")
    (lab_dir / "link.nft").symlink_to(tmp_path / "outside.nft")
    (lab_dir / "ok.nft").write_text("flush ruleset\n")
    assert file_problem("ok.nft", lab_dir) == (None, lab_dir / "ok.nft")
    assert file_problem("../outside.nft", lab_dir)[0] == "nft file ../outside.nft is not inside the lab file's directory"
    assert file_problem("link.nft", lab_dir)[0] == "nft file link.nft is not inside the lab file's directory"
    assert "write a path relative" in str(file_problem("/etc/nftables.conf", lab_dir)[0])
    (lab_dir / "big.nft").write_text("#" * (64 * 1024 + 1))
    assert "at most 65536" in str(file_problem("big.nft", lab_dir)[0])
    os.chmod(lab_dir / "ok.nft", 0o666)
    assert "other-writable" in str(file_problem("ok.nft", lab_dir)[0])
    os.chmod(lab_dir / "ok.nft", 0o644)
    # a lab file of another user (uid 4242) names only that user's files
    if os.geteuid() == 4242:
        pytest.skip("needs a uid that is not the test's")
    why = file_problem("ok.nft", lab_dir, owner=4242)[0]
    assert why is not None and "a lab file of another user names only files that user owns" in why


def test_a_bad_firewall_is_exit_2_at_its_lines() -> None:
    bad = LAB.replace("out: eth2, src", "out: wan0, src")
    with pytest.raises(LabFileError) as info:
        load_lab_text(bad, "lab.yaml")
    assert [str(p) for p in info.value.problems] == [
        ("lab.yaml:10: guests.r.firewall.nat.masquerade[0].out: guest r has no interface 'wan0' "
         "(its interfaces: eth1, eth2)")]
    assert info.value.exit_code == 2


def test_the_graph_marks_a_guest_with_a_firewall_and_lists_it_in_its_tooltip() -> None:
    from labctl.net.graph import to_svg, topology

    lab = load_lab_text(LAB, "lab.yaml")
    node = topology(lab).guest("r")
    assert node.firewall_mark == "firewall masquerade, snat, dnat, input, forward"
    assert node.firewall_mark in node.info_text
    assert "firewall: filter input (policy drop): 2 rules" in to_svg(topology(lab))
