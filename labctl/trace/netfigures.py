"""Network figures of one guest and step, from its statistics deltas and command output; and its captures.

* ``per_cpu``: receive work per CPU, for the RPS seed: softnet ``processed``
  and ``received_rps`` deltas, ``NET_RX`` softirqs raised, and ``%soft``
  from ``mpstat -P ALL`` (mean over the samples);
* ``reassembly``: IP reassembly counters (``ReasmReqds``, ``ReasmOKs``,
  ``ReasmFails``, ``ReasmTimeout`` from ``/proc/net/snmp``) and
  ``FragCreates``, ``FragOKs``, ``FragFails``, for the fragmentation talk;
* ``udp``: datagrams an iperf3 UDP test sent and lost (its own sequence numbers);
* ``nic_counters``: each lab NIC's packet and byte deltas (``ip -s link``).

:func:`capture_figures` reads a step's pcapng files back (frames, bytes,
time span) and compares each with its NIC's counters over the same window:
a capture holding fewer frames than the NIC sent and received has lost
some, and says so. Everything here raises nothing for missing or odd files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from labctl.trace.stats import StatDelta

if TYPE_CHECKING:
    from labctl.lab import CaptureRecord

REASSEMBLY = ("ReasmReqds", "ReasmOKs", "ReasmFails", "ReasmTimeout", "FragCreates", "FragOKs", "FragFails")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return None


class CpuRow(TypedDict):
    """Receive work of one CPU over the step: softnet's packets, RPS, NET_RX softirqs, mpstat's %soft."""

    cpu: str
    processed: int | None
    received_rps: int | None
    net_rx: int
    soft_pct: float | None


class UdpLoss(TypedDict):
    """What an iperf3 UDP test sent and lost."""

    datagrams: int
    lost: int
    lost_pct: float
    file: str


class NetworkFigures(TypedDict, total=False):
    """A guest's network figures of one step (:func:`network_figures`): those measured; the rest
    of its figures (:class:`labctl.trace.analyze.GuestFigures`) extend them."""

    per_cpu: list[CpuRow]
    reassembly: dict[str, int] | None
    udp: UdpLoss | None
    nic_counters: dict[str, dict[str, int]]


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def per_cpu(delta: Mapping[str, StatDelta], mpstat: Any) -> list[CpuRow]:
    """Receive work per CPU (see the module docstring); [] without softnet deltas."""
    softnet = _map(_map(delta.get("softnet_stat")).get("per_cpu"))
    if not softnet:
        return []
    net_rx = _map(delta.get("softirqs")).get("NET_RX") or {}
    rx_cpus = net_rx.get("cpus") if isinstance(net_rx, Mapping) else None
    soft = _mpstat_soft(mpstat)
    rows: list[CpuRow] = []
    for cpu, counters in sorted(softnet.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
        i = int(cpu) if str(cpu).isdigit() else -1
        rows.append({"cpu": str(cpu), "processed": _map(counters).get("processed"),
                     "received_rps": _map(counters).get("received_rps"),
                     "net_rx": rx_cpus[i] if isinstance(rx_cpus, list) and 0 <= i < len(rx_cpus) else 0,
                     "soft_pct": soft.get(str(cpu))})
    return rows


def _mpstat_soft(doc: Any) -> dict[str, float]:
    """Mean ``%soft`` per CPU over mpstat's samples (``mpstat -P ALL -o JSON``)."""
    sums: dict[str, list[float]] = {}
    try:
        for host in doc["sysstat"]["hosts"]:
            for stat in host.get("statistics", []):
                for c in stat.get("cpu-load", []):
                    if c.get("cpu") != "all" and isinstance(c.get("soft"), int | float):
                        sums.setdefault(str(c["cpu"]), []).append(float(c["soft"]))
    except (KeyError, TypeError, AttributeError):
        return {}
    return {cpu: round(sum(v) / len(v), 2) for cpu, v in sums.items() if v}


def reassembly(delta: Mapping[str, StatDelta], measured: bool) -> dict[str, int] | None:
    """IP fragmentation and reassembly counter deltas (0 when unchanged); None when not measured."""
    if not measured:
        return None
    ip = _map(_map(delta.get("snmp")).get("Ip"))
    return {k: int(ip.get(k, 0)) for k in REASSEMBLY}


def udp_loss(guest_dir: Path) -> UdpLoss | None:
    """Datagrams an iperf3 UDP test sent and lost, from the first cmd-*.out that has them."""
    for out in sorted(guest_dir.glob("cmd-*.out")):
        doc = _json(out)
        end = _map(_map(doc).get("end"))
        for key in ("sum_received", "sum"):
            s = _map(end.get(key))
            if isinstance(s.get("lost_packets"), int) and isinstance(s.get("packets"), int):
                return {"datagrams": s["packets"], "lost": s["lost_packets"],
                        "lost_pct": round(float(s.get("lost_percent") or 0), 3), "file": out.name}
    return None


def nic_counters(delta: Mapping[str, StatDelta]) -> dict[str, dict[str, int]]:
    """Each lab NIC's ``ip -s link`` deltas that changed (``link-<nic>`` snapshots)."""
    return {stem[len("link-"):]: dict(_map(v)) for stem, v in delta.items() if stem.startswith("link-")}


def network_figures(guest_dir: Path, figures: NetworkFigures) -> None:
    """Add ``per_cpu``, ``reassembly``, ``udp`` and ``nic_counters`` of one guest and step to its
    ``figures``, those measured."""
    delta = _map(_json(guest_dir / "stats" / "delta.json"))
    measured = "snmp" in delta or (guest_dir / "stats" / "after" / "snmp.txt").is_file()
    if rows := per_cpu(delta, _json(guest_dir / "mpstat.json")):
        figures["per_cpu"] = rows
    if counts := reassembly(delta, measured):
        figures["reassembly"] = counts
    if udp := udp_loss(guest_dir):
        figures["udp"] = udp
    if nics := nic_counters(delta):
        figures["nic_counters"] = nics


def capture_figures(bundle: Path, captures: list[CaptureRecord], guests: Mapping[str, NetworkFigures],
                    links_down: frozenset[str] = frozenset()) -> list[CaptureRecord]:
    """Each capture of a step as recorded, its file read back, and what its NIC counted.

    ``missing`` is how many frames the NIC counted (sent and received) more
    than the capture holds; the capture covers the counters' window, so
    anything above 0 is frames the capture lost, unless the step took the NIC's
    link down (``links_down``: ``guest.nic``): QEMU drops what a NIC sends while
    its link is down before any filter sees it (``link_down`` says so).
    File names are relative to ``bundle``.
    """
    from labctl.net import PcapError, read_pcapng

    out: list[CaptureRecord] = []
    for cap in captures:
        entry = cap.copy()
        path = bundle / str(cap.get("file") or "")
        if cap.get("file") and path.is_file():
            try:
                frames = list(read_pcapng(path))
                entry["frames"], entry["bytes"] = len(frames), sum(f.length for f in frames)
                entry["first_us"] = frames[0].ts_us if frames else None
                entry["last_us"] = frames[-1].ts_us if frames else None
            except (OSError, PcapError) as exc:
                entry.setdefault("warnings", []).append(f"{path.name}: {exc}")
        measured = _map(_map(guests.get(str(cap.get("guest")))).get("nic_counters"))
        if str(cap.get("nic")) in measured:
            counted = _map(measured[str(cap.get("nic"))])
            nic = int(counted.get("rx_packets", 0)) + int(counted.get("tx_packets", 0))
            entry["nic_frames"] = nic
            entry["missing"] = max(0, nic - int(entry.get("frames") or 0))
            if f"{cap.get('guest')}.{cap.get('nic')}" in links_down:
                entry["link_down"] = True
        out.append(entry)
    return out
