"""The network side of a lab, end to end, on one boot of three guests (qemu backend):

* a ping step with capture on a direct link and on a switched network: tshark
  reads the bundle's pcapng files and finds the echo requests and replies with
  the right addresses, stamped in real time (the two ends of a link agree);
* a step's 50 ms delay raises ping's round trip by at least that;
* with the lab kept up: a live capture piped into ``tcpdump -r -`` that ends
  cleanly when tcpdump leaves (EPIPE), another ended by Ctrl-C; ``labctl
  impair`` (delay, 100% loss, --clear); ``labctl link down``/``up`` seen by the
  guest (NO-CARRIER) and by its traffic; ``labctl graph`` of the running lab;
  ``status`` shows what is in force; nothing of it is left after ``down``.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.monitor import qmp_execute
from tests.conftest import Cli, interrupt
from tests.integration.conftest import qemu_pids_under, wait_for

LAB = "nettest"
A1, B1, A2, B2, C1 = "10.71.0.1", "10.71.0.2", "10.72.0.1", "10.72.0.2", "10.72.0.3"
LAB_FILE = f"""
name: {LAB}
networks:
  direct: {{capture: true}}         # two members: a direct unix-dgram link
  lan: {{}}                         # three members: labctl's switch
guests:
  a:
    nics:
      - {{name: eth1, model: e1000, network: direct, ip: {A1}/24}}
      - {{name: eth2, model: virtio-net-pci, network: lan, ip: {A2}/24}}
  b:
    nics:
      - {{name: eth1, model: virtio-net-pci, network: direct, ip: {B1}/24}}
      - {{name: eth2, model: e1000, network: lan, ip: {B2}/24}}
  c:
    nics:
      - {{name: eth1, model: rtl8139, network: lan, ip: {C1}/24}}
steps:
  - name: ping-direct
    run:
      - {{guest: a, command: "ping -c 3 -i 0.3 {{{{b.eth1.ip}}}}"}}
  - name: ping-switched
    run:
      - {{guest: a, command: "ping -c 3 -i 0.3 {{{{c.eth1.ip}}}}"}}
    trace:
      a: {{capture: [eth2]}}
      c: {{capture: true}}
  - name: delay
    matrix:
      - {{label: plain, delay: 0ms}}
      - {{label: delayed, delay: 50ms}}
    impair: {{a.eth1: {{delay: "{{{{delay}}}}"}}}}
    run:
      - {{guest: a, command: "ping -c 5 -i 0.3 {{{{b.eth1.ip}}}}"}}
"""


def tshark(path: Path, *fields: str, filt: str = "icmp") -> list[list[str]]:
    out = subprocess.run(["tshark", "-r", str(path), "-Y", filt, "-T", "fields", *(a for f in fields for a in ("-e", f))],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [line.split("\t") for line in out.splitlines()]


def echoes(path: Path) -> list[tuple[float, str, str, str, str]]:
    """(time, source, destination, ICMP type, interface name) of every ICMP frame."""
    return [(float(t), s, d, ty, i) for t, s, d, ty, i in
            tshark(path, "frame.time_epoch", "ip.src", "ip.dst", "icmp.type", "frame.interface_name")]


def rtt_stats(text: str) -> dict[str, float]:
    m = re.search(r"rtt min/avg/max/mdev = ([\d.]+)/([\d.]+)/([\d.]+)/", text)
    assert m, text
    return {"min": float(m[1]), "avg": float(m[2]), "max": float(m[3])}


def step(summary: dict[str, Any], name: str, variant: str | None = None) -> dict[str, Any]:
    return next(s for s in summary["steps"] if s["name"] == name and s["variant"] == variant)


def ping(cli: Cli, guest: str, ip: str, count: int = 2, wait: int = 2) -> subprocess.CompletedProcess[str]:
    return cli("exec", LAB, guest, "--", f"ping -c {count} -i 0.3 -W {wait} {ip}", timeout=120)


@pytest.fixture
def lab_file(tmp_path: Path) -> Path:
    path = tmp_path / f"{LAB}.yaml"
    path.write_text(LAB_FILE)
    return path


def test_capture_impair_link_and_graph(cli: Cli, image: object, lab_file: Path, tmp_path: Path) -> None:
    if shutil.which("tshark") is None or shutil.which("tcpdump") is None:
        pytest.fail("tshark and tcpdump are missing: run setup.sh")
    res = cli("run", str(lab_file), "--keep", "--accel", "tcg", "--out", str(tmp_path / "runs"), "--json",
              timeout=1200)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        bundle = Path(json.loads(res.stdout)["bundle"])
        summary = json.loads((bundle / "summary.json").read_text())
        _check_step_captures(bundle, summary)
        _check_step_delay(bundle, summary)
        _check_live_capture(cli, tmp_path)
        _check_impair(cli)
        _check_link(cli, tmp_path)
    finally:
        down = cli("down", LAB)
    assert down.returncode == 0, down.stderr
    assert qemu_pids_under(cli.state_dir) == []
    assert not (cli.state_dir / "labs" / LAB).exists()


def _check_step_captures(bundle: Path, summary: dict[str, Any]) -> None:
    started = {c["step"]: c["started_at"] for c in json.loads((bundle / "manifest.json").read_text())["commands"]}
    for name, pairs, src, dst in (("ping-direct", [("a", "eth1"), ("b", "eth1")], A1, B1),
                                  ("ping-switched", [("a", "eth2"), ("c", "eth1")], A2, C1)):
        s = step(summary, name)
        assert s["status"] == "ok", s
        # The step's own captures, and the direct network's (capture: true holds for every step).
        assert sorted((c["guest"], c["nic"]) for c in s["captures"]) == sorted({*pairs, ("a", "eth1"), ("b", "eth1")})
        seen = {}
        for guest, nic in pairs:
            frames = echoes(bundle / s["dir"] / guest / f"{nic}.pcapng")
            assert {f[4] for f in frames} == {f"{guest}.{nic}"}  # the interface carries the NIC's name
            requests = [f for f in frames if f[1:4] == (src, dst, "8")]
            replies = [f for f in frames if f[1:4] == (dst, src, "0")]
            assert len(requests) == 3 and len(replies) == 3, frames
            seen[guest] = requests
        # Real time: within a few seconds of when the step's command started, and both ends of the
        # link stamp the same frame alike (each QEMU's clock is calibrated on its own).
        t0 = datetime.datetime.fromisoformat(started[name]).timestamp()
        (one, other) = seen.values()
        assert all(t0 - 2 < f[0] < t0 + 60 for f in one + other), (t0, one)
        assert all(abs(x[0] - y[0]) < 0.05 for x, y in zip(one, other, strict=True)), (one, other)
        for cap in s["captures"]:  # the network's capture in the switched step sees little (no ping there)
            assert cap["calibrated"] and cap["missing"] == 0, cap
            assert cap["frames"] >= 6 or (cap["guest"], cap["nic"]) not in pairs, cap
    # The switched step captured only what it and the lab file asked for (b.eth2 is in neither).
    assert [p.name for p in (bundle / step(summary, "ping-switched")["dir"] / "b").glob("*.pcapng")] == ["eth1.pcapng"]
    html = (bundle / "report.html").read_text()
    assert '<figure class="topology">' in html and 'data-nic="eth1"' in html


def _check_step_delay(bundle: Path, summary: dict[str, Any]) -> None:
    rtts = {}
    for variant in ("plain", "delayed"):
        s = step(summary, "delay", variant)
        assert s["status"] == "ok", s
        assert s["network"]["impair"]["a.eth1"] == {"delay": "50ms" if variant == "delayed" else "0ms"}
        rtts[variant] = rtt_stats((bundle / s["dir"] / "a" / "cmd-0.out").read_text())
    # Every delayed echo took at least the 50 ms, and no echo without it came near. (A difference of
    # averages, or of minimums, carries the busy host's noise: the TCG path's floor moved from 2 to
    # 5 ms between two variants of one run here.)
    assert rtts["delayed"]["min"] >= 50 and rtts["plain"]["max"] < 50, rtts


def _capture_records(cli: Cli) -> list[Path]:
    return list((cli.state_dir / "labs" / LAB / "captures").glob("*.json"))


def _filters(cli: Cli, guest: str) -> list[str]:
    objects = qmp_execute(cli.state_dir / "labs" / LAB / "guests" / guest / "qmp.sock", "qom-list",
                          {"path": "/objects"})
    return [o["name"] for o in objects if o["name"].startswith("labctl-cap")]


def _check_live_capture(cli: Cli, tmp_path: Path) -> None:
    # tcpdump reads the stream and leaves after four ICMP frames: labctl sees EPIPE and stops cleanly.
    # (The filter matters: ARP frames before the first echo would otherwise count among the four.)
    cap = cli.popen("capture", LAB, "a", "eth1", "-w", "-")
    dump = subprocess.Popen(["tcpdump", "-n", "-c", "4", "-r", "-", "icmp"], stdin=cap.stdout, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert cap.stdout is not None
    cap.stdout.close()  # tcpdump holds the pipe's reading end
    try:
        wait_for(lambda: _capture_records(cli), 60, "the live capture to start")
        assert ping(cli, "b", A1, count=4).returncode == 0
        out, _ = dump.communicate(timeout=120)
        _, err = cap.communicate(timeout=120)
    finally:
        for p in (cap, dump):
            if p.poll() is None:
                p.kill()
    assert dump.returncode == 0
    assert len(re.findall(rf"IP {B1} > {A1}: ICMP echo request", out)) >= 2, out
    assert cap.returncode == 0 and "Traceback" not in err, err
    assert "the reader went away" in err
    assert _capture_records(cli) == [] and _filters(cli, "a") == []

    # Ctrl-C ends a capture to a file, which tshark then reads (cli.popen starts labctl with SIGINT
    # at its default, even in a pytest started in the background by a shell without job control).
    target = tmp_path / "b-eth1.pcapng"
    proc = cli.popen("capture", LAB, "b", "eth1", "-w", str(target))
    wait_for(lambda: _capture_records(cli), 60, "the second capture to start")
    assert ping(cli, "a", B1, count=2).returncode == 0
    _, err = interrupt(proc, 60)
    assert proc.returncode == 0 and "interrupted" in err and "Traceback" not in err, err
    frames = echoes(target)
    assert [(s, d, t) for _, s, d, t, _ in frames] == [(A1, B1, "8"), (B1, A1, "0")] * 2
    assert {i for *_, i in frames} == {"b.eth1"}
    assert _capture_records(cli) == [] and _filters(cli, "b") == []


def _status_nic(cli: Cli, guest: str, nic: str) -> dict[str, Any]:
    (lab,) = json.loads(cli("status", LAB, "--json", check=True).stdout)["labs"]
    g = next(g for g in lab["guests"] if g["name"] == guest)
    return next(n for n in g["nics"] if n["name"] == nic)


def _check_impair(cli: Cli) -> None:
    base = rtt_stats(ping(cli, "a", B1, count=3).stdout)
    assert cli("impair", LAB, "a", "eth1", "--delay", "50ms", check=True).stdout.strip() == "a.eth1: delay 50ms"
    delayed = rtt_stats(ping(cli, "a", B1, count=3).stdout)
    # netem delays every reply by 50 ms: the delayed fastest is over 50 ms, the base fastest under it (its
    # slowest may not be, on a loaded TCG host)
    assert delayed["min"] >= 50 and base["min"] < 50, (base, delayed)
    assert _status_nic(cli, "a", "eth1")["impair"] == {"delay": "50ms"}
    assert "delay 50ms" in cli("status", LAB, check=True).stdout

    cli("impair", LAB, "a", "eth1", "--loss", "100%", check=True)
    lost = ping(cli, "a", B1, count=3, wait=1)
    assert lost.returncode != 0 and "100% packet loss" in lost.stdout
    assert _status_nic(cli, "a", "eth1")["impair"] == {"loss": "100%"}  # replaced, not added to

    cli("impair", LAB, "a", "eth1", "--clear", check=True)
    assert ping(cli, "a", B1, count=3).returncode == 0
    assert _status_nic(cli, "a", "eth1")["impair"] == {}
    assert "qdisc netem" not in cli("exec", LAB, "a", "--", "tc qdisc show dev eth1", check=True).stdout
    bad = cli("impair", LAB, "a", "eth1", "--loss", "2")
    assert bad.returncode == 2 and "--loss: expected a percentage" in bad.stderr and "Traceback" not in bad.stderr
    unknown = cli("impair", LAB, "a", "eth7", "--delay", "1ms")
    assert unknown.returncode == 2 and "no lab NIC 'eth7'" in unknown.stderr


def _carrier(cli: Cli, guest: str, nic: str) -> str:
    return cli("exec", LAB, guest, "--", f"ip link show {nic}", check=True).stdout


def _check_link(cli: Cli, tmp_path: Path) -> None:
    assert cli("link", LAB, "a", "eth1", "down", check=True).stdout.strip() == "a.eth1: link down"
    wait_for(lambda: "NO-CARRIER" in _carrier(cli, "a", "eth1"), 30, "a.eth1 to lose its carrier", 0.5)
    assert ping(cli, "b", A1, count=2, wait=1).returncode != 0  # nothing passes a's end, either way
    assert _status_nic(cli, "a", "eth1")["link"] == "down"
    assert ping(cli, "a", C1, count=1).returncode == 0  # a's other NIC is untouched

    svg = tmp_path / "nettest.svg"
    cli("graph", LAB, "-o", str(svg), check=True)
    from tests.integration.test_report_html import chromium

    dom = chromium(tmp_path, "--dump-dom", svg.as_uri()).stdout
    assert 'class="link down"' in dom and 'data-guest="a" data-nic="eth1"' in dom
    for guest in ("a", "b", "c"):
        assert f'data-guest="{guest}"' in dom
    png = tmp_path / "graph.png"
    chromium(tmp_path, f"--screenshot={png}", "--window-size=1000,700", svg.as_uri())
    assert png.stat().st_size > 5000

    cli("link", LAB, "a", "eth1", "up", check=True)
    wait_for(lambda: "NO-CARRIER" not in _carrier(cli, "a", "eth1"), 30, "a.eth1 to get its carrier back", 0.5)
    wait_for(lambda: ping(cli, "a", B1, count=1).returncode == 0, 30, "traffic over a.eth1 again", 0.5)
    assert _status_nic(cli, "a", "eth1")["link"] == "up"
