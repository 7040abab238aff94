"""Training courses with real guests: graded checks on the rp_filter exercise, and a class of three
students whose handouts work with plain OpenSSH."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, Cli
from tests.integration.conftest import qemu_pids_under

LAB = ROOT / "labs" / "training-rp-filter.yaml"
NAME = "training-rp-filter"
FIX = "ip route add 10.80.9.0/24 via 10.80.0.1 && echo 'strict rp_filter on b' > /root/answer"


def test_check_fails_on_the_fresh_exercise_then_passes_once_fixed(cli: Cli, image: object) -> None:
    up = cli("up", str(LAB), "--instance", "t1", "--accel", "auto")
    assert up.returncode == 0, up.stderr
    ident = f"{NAME}@t1"
    try:
        # setup ran at up: b filters strictly, a has its service address
        sysctl = cli("exec", ident, "b", "--", "sysctl -n net.ipv4.conf.all.rp_filter", check=True)
        assert sysctl.stdout.strip() == "1"

        fresh = cli("check", ident)
        assert fresh.returncode == 6, fresh.stdout + fresh.stderr
        assert "0/2 checks pass" in fresh.stdout
        assert "fail (exit 1)" in fresh.stdout
        assert "reversepath" in fresh.stdout  # the hint of the failing check is shown
        data = json.loads(cli("check", ident, "--json").stdout)
        assert data["passed"] == 0 and data["total"] == 2
        assert {c["name"]: c["status"] for c in data["checks"]} == {"ping-from-service-address": "fail",
                                                                     "answer": "fail"}
        # b really drops them for rp_filter: its counter rose while the check pinged
        nstat = cli("exec", ident, "b", "--", "nstat -az TcpExtIPReversePathFilter", check=True).stdout
        assert int(nstat.split("TcpExtIPReversePathFilter")[1].split()[0]) >= 2, nstat

        cli("exec", ident, "b", "--", FIX, check=True)
        fixed = cli("check", ident)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "2/2 checks pass" in fixed.stdout
        assert "reversepath" not in fixed.stdout  # no hints once passed
    finally:
        down = cli("down", ident)
    assert down.returncode == 0, down.stderr


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client missing")
def test_a_class_of_three_from_a_roster(cli: Cli, image: object, tmp_path: Path) -> None:
    roster = tmp_path / "students.txt"
    roster.write_text("# morning group\nann\n\nbea   # joined late\ncid\n")
    out = tmp_path / "handouts"
    students = ["ann", "bea", "cid"]
    up = cli("class", "up", str(LAB), "--roster", str(roster), "--out", str(out), "--accel", "auto", timeout=900)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        again = cli("class", "up", str(LAB), "--roster", str(roster), "--out", str(out))
        assert again.returncode == 5 and "already has a class" in again.stderr

        for i, s in enumerate(students):
            d = out / s
            assert oct((d / "id_ed25519").stat().st_mode & 0o777) == "0o600"
            assert "ssh -F ssh_config a" in (d / "README.md").read_text()
            # plain OpenSSH, nothing from labctl: the handout is enough
            for guest in ("a", "b"):
                res = subprocess.run(["ssh", "-F", str(d / "ssh_config"), guest, "--", "hostname; uname -r"],
                                     capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
                assert res.returncode == 0, f"{s} {guest}: {res.stderr}"
                host, release = res.stdout.split()
                assert host == guest and release.startswith("6.")
            # a mark on each student's b, to tell the networks apart
            cli("exec", f"{NAME}@{s}", "b", "--", f"ip addr add 10.80.0.{20 + i}/24 dev eth1", check=True)

        for i, s in enumerate(students):
            for j, _ in enumerate(students):
                ping = subprocess.run(["ssh", "-F", str(out / s / "ssh_config"), "a", "--",
                                       f"ping -c 1 -W 2 10.80.0.{20 + j}"], capture_output=True, text=True, check=False,
                                      timeout=60, stdin=subprocess.DEVNULL)
                assert (ping.returncode == 0) == (i == j), f"{s} -> b of {students[j]}: {ping.stdout}"

        status = json.loads(cli("class", "status", "--json", check=True).stdout)
        assert [(r["student"], r["state"], r["guests"]) for r in status["students"]] == \
            [(s, "up", {"a": "up", "b": "up"}) for s in students]

        cli("exec", f"{NAME}@bea", "b", "--", FIX, check=True)
        check = cli("class", "check", "--json")
        assert check.returncode == 6, check.stderr
        rows = json.loads(check.stdout)["students"]
        assert [(r["student"], r["passed"], r["total"]) for r in rows] == [("ann", 0, 2), ("bea", 2, 2),
                                                                            ("cid", 0, 2)]
        table = cli("class", "check")
        assert table.returncode == 6 and "1/3 students pass" in table.stdout
    finally:
        down = cli("class", "down", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert qemu_pids_under(cli.state_dir) == []
    assert cli("status", check=True).stdout.strip() == "no labs are up"
    assert not list((cli.state_dir / "classes").glob("*.json"))
    assert (out / "ann" / "ssh_config").is_file()  # handouts stay
    assert cli("class", "status").returncode == 5
