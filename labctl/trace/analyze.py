"""Figures for one guest and step, computed from the files the runner leaves in ``<step_dir>/<guest>/``.

:func:`guest_figures` never raises for missing or odd files: each figure
it cannot compute is None and a line in ``warnings`` says why, for what the
step asked for only: a tracer's output is missing only when the tracer ran
(its ``NAME.pid`` or its output is there), a transfer only when the caller
expected one (a step that runs commands and names the NIC under test).

Driver share. ``perf record -a -e cpu-clock`` samples idle CPUs too (the
idle loop shows up as ``native_safe_halt``), so a module's share of *all*
samples is already a share of total CPU time. The seed article's figure
("the 8139 driver used about 20% of the load ... about 3% of the CPU")
is a share of the *busy* samples times the CPU load. Hence:

* ``driver_share_all_pct``: percent of all samples in ``[m]`` for m in the
  driver modules;
* ``idle_pct``: percent of all samples in the kernel's idle functions
  (from ``perf-report.txt``);
* ``driver_share_pct`` = ``driver_share_all_pct / (100 - idle_pct) * 100``,
  the share of the load;
* ``driver_cpu_pct`` = ``driver_share_pct * cpu_load_pct / 100``, which
  should come out close to ``driver_share_all_pct`` when mpstat and perf
  covered the same interval.

perf shows a module as its own dso (``[8139cp]``) only when it reads
kernel symbols from a kallsyms file: when it finds ``/proc/kcore`` (the
default in the guest, which has no vmlinux) it folds every module into
``[kernel.kallsyms]``. ``perf report --kallsyms=<copy of /proc/kallsyms>``
avoids that. A report without any module dso is therefore treated as
"cannot tell" (None plus a warning), not as a 0% share.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

from labctl.trace.netfigures import NetworkFigures, network_figures
from labctl.trace.parsers import (
    PerfReport,
    Throughput,
    dso_shares,
    iperf3_error,
    is_tracepoint,
    parse_iperf3_json,
    parse_kprobe_profile,
    parse_mpstat_json,
    parse_perf_record_log,
    parse_perf_report,
    parse_trace_cmd_stat,
    parse_wget,
    perf_report_events,
)
from labctl.trace.stats import parse_nstat, parse_softnet_stat, softnet_delta

if TYPE_CHECKING:  # tpcounts loads when a step counted tracepoints
    from labctl.trace.flamefold import FlameFigures
    from labctl.trace.perfetto import TraceSummary
    from labctl.trace.skblatency import SkbLatency
    from labctl.trace.tpcounts import CountSource

TOP_SYMBOLS = 15

IDLE_SYMBOLS = frozenset({
    "native_safe_halt", "pv_native_safe_halt", "default_idle", "default_idle_call", "arch_cpu_idle",
    "acpi_safe_halt", "acpi_idle_do_entry", "acpi_idle_enter", "mwait_idle", "mwait_idle_with_hints",
    "intel_idle", "intel_idle_irq", "poll_idle", "cpu_idle_poll", "amd_e400_idle", "cpuidle_enter_state",
    "do_idle", "cpu_startup_entry",
})
"""Kernel functions whose cpu-clock samples mean an idle CPU (compiler
suffixes such as ``.constprop.0`` are ignored)."""

NOT_MODULES = frozenset({"[kernel.kallsyms]", "[vdso]", "[vsyscall]", "[unknown]", "[guest.kernel.kallsyms]",
                         "[hypervisor]", "[kernel.vmlinux]", "[vectors]", "[uprobes]"})
"""Bracketed dso names that are not kernel modules."""

T = TypeVar("T")


class _Guest:
    """Reads one guest directory and collects warnings."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.warnings: list[str] = []

    def text(self, name: str, *, optional: bool = False) -> str | None:
        """The file's text, or None (with a warning unless optional) if missing or unreadable."""
        try:
            return (self.path / name).read_text(errors="replace")
        except FileNotFoundError:
            if not optional:
                self.warnings.append(f"{name}: missing")
        except OSError as exc:
            self.warnings.append(f"{name}: unreadable ({exc.strerror or exc})")
        return None

    def parsed(self, name: str, parse: Callable[[str], T | None], what: str) -> T | None:
        """``parse(text)`` of a file, None with a warning if missing or if it parses to nothing."""
        text = self.text(name)
        if text is None:
            return None
        result = parse(text)
        if result is None or result == {}:
            self.warnings.append(f"{name}: no {what} found")
            return None
        return result


def _numbered(path: Path, pattern: str) -> list[Path]:
    """Files matching ``cmd-<i>.<ext>`` in numeric order of i."""
    found = []
    for p in path.glob(pattern):
        m = re.fullmatch(r"cmd-(\d+)\.\w+", p.name)
        if m is not None:
            found.append((int(m[1]), p.name, p))
    return [p for _, _, p in sorted(found)]


def _ran(g: _Guest, *names: str) -> bool:
    """Whether any of these files is in the guest's directory (a tracer's pid file or output)."""
    return any((g.path / n).exists() for n in names)


def _throughput(g: _Guest, expected: bool) -> tuple[Throughput | None, str | None]:
    """The first iperf3 JSON or wget result among cmd-*.out/err, and its file name; a warning when
    none was found and one was ``expected``.

    An iperf3 run that ended in an error is named in a warning with its
    message as iperf3 wrote it (it may have exited 0 all the same).
    """
    found: tuple[Throughput | None, str | None] = (None, None)
    for out in _numbered(g.path, "cmd-*.out"):
        err = out.with_suffix(".err")
        for candidate in (out, err):
            text = g.text(candidate.name, optional=True)
            if text is None:
                continue
            error = iperf3_error(text)
            if error is not None:
                g.warnings.append(f"{candidate.name}: iperf3 failed: {error}")
                continue
            result = parse_iperf3_json(text) or parse_wget(text)
            if found[0] is None and result is not None and result.bps is not None:
                found = (result, candidate.name)
    if found[0] is None and expected:
        g.warnings.append("cmd-*.out/err: no iperf3 JSON or wget transfer found")
    return found


def _module_dso(module: str) -> str:
    """``virtio-net`` -> ``[virtio_net]``: perf names modules as the kernel does, with underscores."""
    return f"[{module.strip('[]').replace('-', '_')}]"


def _has_modules(shares: dict[str, float]) -> bool:
    """Whether any dso in the report is a kernel module."""
    return any(d.startswith("[") and d.endswith("]") and d not in NOT_MODULES for d in shares)


def _driver_share_all(g: _Guest, modules: list[str], reports: dict[str, PerfReport]) -> float | None:
    """Percent of all samples in the driver modules, from the dso report or else the dso,sym one."""
    for name in ("perf-report-dso.txt", "perf-report.txt"):
        report = reports.get(name)
        if report is None or not report.rows:
            continue
        shares = dso_shares(report)
        if not _has_modules(shares):
            g.warnings.append(f"{name}: no kernel module dso; perf probably read /proc/kcore and folded "
                              "modules into [kernel.kallsyms] (use perf report --kallsyms=FILE)")
            return None
        if name == "perf-report.txt":
            g.warnings.append("driver share from perf-report.txt: rows under --percent-limit are missing")
        return round(sum(shares.get(_module_dso(m), 0.0) for m in modules), 4)
    return None


def _idle_pct(report: PerfReport | None) -> float | None:
    """Percent of all samples in the kernel's idle functions, or None without a symbol report."""
    if report is None or not any(r.symbol for r in report.rows):
        return None
    idle = sum(r.pct for r in report.rows if r.kernel and r.symbol and r.symbol.split(".")[0] in IDLE_SYMBOLS)
    return round(idle, 4)


def _load_reports(g: _Guest) -> dict[str, PerfReport]:
    """Parsed perf reports by file name, of the first sampling event (never a tracepoint's hits).

    A missing or rowless report gets a warning; a recording of tracepoints
    only has no CPU samples to read, which is no problem (its counts are
    :mod:`labctl.trace.tpcounts`').
    """
    reports: dict[str, PerfReport] = {}
    recorded = _ran(g, "perf-record.pid", "perf.data", "perf-report.err", "perf-report.txt", "perf-report-dso.txt")
    for name in ("perf-report-dso.txt", "perf-report.txt"):
        text = g.text(name, optional=not recorded)
        if text is None:
            continue
        events = perf_report_events(text)
        if events and all(is_tracepoint(e) for e in events):
            continue
        reports[name] = parse_perf_report(text, sampling=True)
        if not reports[name].rows:
            g.warnings.append(f"{name}: no perf report rows found")
    return reports


class PerfEvents(TypedDict):
    """What perf recorded in a step: its events, sampling events and tracepoints apart."""

    events: list[str]
    sampling: list[str]
    tracepoints: list[str]


class TopSymbol(TypedDict):
    """One of the hottest symbols of a guest's perf report."""

    symbol: str
    dso: str | None
    pct: float


def _recording(g: _Guest) -> PerfEvents | None:
    """What perf recorded: its events, split into sampling events and tracepoints (None without perf)."""
    text = g.text("perf-report-dso.txt", optional=True) or g.text("perf-report.txt", optional=True)
    if text is None:
        return None
    events = list(dict.fromkeys(perf_report_events(text)))
    return {"events": events, "sampling": [e for e in events if not is_tracepoint(e)],
            "tracepoints": [e for e in events if is_tracepoint(e)]}


def _samples(g: _Guest, reports: dict[str, PerfReport]) -> tuple[int | None, int | None]:
    """(samples, lost samples): exact samples from perf-record.log when present, else the report header."""
    headers = [r for r in reports.values() if r.samples is not None or r.lost_samples is not None]
    samples = headers[0].samples if headers else None
    lost = next((r.lost_samples for r in headers if r.lost_samples is not None), None)
    log = g.text("perf-record.log", optional=True)
    exact = parse_perf_record_log(log).get("samples") if log is not None else None
    if reports and not headers:
        g.warnings.append("perf reports: no '# Samples' header found")
    return (exact if exact is not None else samples), lost


def _top_symbols(report: PerfReport | None) -> list[TopSymbol]:
    """The TOP_SYMBOLS rows with a symbol, highest share first."""
    rows = sorted((r for r in (report.rows if report else ()) if r.symbol), key=lambda r: -r.pct)
    return [{"symbol": r.symbol or "", "dso": r.dso, "pct": r.pct} for r in rows[:TOP_SYMBOLS]]


def _softnet(g: _Guest) -> dict[str, int] | None:
    """Summed softnet deltas (processed, dropped, time_squeeze) between the two snapshots."""
    taken = _ran(g, "stats/before")
    before = g.text("stats/before/softnet_stat.txt", optional=not taken)
    after = g.text("stats/after/softnet_stat.txt", optional=not taken)
    if before is None or after is None:
        return None
    rows_before, rows_after = parse_softnet_stat(before), parse_softnet_stat(after)
    if not rows_before or not rows_after:
        g.warnings.append("stats/*/softnet_stat.txt: no softnet rows found")
        return None
    return softnet_delta(rows_before, rows_after)["total"]


def _snmp(g: _Guest) -> dict[str, int] | None:
    """The nstat counters (SNMP MIB and Linux extensions) that changed between the step's snapshots."""
    before = g.text("stats/before/nstat.txt", optional=True)
    after = g.text("stats/after/nstat.txt", optional=True)
    if before is None or after is None:
        return None
    a, b = parse_nstat(before), parse_nstat(after)
    return {k: b[k] - a.get(k, 0) for k in sorted(b) if b[k] != a.get(k, 0)}


def _trace_loss(g: _Guest, lost_samples: int | None) -> dict[str, int | None]:
    """perf's lost samples, ftrace's lost events (overrun + commit overrun + dropped) and kprobe misses."""
    stat = None
    ftrace_files = ("trace.dat", "trace-stat.txt", "trace-report.txt", "trace-cmd.log")
    if any((g.path / f).exists() for f in ftrace_files):  # only when ftrace ran in this step
        stat = g.parsed("trace-stat.txt", lambda t: parse_trace_cmd_stat(t) if "CPU:" in t else None,
                        "ring-buffer statistics")
    overruns = None if stat is None else stat["overrun"] + stat["commit_overrun"] + stat["dropped_events"]
    profile_text = g.text("kprobe_profile.txt", optional=True)
    profile = parse_kprobe_profile(profile_text) if profile_text is not None else None
    misses = None if profile is None else sum(p["misses"] for p in profile.values())
    return {"perf_lost": lost_samples, "ftrace_overruns": overruns, "kprobe_misses": misses}


def _skb_latency(g: _Guest) -> SkbLatency | None:
    """Per-packet stage latency (labctl.trace.skblatency) when the step traced it; writes its CSV files."""
    from labctl.trace.skblatency import REPORT, analyze_dir

    if not (g.path / REPORT).is_file():
        if (g.path / "skb-latency.pid").exists():
            g.warnings.append(f"skb_latency: {REPORT} is missing (see skb-latency.log, skb-report.err)")
        return None
    try:
        return analyze_dir(g.path)
    except (OSError, ValueError) as exc:
        g.warnings.append(f"skb_latency: analysis failed: {exc}")
        return None


def _mbit(bps: float | None) -> float | None:
    """Bits per second in Mbit/s, rounded to 0.001."""
    return None if bps is None else round(bps / 1e6, 3)


def _driver_figures(g: _Guest, modules: list[str], reports: dict[str, PerfReport],
                    load: float | None) -> tuple[float | None, float | None, float | None, float | None]:
    """driver_share_pct, driver_cpu_pct, driver_share_all_pct and idle_pct (see the module docstring)."""
    share_all = _driver_share_all(g, modules, reports)
    idle = _idle_pct(reports.get("perf-report.txt"))
    share = None
    if share_all is not None and idle is not None and idle < 100:
        share = round(share_all / (100 - idle) * 100, 4)
    elif share_all is not None:
        g.warnings.append("driver_share_pct: no idle share (perf-report.txt with symbols needed)")
    cpu = None if share is None or load is None else round(share * load / 100, 4)
    return share, cpu, share_all, idle


class GuestFigures(NetworkFigures, total=False):
    """One guest's figures of one step (:func:`guest_figures`; summary.json's ``steps[].guests.GUEST``),
    what the report reads of them (the network ones: :class:`NetworkFigures`); the report's sections
    add ``flamegraph`` and ``trace_json``."""

    throughput_mbit_s: float | None
    throughput_source: str | None
    transfer_bytes: int | None
    cpu_load_pct: float | None
    driver_share_pct: float | None
    driver_cpu_pct: float | None
    driver_share_all_pct: float | None
    idle_pct: float | None
    samples: int | None
    lost_samples: int | None
    top_symbols: list[TopSymbol]
    softnet: dict[str, int] | None
    snmp: dict[str, int] | None
    trace_loss: dict[str, int | None]
    perf_events: PerfEvents
    skb_latency: SkbLatency
    tracepoints: list[CountSource]
    warnings: list[str]
    flamegraph: FlameFigures  # labctl.report.flames
    trace_json: TraceSummary  # labctl.report.guest_parts


def guest_figures(guest_dir: Path, driver_modules: list[str], window_s: float | None = None, *,
                  expect_transfer: bool = True) -> GuestFigures:
    """The figures of one guest and step, JSON-able.

    Keys: ``throughput_mbit_s`` (receiver side, else sender), ``throughput_source``
    (file and tool), ``cpu_load_pct``, ``driver_share_pct``, ``driver_cpu_pct``,
    ``driver_share_all_pct``, ``idle_pct``, ``samples``, ``lost_samples``,
    ``top_symbols`` (list of {symbol, dso, pct}), ``softnet`` ({processed,
    dropped, time_squeeze} deltas), ``trace_loss`` ({perf_lost,
    ftrace_overruns, kprobe_misses}), ``skb_latency`` (only when the step
    traced it: see :func:`labctl.trace.skblatency.summarize`), ``perf_events`` (what perf
    recorded, sampling events and tracepoints apart), ``tracepoints`` (counts per event,
    command and CPU, rates over ``window_s``: :mod:`labctl.trace.tpcounts`), ``snmp`` (the nstat
    counters that moved), the network figures of :func:`labctl.trace.netfigures.network_figures`
    and ``warnings``. ``driver_modules`` are
    module names as in lsmod (``8139cp``, ``virtio_net``). Optional inputs
    (``perf-record.log`` for an exact sample count, ``kprobe_profile.txt``)
    cause no warning when absent, nor do those of a tracer that did not run; a missing transfer
    warns only when ``expect_transfer``. Raises nothing for missing or odd files.
    """
    g = _Guest(guest_dir)
    if not guest_dir.is_dir():
        g.warnings.append(f"{guest_dir}: not a directory")
    tput, source = _throughput(g, expect_transfer)
    load = (g.parsed("mpstat.json", parse_mpstat_json, "cpu 'all' samples") if _ran(g, "mpstat.pid", "mpstat.json")
            else None)
    recording = _recording(g)
    reports = _load_reports(g)
    samples, lost = _samples(g, reports)
    share, cpu, share_all, idle = _driver_figures(g, driver_modules, reports, load)
    figures: GuestFigures = {
        "throughput_mbit_s": _mbit(tput.bps) if tput else None,
        "throughput_source": f"{source} ({tput.tool})" if tput else None,
        "transfer_bytes": tput.bytes if tput else None,
        "cpu_load_pct": load,
        "driver_share_pct": share, "driver_cpu_pct": cpu, "driver_share_all_pct": share_all, "idle_pct": idle,
        "samples": samples,
        "lost_samples": lost,
        "top_symbols": _top_symbols(reports.get("perf-report.txt")),
        "softnet": _softnet(g),
        "snmp": _snmp(g),
        "trace_loss": _trace_loss(g, lost),
    }
    if recording is not None:
        figures["perf_events"] = recording
    network_figures(guest_dir, figures)
    skb = _skb_latency(g)
    if skb is not None:
        figures["skb_latency"] = skb
    tracepoints = _derived(g, window_s)
    if tracepoints:
        figures["tracepoints"] = tracepoints
    figures["warnings"] = g.warnings
    return figures


def _derived(g: _Guest, window_s: float | None) -> list[CountSource]:
    """Tracepoint counts, where the step recorded tracepoints."""
    from labctl.trace.tpcounts import guest_tracepoints

    return guest_tracepoints(g.path, window_s)


def step_figures(guests: Mapping[str, GuestFigures], nic_guest: str | None) -> dict[str, float | None]:
    """A step's headline figures: those of the NIC's guest (else the first guest)."""
    focus = nic_guest or next(iter(guests), None)
    fig: GuestFigures = guests.get(focus, {}) if focus else {}
    return {"throughput_mbit_s": fig.get("throughput_mbit_s"), "cpu_load_pct": fig.get("cpu_load_pct"),
            "driver_share_pct": fig.get("driver_share_pct"), "driver_cpu_pct": fig.get("driver_cpu_pct")}
