"""The report's network sections: the topology picture (:class:`TopologySection`, before the results);
what each step did to the links and captured, IP reassembly next to the datagrams the application
lost, and receive work per CPU (:class:`NetworkSection`).

Figures come from summary.json (:mod:`labctl.trace.netfigures`; the captures' piece is this
section's: each capture read back and compared with its NIC's counters); the picture from the
manifest's resolved lab and what ``up`` recorded (:mod:`labctl.net.graph`).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from labctl.bundle import Run, StepSummary, as_dict, as_list, full_label, run_steps, step_guests
from labctl.lab import Impairment
from labctl.net import runtime_from_state, to_mermaid, to_svg, topology
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Bullets, Charts, Heading, Para, Picture, Row, Span, Table, num, txt
from labctl.report.sections import ReportSection, StepFiles
from labctl.trace import GuestFigures, capture_figures

REASM_COLUMNS = ("ReasmReqds", "ReasmOKs", "ReasmFails", "ReasmTimeout")


def topology_blocks(run: Run) -> list[Block]:
    """The lab's topology as a picture (drivers, mechanisms, impairments and captures marked)."""
    lab = as_dict(as_dict(run.manifest.get("lab")).get("resolved"))
    if not lab.get("guests"):
        return []
    captured = sorted({f"{c.get('guest')}.{c.get('nic')}" for s in run_steps(run.summary)
                       for c in as_list(s.get("captures")) if isinstance(c, dict)})
    runtime = runtime_from_state(as_dict(run.manifest.get("drivers")), as_dict(run.manifest.get("networks")),
                                 captures=captured, offloads=as_dict(run.manifest.get("vlan_offloads")))
    topo = topology(lab, runtime)
    return [Picture(to_svg(topo, standalone=False, id_prefix="topology"), to_mermaid(topo))]


def _impair_text(values: object) -> str:
    try:
        return Impairment.from_dict(as_dict(values)).describe()
    except ValueError:
        return "?"


def _time(us: object) -> str:
    if not isinstance(us, int):
        return "–"
    moment = datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC)
    return moment.strftime("%H:%M:%S.%f")[:-3]


def step_network_blocks(step: StepSummary) -> list[Block]:
    """Impairments in force and links changed during a step, and its captures."""
    network = as_dict(step.get("network"))
    blocks: list[Block] = []
    items = [(Span(k, "code"), Span(f": {_impair_text(v)}")) for k, v in as_dict(network.get("impair")).items()]
    items += [(Span(k, "code"), Span(f": link taken {v} by the step (put back after)"))
              for k, v in as_dict(network.get("links")).items()]
    if items:
        blocks += [Heading(4, "Network"), Bullets(tuple(items))]
    caps = [c for c in as_list(step.get("captures")) if isinstance(c, dict)]
    if caps:
        rows = []
        for c in caps:
            missing = c.get("missing")
            bad = bool(missing) and not c.get("link_down")
            file = c.get("file")
            rows.append(Row((txt(f"{c.get('guest')}.{c.get('nic')}", "code"), num(c.get("frames")), num(c.get("bytes")),
                             txt(f"{_time(c.get('first_us'))} → {_time(c.get('last_us'))}"),
                             num(c.get("nic_frames")),
                             txt(missing if missing is not None else "n/a",
                                 "bad" if bad else "muted" if missing is None else ""),
                             (Span(str(file), "code", str(file)),) if file else txt("not written", "bad")),
                            "failed" if bad else ""))
        blocks += [Heading(4, "Captures"),
                   Table(("NIC", "frames", "bytes", "first → last (UTC)", "NIC sent + received", "missing", "file"),
                         tuple(rows), frozenset({1, 2, 4, 5}))]
    return blocks


def _reasm_rows(steps: Sequence[StepSummary]) -> list[tuple[StepSummary, str, GuestFigures]]:
    """(step, guest, figures) of every guest that reassembled or fragmented IP datagrams."""
    out = []
    for s in steps:
        for guest, figs in step_guests(s):
            r = as_dict(figs.get("reassembly"))
            if any(r.get(k) for k in ("ReasmReqds", "FragCreates")):
                out.append((s, guest, figs))
    return out


def reassembly_blocks(run: Run) -> list[Block]:
    """IP reassembly counters per step next to the datagrams the application lost (the fragmentation talk)."""
    rows = [(s, g, f) for s, g, f in _reasm_rows(run_steps(run.summary))
            if as_dict(f.get("reassembly")).get("ReasmReqds")]
    if not rows:
        return []
    table_rows = []
    for s, guest, figs in rows:
        r, udp = as_dict(figs.get("reassembly")), _udp_of(s)
        impair = "; ".join(f"{k}: {_impair_text(v)}" for k, v in as_dict(as_dict(s.get("network")).get("impair")).items())
        table_rows.append(Row((txt(full_label(s)), txt(guest), txt(impair or "none"),
                               num(udp.get("datagrams")), num(udp.get("lost")), num(udp.get("lost_pct")),
                               *(num(r.get(k)) for k in REASM_COLUMNS))))
    headers = ("step", "receiver", "impairment", "datagrams sent", "lost (app)", "lost %", *REASM_COLUMNS)
    labels = [full_label(s) for s, _, _ in rows]
    chart = bar_chart_svg("IP reassembly failures (ReasmFails)", labels,
                          [as_dict(f.get("reassembly")).get("ReasmFails") for _, _, f in rows], "",
                          axis_label="ReasmFails")
    lost = bar_chart_svg("Datagrams the application lost", labels, [_udp_of(s).get("lost") for s, _, _ in rows], "",
                         axis_label="datagrams lost")
    note = Para(txt("ReasmFails counts datagrams whose fragments never all arrived (timed out, see ReasmTimeout, "
                    "or dropped over ipfrag_high_thresh); the application's losses come from its own sequence "
                    "numbers (iperf3 UDP)."), "muted")
    return [Heading(2, "IP fragmentation and reassembly"), Table(headers, tuple(table_rows), frozenset(range(3, 10))),
            note, Charts((chart, lost))]


def _udp_of(step: StepSummary) -> dict[str, Any]:
    """The step's iperf3 UDP figures, from whichever guest ran the test."""
    return next((as_dict(f.get("udp")) for _, f in step_guests(step) if f.get("udp")), {})


def per_cpu_blocks(run: Run) -> list[Block]:
    """Receive work per CPU, step by step, for guests with more than one CPU (the RPS seed)."""
    rows, labels, shares = [], [], []
    for s in run_steps(run.summary):
        for guest, figs in step_guests(s):
            cpus = [c for c in as_list(figs.get("per_cpu")) if isinstance(c, dict)]
            if len(cpus) < 2 or not any(c.get("processed") for c in cpus):
                continue
            total = sum(int(c.get("processed") or 0) for c in cpus) or 1
            for c in cpus:
                rows.append(Row((txt(full_label(s)), txt(guest), txt(c.get("cpu")), num(c.get("processed")),
                                 num(round(100 * int(c.get("processed") or 0) / total, 1)),
                                 num(c.get("received_rps")), num(c.get("net_rx")), num(c.get("soft_pct")),
                                 num(figs.get("throughput_mbit_s")))))
                labels.append(f"{full_label(s)} · {guest} cpu{c.get('cpu')}")
                shares.append(round(100 * int(c.get("processed") or 0) / total, 1))
    if not rows:
        return []
    headers = ("step", "guest", "CPU", "softnet processed", "share %", "received_rps", "NET_RX softirqs",
               "%soft", "throughput Mbit/s")
    chart = bar_chart_svg("Packets processed on each CPU", labels, shares, "%", axis_label="share of packets (%)")
    return [Heading(2, "Receive work per CPU"), Table(headers, tuple(rows), frozenset(range(3, 9))),
            Para(txt("softnet processed: packets the network stack took on that CPU; received_rps: packets "
                     "another CPU steered to it (RPS); NET_RX softirqs: receive softirqs run there; %soft: "
                     "its time in softirqs (mpstat)."), "muted"), Charts((chart,))]


class TopologySection(ReportSection):
    """The lab's topology, before the results."""

    name = "topology"
    placement = "lead"

    def blocks(self, run: Run) -> list[Block]:
        return topology_blocks(run)


def _capture_warning(cap: Mapping[str, Any]) -> str:
    label = f"{cap.get('guest')}.{cap.get('nic')}"
    warning = (f"{label}: the capture holds {cap.get('frames')} frames but the NIC sent and received "
               f"{cap.get('nic_frames')}: {cap['missing']} are missing from it")
    if cap.get("link_down"):
        warning += " (the step took its link down: QEMU drops what the NIC sends meanwhile, before any capture)"
    return warning


class NetworkSection(ReportSection):
    """A step's network changes and captures; reassembly and receive work per CPU over the run."""

    name = "network"
    kinds = ("network",)

    def summarize(self, step: StepFiles) -> None:
        e = step.entry
        links = as_dict(e.get("network")).get("links") or {}
        e["captures"] = capture_figures(step.bundle, list(as_list(e.get("captures"))), as_dict(e.get("guests")),
                                        frozenset(links))
        for cap in e["captures"]:
            if cap.get("missing") and (warning := _capture_warning(cap)) not in e["warnings"]:
                e["warnings"].append(warning)

    def blocks(self, run: Run) -> list[Block]:
        return reassembly_blocks(run) + per_cpu_blocks(run)

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return step_network_blocks(step)
