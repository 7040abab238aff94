"""Issue 15 on real runs: the whole cost of each NIC model (host and guest), flame graphs in Chromium,
the skb timeline as a Perfetto trace, and ``labctl compare`` on two real bundles.

The bundles are shared (tests/integration/conftest.py): labs/nic-driver-cost.yaml
with 3 s transfers, labs/skb-latency.yaml with 2 s streams, and here a second
nic-driver-cost run with ``repeat: 2`` for the comparison. Every figure is
recomputed from the raw files the run left, not read back from summary.json.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from labctl.report.cost import fmt_cost
from labctl.trace.tef import validate_trace
from tests.integration.conftest import run_bundle, short_lab
from tests.integration.test_report_html import CHROMIUM, chromium, png_pixels

OVER_3_MIN = ("two real runs of nic-driver-cost (three NIC models, perf, the whole cost) and skb-latency are "
              "what the figures are recomputed from; the bundles are shared with test_run_labs.py")

#: The seed labs' bundles (session fixtures) are shared with the other file of this group: one worker.
pytestmark = pytest.mark.xdist_group("seed-bundles")

DRIVER_FUNCTIONS = {"rtl8139": "cp_rx_poll", "e1000": "e1000_clean_rx_irq", "virtio-net-pci": "virtnet_poll"}
DRIVER_PREFIX = {"rtl8139": "cp_", "e1000": "e1000_", "virtio-net-pci": "virtnet_"}
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium is not installed (setup.sh installs it)")


def _summary(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "summary.json").read_text())


def _ticks(line: str) -> int:
    fields = line[line.rfind(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def _busy(stat: str) -> int:
    cpu = next(ln.split()[1:] for ln in stat.splitlines() if ln.startswith("cpu "))
    return sum(int(v) for i, v in enumerate(cpu[:8]) if i not in (3, 4))  # all but idle and iowait


# --------------------------------------------------------------------------- the whole cost


def test_the_whole_cost_of_each_nic_model(nic_cost_run: tuple[Path, Path]) -> None:
    _, bundle = nic_cost_run
    summary = _summary(bundle)
    assert summary["accel"] == "tcg"
    for step in summary["steps"]:
        cost, variant = step["cost"], step["variant"]
        assert cost["host_measured"], (variant, cost)
        # bytes moved: what iperf3 itself reported on the receiving client
        iperf = json.loads((bundle / step["dir"] / "client" / "cmd-1.out").read_text())
        assert cost["bytes"] == iperf["end"]["sum_received"]["bytes"] > 0
        gb = cost["bytes"] / 1e9
        # a 6.1 guest and host: perf records the build ids in its mmap events (no pass over the samples at its end)
        header = (bundle / step["dir"] / "client" / "perf-report-header.txt").read_text()
        assert "# cmdline : /usr/bin/perf record --buildid-mmap " in header, header
        host_total = guest_total = 0.0
        for guest in ("client", "server"):
            g = cost["guests"][guest]
            raw = json.loads((bundle / step["dir"] / "_host" / guest / "qemu-threads.json").read_text())
            tck = raw["clock_ticks_per_s"]
            # the QEMU process's CPU over the window, from the raw /proc lines
            host = (_ticks(raw["end"]["process"]) - _ticks(raw["start"]["process"])) / tck
            assert g["host_cpu_s"] == pytest.approx(host, abs=0.001) and host > 0.5, (variant, guest, g)
            # QMP named the vCPU thread; it did most of the work, the main loop some
            (vcpu_tid,) = raw["vcpu_threads"]
            assert raw["end"]["threads"][vcpu_tid].split("(", 1)[1].startswith("CPU 0/TCG)")
            vcpu = (_ticks(raw["end"]["threads"][vcpu_tid]) - _ticks(raw["start"]["threads"][vcpu_tid])) / tck
            assert g["host_vcpu_s"] == pytest.approx(vcpu, abs=0.001) and g["host_main_s"] > 0
            # each thread's time is rounded to ticks on its own: the roles add up to the process within a tick each
            ticks = 1 / tck * (len(raw["end"]["threads"]) + 1)
            assert vcpu + g["host_main_s"] + g["host_other_s"] == pytest.approx(host, abs=ticks)
            # the guest's busy time over the same window, from its own /proc/stat
            d = bundle / step["dir"] / guest
            busy = (_busy((d / "window-stat-end.txt").read_text()) - _busy((d / "window-stat-start.txt").read_text()))
            assert g["guest_cpu_s"] == pytest.approx(busy / 100, abs=0.001) and busy > 0
            assert g["host_cpu_s_per_gb"] == pytest.approx(host / gb, rel=1e-3)
            host_total += host
            guest_total += busy / 100
            # the host profile of that QEMU: TCG-translated guest code, on the vCPU thread
            profile = g["host"]["profile"]
            assert profile["samples"] > 100 and profile["kinds"]["guest code (TCG)"] > 5
            # translated guest code runs on the vCPU thread only (the main loop's share varies with the
            # NIC: for a fast one its socket I/O can outweigh the vCPU)
            roles = profile["by_role"]
            assert roles["vCPU"].get("guest code (TCG)", 0) > 5, roles
            assert all(r.get("guest code (TCG)", 0) == 0 for role, r in roles.items() if role != "vCPU"), roles
        assert cost["host_cpu_s_per_gb"] == pytest.approx(host_total / gb, rel=1e-3)
        assert cost["guest_cpu_s_per_gb"] == pytest.approx(guest_total / gb, rel=1e-3)
        assert step["figures"]["host_cpu_s_per_gb"] == cost["host_cpu_s_per_gb"]
    # the headline: the whole cost, and where the device model runs under TCG
    ranked = sorted(summary["steps"], key=lambda s: s["cost"]["host_cpu_s_per_gb"])
    sentence = summary["comparison"]
    assert sentence.startswith("Counting every QEMU's host CPU time")
    best, worst = (s["cost"]["host_cpu_s_per_gb"] for s in (ranked[0], ranked[-1]))
    for step, value in ((ranked[0], best), (ranked[-1], worst)):
        assert f"{step['variant']} {fmt_cost(value)}" in sentence or f"{step['variant']} cost {fmt_cost(value)}" \
            in sentence, (step["variant"], sentence)
    if worst / best < 1.1:  # the run cannot tell them apart, and says so
        assert "cost about the same host CPU per GB" in sentence
    else:  # one run each: the ranking is given, with no claim about the noise
        assert "times as much) (one run each" in sentence
    assert "Under TCG the emulated NICs' device models run inside QEMU" in sentence
    assert "times less CPU in its driver" not in sentence
    md = (bundle / "report.md").read_text()
    assert "## Whole cost: host and guest" in md and sentence in md.replace("**", "")
    assert "Under TCG, QEMU translates the guest's code" in md


# --------------------------------------------------------------------------- flame graphs

SEARCH = """<script>
window.prompt = function () { return "%s"; };
window.addEventListener("load", function () {
  var out = [];
  document.querySelectorAll("svg.lfg").forEach(function (svg) {
    svg.querySelector(".lfg-search").dispatchEvent(new MouseEvent("click", {bubbles: true}));
    var hit = [];
    svg.querySelectorAll("g.lfg-f rect").forEach(function (r) {
      if (r.getAttribute("fill") === "#fff200") { hit.push(r.parentNode.getAttribute("data-f")); }
    });
    out.push({title: svg.getAttribute("aria-label"), matched: svg.querySelector(".lfg-matched").textContent,
              hits: hit});
  });
  var pre = document.createElement("pre");
  pre.id = "labctl-test-result";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _searched(tmp_path: Path, html: Path, term: str) -> list[dict[str, Any]]:
    """Search every flame graph of ``html`` for ``term`` in Chromium, as a person would (the Search button)."""
    page = html.read_text()
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)  # the test's own script
    harness = html.with_name(f"search-{term}.html")
    harness.write_text(page.replace("</body>", SEARCH % term + "</body>"))
    dom = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", harness.as_uri()).stdout
    m = re.search(r'<pre id="labctl-test-result">(.*?)</pre>', dom, re.DOTALL)
    assert m is not None, dom[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))


def test_flame_graphs_per_variant_and_between_variants(nic_cost_run: tuple[Path, Path]) -> None:
    _, bundle = nic_cost_run
    steps = _summary(bundle)["steps"]
    for step in steps:
        fg = step["guests"]["client"]["flamegraph"]
        assert fg["event"].startswith("cpu-clock") and fg["samples"] > 1000
        svg = bundle / step["dir"] / "client" / "flamegraph.svg"
        frames = {g.get("data-f") for g in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}g")}
        assert DRIVER_FUNCTIONS[step["variant"]] in frames, step["variant"]
        # the driver's module has its own colour in the legend
        module = {"rtl8139": "8139cp", "e1000": "e1000", "virtio-net-pci": "virtio_net"}[step["variant"]]
        assert f"module {module}" in svg.read_text()
        # the folded stacks are the recording's samples: one sample per stack line count
        folded = (bundle / step["dir"] / "client" / "flamegraph.folded").read_text().splitlines()
        assert sum(int(ln.rsplit(" ", 1)[1]) for ln in folded) == fg["samples"]
    first = steps[0]["variant"]
    html = (bundle / "report.html").read_text()
    md = (bundle / "report.md").read_text()
    for step in steps[1:]:
        rel = f"steps/transfer/flamegraph-diff-client-{first}-vs-{step['variant']}.svg"
        text = (bundle / rel).read_text()
        ET.fromstring(text)
        assert "Differential flame graph" in text and "share grew" in text
        # inline in report.html, linked from report.md
        assert f'aria-label="Differential flame graph: {step["variant"]} against {first}"' in html
        assert rel in md


@needs_chromium
def test_flame_graphs_render_in_chromium_and_find_the_drivers_functions(nic_cost_run: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    _, bundle = nic_cost_run
    html = tmp_path / "report.html"
    shutil.copy(bundle / "report.html", html)
    png = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={png}", "--window-size=1280,9000", (bundle / "report.html").as_uri())
    width, height, pixels = png_pixels(png)
    assert (width, height) == (1280, 9000) and len(set(pixels)) > 64
    steps = _summary(bundle)["steps"]
    for step in steps:
        variant = step["variant"]
        graphs = _searched(tmp_path, bundle / "report.html", DRIVER_PREFIX[variant])
        mine = next(g for g in graphs if g["title"] == f"Flame graph: transfer / {variant}")
        # the driver's functions are found by name, and only frames whose name matches are lit
        assert DRIVER_FUNCTIONS[variant] in mine["hits"], (variant, mine)
        assert all(DRIVER_PREFIX[variant] in h for h in mine["hits"])
        m = re.fullmatch(r"matched (\d+) of (\d+) samples \(([\d.]+)%\)", mine["matched"])
        assert m is not None and int(m[1]) > 0 and int(m[2]) == step["guests"]["client"]["flamegraph"]["samples"]
    nothing = _searched(tmp_path, bundle / "report.html", "no_such_function_here")
    assert all(g["hits"] == [] and g["matched"].startswith("matched 0 of") for g in nothing)
    # the report works as shipped: the page's CSP allows its one script and nothing else
    page = (bundle / "report.html").read_text()
    assert page.count("<script>") == 1 and "script-src 'sha256-" in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page


# --------------------------------------------------------------------------- Perfetto


def test_the_skb_timeline_as_a_perfetto_trace(skb_latency_run: tuple[Path, Path]) -> None:
    _, bundle = skb_latency_run
    for step in _summary(bundle)["steps"]:
        for guest in ("client", "server"):
            d = bundle / step["dir"] / guest
            doc = json.loads(gzip.decompress((d / "trace.json.gz").read_bytes()))
            assert validate_trace(doc) == [], (step["variant"], guest)
            events = doc["traceEvents"]
            names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
            assert names == {"CPU 0"}  # one track per CPU (the guests have one)
            slices = [e for e in events if e["ph"] == "X"]
            cats = {e["cat"] for e in slices}
            assert {"irq", "softirq", "napi", "skb.rx", "skb.tx"} <= cats, cats
            assert any(e["cat"] == "softirq" and e["name"] == "NET_RX" for e in slices)
            nic = step["nic"]["name"]
            assert any(e["cat"] == "napi" and e["name"] == f"napi poll {nic}" for e in slices)
            # one flow per packet followed end to end (every NIC but mgmt0), as the CSV files say
            rows = [r for direction in ("rx", "tx")
                    for r in csv.DictReader((d / f"skb-latency-{direction}.csv").open())]
            followed = sum(r["followed"] == "yes" and r["nic"] != "mgmt0" for r in rows)
            flows: dict[Any, list[dict[str, Any]]] = {}
            for e in events:
                if e["ph"] in "stf" and e.get("cat") == "skb.flow":
                    flows.setdefault(e["id"], []).append(e)
            assert len(flows) == followed > 0, (step["variant"], guest)
            starts = {(e["tid"], e["ts"]) for e in slices}
            for fid, evs in flows.items():
                evs.sort(key=lambda e: e["ts"])
                assert [e["ph"] for e in evs] == ["s", *["t"] * (len(evs) - 2), "f"] and evs[-1]["bp"] == "e"
                assert len(evs) == 5  # driver, netif, IP, TCP, app (or app, TCP, IP, dev, driver)
                assert all((e["tid"], e["ts"]) in starts for e in evs), fid  # each bound to its slice's start
            summary_trace = step["guests"][guest]["trace_json"]
            assert summary_trace["flows"] == followed and summary_trace["file"] == "trace.json.gz"
    md = (bundle / "report.md").read_text()
    assert "trace.json.gz" in md and "ui.perfetto.dev" in md


# --------------------------------------------------------------------------- compare


@pytest.fixture(scope="session")
def nic_cost_repeated(session_cli: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nic-driver-cost again, virtio-net-pci only, twice (2 s transfers)."""
    d = tmp_path_factory.mktemp("ndc2")
    lab = short_lab("nic-driver-cost.yaml", d, 2, lambda text: text.replace(
        "      - {label: e1000, nic: eth2, server: 10.12.0.2}\n", "").replace(
        "      - {label: rtl8139, nic: eth1, server: 10.11.0.2}\n", "").replace(
        "    nic: client.{{nic}}\n", "    nic: client.{{nic}}\n    repeat: 2\n"))
    return run_bundle(session_cli, lab, d / "runs")


def _drops_compared(m: dict[str, Any], steps_a: list[dict[str, Any]], steps_b: list[dict[str, Any]]) -> list[str]:
    """Compare's drop figures are each run's own drop rows (per guest, function and reason; one that a run
    lacks counts 0 there), the mean of its repeats; the functions of those that changed (a TCP stream's drops:
    GRO's merged skbs freed, hundreds a run, never the same count twice)."""
    functions: dict[str, str] = {}

    def counts(steps: list[dict[str, Any]]) -> dict[str, float]:
        per: dict[str, float] = {}
        for step in steps:
            assert step["drops"]["guests"].keys() == {"client", "server"}, step["drops"]
            for r in step["drops"]["rows"]:
                key = f"drops.{r['guest']}.{r['function']}.{r['reason'] or 'none'}"
                per[key] = per.get(key, 0.0) + r["count"] / len(steps)
                functions[key] = r["function"]
        return per

    ca, cb = counts(steps_a), counts(steps_b)
    assert ca and cb, "a TCP stream of two seconds drops something (its GRO lists at least)"
    shown = {k for k in m if k.startswith("drops.") and not k.endswith(".total")}
    assert shown == ca.keys() | cb.keys(), (shown, ca, cb)
    for key in shown:
        assert m[key]["a"]["mean"] == pytest.approx(ca.get(key, 0.0)) and m[key]["b"]["mean"] == pytest.approx(cb.get(key, 0.0))
        assert m[key]["change"] == pytest.approx(cb.get(key, 0.0) - ca.get(key, 0.0))
    changed = [functions[k] for k in shown if m[k]["change"]]
    assert changed, (ca, cb)
    return changed


def test_compare_two_real_runs(nic_cost_run: tuple[Path, Path], nic_cost_repeated: Path,
                               skb_latency_run: tuple[Path, Path], session_cli: Any, tmp_path: Path) -> None:
    _, a = nic_cost_run
    b = nic_cost_repeated
    html = tmp_path / "compare.html"
    res = session_cli("compare", str(a), str(b), "--json", "--html", str(html), timeout=300)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["lab"] == "nic-driver-cost"
    assert [(p["variant"], p["runs"]) for p in result["pairs"]] == [("virtio-net-pci", {"a": 1, "b": 2})]
    assert result["only_in_a"] == [{"step": "transfer", "variant": "rtl8139"}, {"step": "transfer", "variant": "e1000"}]
    assert result["only_in_b"] == []
    assert {d["what"] for d in result["differences"]} == {"lab file sha256"}  # same kernel, QEMU, host
    sb = {(s["variant"], s["repeat"]): s for s in _summary(b)["steps"]}
    sa = {s["variant"]: s for s in _summary(a)["steps"]}
    for pair in result["pairs"]:
        m = {x["key"]: x for x in pair["metrics"]}
        for key in ("throughput_mbit_s", "cpu_load_pct", "driver_share_pct", "host_cpu_s_per_gb",
                    "guest_cpu_s_per_gb", "cost.client.host_cpu_s_per_gb", "softnet.client.dropped"):
            assert key in m, key
        tput = m["throughput_mbit_s"]
        runs = [sb[(pair["variant"], r)]["figures"]["throughput_mbit_s"] for r in (1, 2)]
        assert tput["b"]["n"] == 2 and tput["b"]["min"] == min(runs) and tput["b"]["max"] == max(runs)
        assert tput["a"]["mean"] == sa[pair["variant"]]["figures"]["throughput_mbit_s"]
        assert tput["change"] == pytest.approx(tput["b"]["mean"] - tput["a"]["mean"], abs=1e-3)
        width = max(runs) - min(runs)
        outside = not (min(runs) - width <= tput["a"]["mean"] <= max(runs) + width)
        assert tput["verdict"] == ("beyond noise" if outside else "within noise")
        assert any(k.startswith("snmp.client.") for k in m)  # SNMP deltas, paired
        changed_drops = _drops_compared(m, [sa[pair["variant"]]], [sb[(pair["variant"], r)] for r in (1, 2)])
    # the terminal output names every pair, and the HTML page renders
    text = session_cli("compare", str(a), str(b), timeout=300)
    assert text.returncode == 0 and "transfer / virtio-net-pci" in text.stdout and "beyond run-to-run noise" in text.stdout
    assert all(function in text.stdout for function in changed_drops), (changed_drops, text.stdout)
    assert "What differs between the runs" in html.read_text()
    # runs of two different labs: exit 2 and one clear sentence, no traceback
    _, skb = skb_latency_run
    bad = session_cli("compare", str(a), str(skb), timeout=300)
    assert bad.returncode == 2
    assert "RUN_A is a run of lab 'nic-driver-cost' and RUN_B of lab 'skb-latency'" in " ".join(bad.stderr.split())
    assert "Traceback" not in bad.stderr
