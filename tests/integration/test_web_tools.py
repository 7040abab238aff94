"""labctl serve, the pieces after the first: the class's progress chart on the trainer's page, and
the engineer's tools on their own lab's page (console, captures, impairments, links), with real
guests in Debian's chromium (Playwright); the tools refused to a class's tokens (raw clients)."""

from __future__ import annotations

import os
import re
import select
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Cli

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is missing (setup.sh)")

CLASS_LAB = """\
name: {name}
networks:
  lan: {{}}
guests:
  a:
    nics:
      - {{name: eth1, model: virtio-net-pci, network: lan, ip: 10.94.0.1/24}}
checks:
  - name: fixed
    guest: a
    command: test -f /root/fixed
    hint: "create /root/fixed on a"
    timeout: 10
  - name: noted
    guest: a
    command: test -f /root/noted
    hint: "create /root/noted on a"
    timeout: 10
"""

ENG_LAB = """\
name: web-eng
networks:
  lan: {}
guests:
  a:
    nics:
      - {name: eth1, model: virtio-net-pci, network: lan, ip: 10.95.0.1/24}
"""


def serve_lines(proc: subprocess.Popen[str], timeout: float) -> Iterator[str]:
    """serve's output lines as they come, until ``timeout``. Read from the pipe's descriptor: a
    ``readline`` on the text stream would buffer lines that arrived together, out of ``select``'s sight."""
    assert proc.stdout is not None
    fd, pending = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 1.0)[0]:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")


def parse_serve_line(line: str, urls: dict[str, str]) -> None:
    """Note what a line of serve's output names: 'base', 'owner', 'trainer', 'fingerprint', a student's URL."""
    if m := re.match(r"serving on (\S+)", line):
        urls["base"] = m.group(1)
    if m := re.search(r"your labs: (\S+)", line):
        urls["owner"] = m.group(1)
    if m := re.search(r"trainer (http\S+)", line):
        urls["trainer"] = m.group(1)
    if m := re.search(r"fingerprint (\S+)", line):
        urls["fingerprint"] = m.group(1)
    if m := re.match(r"\s+(\w+): (http\S+)", line):
        urls[m.group(1)] = m.group(2)


def read_serve(proc: subprocess.Popen[str], want: set[str], timeout: float = 60) -> dict[str, str]:
    """What serve prints: 'base', 'owner', 'trainer', 'fingerprint' and each student's URL."""
    urls: dict[str, str] = {}
    for line in serve_lines(proc, timeout):
        parse_serve_line(line, urls)
        if want <= set(urls):
            break
    assert want <= set(urls), urls
    return urls


def token(url: str) -> str:
    return url.split("?t=", 1)[1]


def browser_page(pw: object, url: str, csp_errors: list[str]) -> object:
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])  # type: ignore[attr-defined]
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    page.on("console", lambda msg: csp_errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.goto(url)
    return page


def test_the_class_progress_chart(cli: Cli, image: object, tmp_path: Path) -> None:
    name = "web-prog"
    lab = tmp_path / f"{name}.yaml"
    lab.write_text(CLASS_LAB.format(name=name))
    roster = tmp_path / "roster.txt"
    roster.write_text("ann\nbea\n")
    up = cli("class", "up", str(lab), "--roster", str(roster), "--out", str(tmp_path / "handouts"),
             "--accel", "auto", "--cold", timeout=900)
    class_up = up.returncode == 0
    csp: list[str] = []
    try:
        assert class_up, up.stdout + up.stderr
        with cli.running("serve", "--listen", "127.0.0.1:0") as serve:
            urls = read_serve(serve, {"base", "trainer", "ann", "bea"})
            base = urls["base"]
            raw = {s: httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {token(urls[s])}"})
                   for s in ("ann", "bea")}
            with playwright_sync.sync_playwright() as pw:
                page = browser_page(pw, urls["trainer"], csp)
                expect = playwright_sync.expect
                chart = page.locator("svg#progress-chart")
                expect(chart).to_have_attribute("data-samples", "0")
                expect(chart).to_contain_text("no checks run yet")

                # ann's checks run (nothing fixed yet): the first sample, every count 0
                assert raw["ann"].post(f"/api/lab/{name}@ann/checks").json()["passed"] == 0
                expect(chart).to_have_attribute("data-samples", "1", timeout=10_000)
                expect(page.locator("ul.legend li[data-series=fixed]")).to_have_text("fixed: 0/2")

                # ann fixes one: 1/2 pass "fixed", nobody passes all; drawn without a reload
                cli("exec", f"{name}@ann", "a", "--", "touch /root/fixed", check=True)
                assert raw["ann"].post(f"/api/lab/{name}@ann/checks").json()["passed"] == 1
                expect(chart).to_have_attribute("data-samples", "2", timeout=10_000)
                expect(page.locator("ul.legend li[data-series=fixed]")).to_have_text("fixed: 1/2")
                expect(page.locator("ul.legend li[data-series=noted]")).to_have_text("noted: 0/2")
                expect(page.locator("ul.legend li[data-series='all checks']")).to_have_text("all checks: 0/2")

                # bea fixes both: all checks 1/2, fixed 2/2; a check run that changes nothing adds no sample
                cli("exec", f"{name}@bea", "a", "--", "touch /root/fixed /root/noted", check=True)
                assert raw["bea"].post(f"/api/lab/{name}@bea/checks").json()["passed"] == 2
                expect(page.locator("ul.legend li[data-series='all checks']")).to_have_text("all checks: 1/2",
                                                                                          timeout=10_000)
                expect(page.locator("ul.legend li[data-series=fixed]")).to_have_text("fixed: 2/2")
                raw["bea"].post(f"/api/lab/{name}@bea/checks")
                time.sleep(2.5)
                expect(chart).to_have_attribute("data-samples", "3")
                # the lines: one per check and one for all, each a step up where the count rose
                for series in ("all checks", "fixed", "noted"):
                    expect(chart.locator(f"path[data-series='{series}']")).to_have_count(1)
                ys = [float(v) for v in re.findall(r"V([\d.]+)", chart.locator("path[data-series=fixed]")
                                                   .get_attribute("d") or "")]
                assert len(ys) == 2 and ys[0] > ys[1], ys  # 0 -> 1 -> 2 students: the line goes up twice
                page.screenshot(path=str(tmp_path / "progress.png"))
                page.context.browser.close()
            for c in raw.values():
                c.close()
        hist = cli.state_dir / "web" / f"progress-{name}.json"
        assert hist.stat().st_mode & 0o077 == 0 and hist.stat().st_size < 4096

        # a new server keeps the history: the chart comes back as it was
        with cli.running("serve", "--listen", "127.0.0.1:0") as serve:
            urls = read_serve(serve, {"base", "trainer"})
            with playwright_sync.sync_playwright() as pw:
                page = browser_page(pw, urls["trainer"], csp)
                expect = playwright_sync.expect
                expect(page.locator("svg#progress-chart")).to_have_attribute("data-samples", "3")
                expect(page.locator("ul.legend li[data-series='all checks']")).to_have_text("all checks: 1/2")
                page.context.browser.close()
        assert csp == []
        down = cli("class", "down", timeout=300)
        class_up = down.returncode != 0
        assert not class_up, down.stdout + down.stderr
    finally:
        if class_up:
            cli("class", "down", timeout=300)


def pcapng_frames(data: bytes) -> list[bytes]:
    """The frames of a pcapng file (read here, not with labctl's reader): every Enhanced Packet
    Block's packet data."""
    assert data[:4] == b"\x0a\x0d\x0d\x0a", data[:16]
    order = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
    frames, pos = [], 0
    while pos + 12 <= len(data):
        btype, blen = struct.unpack_from(order + "II", data, pos)
        assert blen >= 12 and pos + blen <= len(data), (pos, blen, len(data))
        if btype == 6:
            caplen = struct.unpack_from(order + "I", data, pos + 20)[0]
            frames.append(data[pos + 28:pos + 28 + caplen])
        pos += blen
    assert pos == len(data)
    return frames


TOOL_CALLS = [("get", "/console/a", None), ("post", "/captures", {"guest": "a", "nic": "eth1"}),
              ("post", "/captures/labctl-cap-1-1/stop", None), ("get", "/captures/labctl-cap-1-1.pcapng", None),
              ("post", "/impair", {"guest": "a", "nic": "eth1", "impair": {"delay": "20ms"}}),
              ("post", "/link", {"guest": "a", "nic": "eth1", "up": False})]


def test_the_engineers_lab_tools(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "web-eng.yaml"
    lab.write_text(ENG_LAB)
    klass = tmp_path / "web-engc.yaml"
    klass.write_text(CLASS_LAB.format(name="web-engc"))
    roster = tmp_path / "roster.txt"
    roster.write_text("ann\n")
    cli("up", str(lab), "--accel", "auto", "--cold", check=True, timeout=900)
    up = cli("class", "up", str(klass), "--roster", str(roster), "--out", str(tmp_path / "handouts"),
             "--accel", "auto", "--cold", timeout=900)
    class_up = up.returncode == 0
    csp: list[str] = []
    try:
        assert class_up, up.stdout + up.stderr
        with cli.running("serve", "--listen", "127.0.0.1:0") as serve:
            urls = read_serve(serve, {"base", "owner", "trainer", "ann"})
            base = urls["base"]

            # -- a class's tokens: 403 for every tool, on the student's own instance and on the lab
            for who in ("ann", "trainer"):
                with httpx.Client(base_url=base, timeout=60,
                                  headers={"Authorization": f"Bearer {token(urls[who])}"}) as raw:
                    assert raw.get("/api/lab/web-engc@ann").status_code == 200  # they do reach the instance
                    for ident in ("web-engc@ann", "web-eng"):
                        for method, path, body in TOOL_CALLS:
                            r = raw.request(method, f"/api/lab/{ident}{path}", json=body)
                            assert r.status_code == 403, (who, ident, path, r.status_code)
                    assert "tools" not in raw.get("/api/lab/web-engc@ann").json()

            with playwright_sync.sync_playwright() as pw:
                page = browser_page(pw, urls["owner"], csp)
                expect = playwright_sync.expect
                page.goto(f"{base}/lab/web-eng")
                expect(page.locator(".term-status")).to_contain_text("connected", timeout=60_000)

                # -- the console: its tail at once, then what the guest writes, controls escaped, as text
                console = page.locator("#console-text")
                expect(console).to_contain_text("LABCTL-READY", timeout=20_000)
                cli("exec", "web-eng", "a", "--",
                    r"printf 'WEBCON-%s \033[31mRED\033[0m <i>x</i>\n' $((6*7)) > /dev/ttyS0", check=True)
                expect(console).to_contain_text(r"WEBCON-42 \x1b[31mRED\x1b[0m <i>x</i>", timeout=10_000)
                expect(console.locator("i")).to_have_count(0)

                row = page.locator("tr[data-nic='a.eth1']")

                # -- an impairment set from the page is in force in the guest; a bad one is refused
                row.locator("input.impair-input").fill("delay=300ms loss=0%")
                row.locator("button.impair-set").click()
                expect(row.locator(".impair-now")).to_have_text("delay 300ms, loss 0%", timeout=30_000)
                tc = cli("exec", "web-eng", "a", "--", "tc qdisc show dev eth1", check=True).stdout
                assert "netem" in tc and "delay 300" in tc, tc
                row.locator("input.impair-input").fill("delay=fast")
                row.locator("button.impair-set").click()
                expect(page.locator("#tool-error")).to_contain_text("delay")
                row.locator("button.impair-clear").click()
                expect(row.locator(".impair-now")).to_have_text("none", timeout=30_000)
                tc = cli("exec", "web-eng", "a", "--", "tc qdisc show dev eth1", check=True).stdout
                assert "netem" not in tc, tc

                # -- the link down and up: the guest sees its carrier go and come back
                row.locator("button.link-toggle").click()
                expect(row.locator(".link-state")).to_have_text("down", timeout=30_000)
                carrier = cli("exec", "web-eng", "a", "--", "cat /sys/class/net/eth1/carrier", check=True).stdout
                assert carrier.strip() == "0", carrier
                row.locator("button.link-toggle").click()
                expect(row.locator(".link-state")).to_have_text("up", timeout=30_000)
                carrier = cli("exec", "web-eng", "a", "--", "cat /sys/class/net/eth1/carrier", check=True).stdout
                assert carrier.strip() == "1", carrier

                # -- a capture: started, traffic (ARP for a neighbour nobody answers), stopped, downloaded
                row.locator("button.capture-toggle").click()
                expect(row.locator("button.capture-toggle")).to_have_text("stop capture", timeout=30_000)
                cli("exec", "web-eng", "a", "--", "ping -c 3 -W 1 10.95.0.77 || true", timeout=60)
                row.locator("button.capture-toggle").click()
                expect(row.locator("button.capture-toggle")).to_have_text("start capture", timeout=30_000)
                saved = page.locator("#captures li")
                expect(saved).to_have_count(1)
                with page.expect_download() as dl:
                    saved.locator("a").click()
                download = dl.value
                assert re.fullmatch(r"web-eng-a\.eth1-\d{8}-\d{6}\.pcapng", download.suggested_filename), \
                    download.suggested_filename
                frames = pcapng_frames(Path(download.path()).read_bytes())
                arp = [f for f in frames if f[12:14] == b"\x08\x06" and f[38:42] == bytes([10, 95, 0, 77])]
                assert len(arp) >= 2, [f[:42].hex() for f in frames]
                page.context.browser.close()

            # -- the download to a raw client with the owner's token: an attachment, the same bytes
            with httpx.Client(base_url=base, timeout=60,
                              headers={"Authorization": f"Bearer {token(urls['owner'])}"}) as raw:
                cid = raw.get("/api/lab/web-eng").json()["tools"]["captures"][0]["id"]
                r = raw.get(f"/api/lab/web-eng/captures/{cid}.pcapng")
                assert r.status_code == 200 and r.headers["content-disposition"].startswith("attachment;")
                assert len(pcapng_frames(r.content)) == len(frames)
                assert raw.get("/api/lab/web-eng/captures/../../etc.pcapng").status_code in (403, 404)
                assert raw.post("/api/lab/web-eng/impair", json={"guest": "a", "nic": "eth9"}).status_code == 400
                assert raw.post("/api/lab/web-eng/link", json={"guest": "a", "nic": "eth1", "up": "no"}).status_code == 400
        assert csp == []
    finally:
        if class_up:
            cli("class", "down", timeout=300)
        cli("down", "web-eng", timeout=300)
