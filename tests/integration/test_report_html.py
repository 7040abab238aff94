"""report.html as a person sees it: headless Chromium renders it to a PNG and dumps its DOM.

Needs no guest: it renders the fixture bundles under tests/fixtures/report/.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from labctl.report import render_run
from labctl.report.charts import fmt_num
from labctl.report.throughput import FIGURES
from tests.conftest import ROOT

CHROMIUM = Path("/usr/bin/chromium")
FIXTURES = ROOT / "tests" / "fixtures" / "report"
WIDTH, HEIGHT = 1280, 2000

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="/usr/bin/chromium is not installed (apt-get install chromium)")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with everything that could reach the network turned off."""
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def rendered(tmp_path: Path, name: str) -> tuple[Path, Path]:
    run = tmp_path / name
    shutil.copytree(FIXTURES / name, run)
    _, html = render_run(run)
    return run, html


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the decompressed (still filtered) image data of a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return size[0], size[1], zlib.decompress(idat)


@pytest.mark.parametrize("name", ["nic-driver-cost-ok", "nic-driver-cost-failed"])
def test_screenshot_is_a_real_page(tmp_path: Path, name: str) -> None:
    _, html = rendered(tmp_path, name)
    png = tmp_path / f"{name}.png"
    chromium(tmp_path, f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}", html.as_uri())
    assert png.is_file() and png.stat().st_size > 10_000, "screenshot missing or trivially small"
    width, height, pixels = png_pixels(png)
    assert (width, height) == (WIDTH, HEIGHT)
    # A blank page of one colour compresses to a handful of distinct byte values.
    assert len(set(pixels)) > 64, "the screenshot looks like a single colour"


@pytest.mark.parametrize("name", ["nic-driver-cost-ok", "nic-driver-cost-failed"])
def test_dom_holds_the_summary_numbers(tmp_path: Path, name: str) -> None:
    run, html = rendered(tmp_path, name)
    dom = chromium(tmp_path, "--dump-dom", html.as_uri()).stdout
    summary = json.loads((run / "summary.json").read_text())
    results = dom[dom.index('<table class="results">'):]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", results[:results.index("</table>")], re.DOTALL)[1:]
    assert len(rows) == len(summary["steps"])
    for row, step in zip(rows, summary["steps"], strict=True):
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)]
        assert cells[0] == step["name"]
        assert cells[4:8] == [fmt_num(step["figures"][key]) for key, *_ in FIGURES]
    assert dom.count('<figure class="topology">') == 1  # the lab's topology picture heads the page
    assert dom.count("<svg") == 4 + 1  # the four charts and the topology picture
    assert "<script" not in dom
    if summary["status"] == "failed":
        assert "Run FAILED" in dom and summary["reason"] in dom
    else:
        assert summary["comparison"] in dom
