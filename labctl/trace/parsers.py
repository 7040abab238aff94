"""Parsers for the text that perf, trace-cmd, mpstat, iperf3 and wget leave in a guest directory.

Every parser takes the raw text and degrades instead of raising: input it
cannot use gives None, an empty container, or a result without the parts
it could not read. Callers turn that into warnings. Formats are those of
the Debian 12 guest image (perf 6.1, trace-cmd 3.1, sysstat 12.6,
iperf 3.12, GNU wget 1.21); ``tests/fixtures/trace`` holds real samples.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict


def read_or_none(path: Path) -> str | None:
    """A guest directory's file's text (undecodable bytes replaced), or None if it cannot be read."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


# --------------------------------------------------------------------------- perf report


def _float(text: str) -> float | None:
    """``float(text)`` or None."""
    try:
        return float(text)
    except ValueError:
        return None



@dataclass(frozen=True)
class PerfRow:
    """One row of ``perf report --stdio``.

    ``pct`` is the Overhead (or Self, when the report also has a Children
    column), ``dso`` the Shared Object (None when not sorted by dso),
    ``symbol`` the symbol without its ``[k]``/``[.]`` marker (None when not
    sorted by symbol) and ``kernel`` whether the marker was ``[k]``.
    """

    pct: float
    dso: str | None
    symbol: str | None
    kernel: bool = False
    children: float | None = None


@dataclass(frozen=True)
class PerfReport:
    """A parsed ``perf report --stdio``: the first event's header and rows.

    ``samples`` comes from ``# Samples: 90K of event ...``; perf truncates it
    to thousands (90744 prints as ``90K``), so it is a lower bound unless
    below 1000. ``event_count`` is perf's ``Event count (approx.)`` and
    ``lost_samples`` its ``Total Lost Samples`` (perf 6.1 prints it even
    when 0; None when absent). Any of them is None when missing.
    """

    rows: tuple[PerfRow, ...]
    samples: int | None = None
    event: str | None = None
    event_count: int | None = None
    lost_samples: int | None = None


_UNITS = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3}
_SAMPLES = re.compile(r"#\s*Samples:\s*(\d+)\s*([KMG]?)\s+of event\s+'([^']*)'")
_EVENT_COUNT = re.compile(r"#\s*Event count \(approx\.\):\s*(\d+)")
_LOST = re.compile(r"#\s*Total Lost Samples:\s*(\d+)")
_ROW = re.compile(r"\s*(\d+(?:\.\d+)?)%\s+(?:(\d+(?:\.\d+)?)%\s+)?(\S.*?)\s*$")
_MARKER = re.compile(r"(?:^|\s)\[([kK.gGuHs])\]\s+")


def _perf_row(line: str) -> PerfRow | None:
    """One data row split on whitespace (no column layout known), or None for anything else."""
    m = _ROW.fullmatch(line)
    if m is None:
        return None
    first, second, rest = float(m[1]), m[2], m[3]
    pct, children = (float(second), first) if second is not None else (first, None)
    marker = _MARKER.search(rest)
    if marker is None:
        return PerfRow(pct, rest, None, children=children)
    dso = rest[: marker.start()].strip() or None
    return PerfRow(pct, dso, rest[marker.end():].strip(), marker[1] == "k", children)


_Columns = list[tuple[str, int, int | None]]


def _columns(header: str, dots: str) -> _Columns:
    """(name, start, end) per column from the ``# Overhead  Shared Object ...`` line and the dotted line under it."""
    spans = [m.start() for m in re.finditer(r"\.+", dots)]
    ends: list[int | None] = [*spans[1:], None]
    return [(header[start:end].strip().lower(), start, end) for start, end in zip(spans, ends)]


def _pct(text: str) -> float | None:
    """``"43.07%"`` -> 43.07, or None."""
    return _float(text.strip().rstrip("%")) if text.strip().endswith("%") else None


def _column_row(line: str, columns: _Columns) -> PerfRow | None:
    """One data row cut at the report's column positions, or None if it is not one."""
    if _ROW.fullmatch(line) is None:
        return None
    cells = {name: line[start:end].strip() for name, start, end in columns}
    pct = _pct(cells.get("self", cells.get("overhead", "")))
    if pct is None:
        return None
    children = _pct(cells["children"]) if "children" in cells else None
    symbol, kernel = cells.get("symbol"), False
    if symbol is not None and (m := re.match(r"\[(.)\]\s*", symbol)) is not None:
        symbol, kernel = symbol[m.end():], m[1] == "k"
    return PerfRow(pct, cells.get("shared object") or None, symbol, kernel, children)


_MODIFIERS = re.compile(r"[ukhIGHpPSDWe]{1,6}")


def is_tracepoint(event: str) -> bool:
    """True for ``subsystem:name`` tracepoints and ``probe:...`` probes, whose every hit perf records;
    False for sampling events (``cpu-clock``, ``cycles:u``, ``cpu-clock:pppH``, ``cpu/event=0x3c/``)."""
    sub, sep, name = event.partition(":")
    if not sep or not sub or not name or "/" in sub:
        return False
    return not _MODIFIERS.fullmatch(name.rstrip(":"))


def perf_report_events(text: str) -> list[str]:
    """The events of a ``perf report --stdio`` text, one per section, in order."""
    return [m[3] for line in text.splitlines() if (m := _SAMPLES.match(line)) is not None]


def parse_perf_report(text: str, *, sampling: bool = False) -> PerfReport:
    """Rows and header figures of ``perf report --stdio`` output.

    Rows are cut at the column positions of perf's dotted header line, so
    any ``--sort`` works (``dso``, ``dso,sym``, ``comm,dso,sym`` ...), with
    or without a Children column; without that line they are split on
    whitespace. With several events only the first event's section is
    read; with ``sampling`` the first section of a sampling event (never a
    tracepoint's, whose rows count hits, not CPU time). Text without any of
    it gives an empty report.
    """
    rows: list[PerfRow] = []
    samples = event = count = lost = None
    columns: _Columns | None = None
    previous = ""
    skipping = False
    for line in text.splitlines():
        if (m := _SAMPLES.match(line)) is not None:
            if samples is not None:
                break
            skipping = sampling and is_tracepoint(m[3])
            if not skipping:
                samples, event = int(m[1]) * _UNITS[m[2]], m[3]
        elif skipping:
            pass
        elif (m := _EVENT_COUNT.match(line)) is not None:
            count = count if count is not None else int(m[1])
        elif (m := _LOST.match(line)) is not None:
            lost = lost if lost is not None else int(m[1])
        elif re.fullmatch(r"#[ .]*\.[ .]*", line.rstrip()) and previous.startswith("#"):
            columns = _columns(previous, line)
        elif not line.startswith("#"):
            row = _column_row(line, columns) if columns else _perf_row(line)
            rows += [row] if row is not None else []
        previous = line
    return PerfReport(tuple(rows), samples, event, count, lost)


def dso_shares(report: PerfReport) -> dict[str, float]:
    """Percent of samples per dso (``[kernel.kallsyms]``, ``[8139cp]``, ``libc.so.6`` ...).

    Sums the rows of each dso, so a ``--sort dso,sym`` report cut by
    ``--percent-limit`` gives lower bounds. Rows without a dso are left out.
    """
    out: dict[str, float] = {}
    for row in report.rows:
        if row.dso is not None:
            out[row.dso] = round(out.get(row.dso, 0.0) + row.pct, 6)
    return out


_RECORD_SAMPLES = re.compile(r"\[ perf record: Captured and wrote .*\((\d+) samples\) \]")
_RECORD_LOST = re.compile(r"Processed (\d+) events and lost (\d+) chunks")


def parse_perf_record_log(text: str) -> dict[str, int]:
    """``perf record``'s stderr: ``samples`` (exact) and ``lost_chunks`` when printed.

    perf prints ``Processed N events and lost M chunks!`` when its ring
    buffer overflowed. Keys are absent when their line is.
    """
    out: dict[str, int] = {}
    if (m := _RECORD_SAMPLES.search(text)) is not None:
        out["samples"] = int(m[1])
    if (m := _RECORD_LOST.search(text)) is not None:
        out["events"], out["lost_chunks"] = int(m[1]), int(m[2])
    return out


# --------------------------------------------------------------------------- perf stat


def parse_perf_stat_csv(text: str) -> dict[str, float]:
    """``perf stat -x,`` output as ``{"cpu-clock": 2137.28, "context-switches": 46.0}``.

    Fields are value, unit, event, run time, percent enabled, metric,
    metric unit. Comment and blank lines are skipped, and so are events
    perf marks ``<not counted>`` or ``<not supported>``. Per-CPU output
    (``-A``, first field ``CPU0``) is summed per event.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split(",")
        if line.startswith("#") or len(fields) < 3:
            continue
        if fields[0].startswith("CPU") and len(fields) >= 4:
            fields = fields[1:]
        value = _float(fields[0])
        event = fields[2].strip()
        if value is not None and event:
            out[event] = out.get(event, 0.0) + value
    return out


# --------------------------------------------------------------------------- mpstat

_MPSTAT_ALL = re.compile(r'\{"cpu":\s*"all"[^}]*?"idle":\s*(-?\d+(?:\.\d+)?)')


def _mpstat_idles(data: Any) -> list[float]:
    """The ``idle`` of every ``cpu: all`` entry in mpstat's JSON document."""
    idles: list[float] = []
    try:
        hosts = data["sysstat"]["hosts"]
        for host in hosts:
            for stat in host.get("statistics", []):
                idles += [float(c["idle"]) for c in stat.get("cpu-load", []) if c.get("cpu") == "all"]
    except (KeyError, TypeError, ValueError, AttributeError):
        return []
    return idles


def parse_mpstat_json(text: str) -> float | None:
    """Average CPU load in percent (100 - idle of cpu ``all``) over all samples.

    sysstat 12.6 writes no Average entry in JSON, so this is the mean of
    the per-interval samples. Truncated JSON (mpstat killed early) is read
    line by line for the complete ``"cpu": "all"`` entries. None when
    there is no sample.
    """
    try:
        idles = _mpstat_idles(json.loads(text))
    except ValueError:
        idles = [float(m[1]) for m in _MPSTAT_ALL.finditer(text)]
    if not idles:
        return None
    return round(100.0 - sum(idles) / len(idles), 4)


# --------------------------------------------------------------------------- throughput


@dataclass(frozen=True)
class Throughput:
    """What a transfer tool measured.

    ``receiver_bps``/``sender_bps`` are bits per second (None when the tool
    does not tell); ``bytes`` and ``seconds`` are the receiver's when known.
    ``reverse`` is iperf3's ``-R`` (the client received).
    """

    tool: str
    receiver_bps: float | None
    sender_bps: float | None
    bytes: int | None = None
    seconds: float | None = None
    reverse: bool = False
    protocol: str | None = None

    @property
    def bps(self) -> float | None:
        """The receiver's rate, else the sender's."""
        return self.receiver_bps if self.receiver_bps is not None else self.sender_bps


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (leading non-JSON text skipped), or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _num(section: Any, key: str) -> float | None:
    """``section[key]`` as a float, or None."""
    value = section.get(key) if isinstance(section, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_iperf3_json(text: str) -> Throughput | None:
    """Rates from ``iperf3 -J`` output: ``end.sum_received`` and ``end.sum_sent``.

    Both sums describe the same stream whichever side sent, so ``-R`` only
    sets ``reverse``. UDP tests carry the same sums (older iperf3 only
    ``end.sum``, used as the sender's). None for non-JSON text, a run that
    ended in ``"error"`` or one without any rate.
    """
    doc = _json_object(text)
    if doc is None or "error" in doc or not isinstance(doc.get("end"), dict):
        return None
    end = doc["end"]
    received, sent = end.get("sum_received"), end.get("sum_sent", end.get("sum"))
    rx, tx = _num(received, "bits_per_second"), _num(sent, "bits_per_second")
    if rx is None and tx is None:
        return None
    start = doc.get("start", {}).get("test_start", {}) if isinstance(doc.get("start"), dict) else {}
    nbytes = _num(received, "bytes") if rx is not None else _num(sent, "bytes")
    seconds = _num(received, "seconds") if rx is not None else _num(sent, "seconds")
    return Throughput("iperf3", rx, tx, int(nbytes) if nbytes is not None else None, seconds,
                      bool(start.get("reverse", 0)), start.get("protocol"))


def iperf3_error(text: str) -> str | None:
    """The ``"error"`` an ``iperf3 -J`` run ended with, or None.

    iperf3 3.12 exits 0 after some of its errors (a lost UDP set-up datagram,
    esnet/iperf#862), so its JSON is the only place that says the test failed.
    """
    doc = _json_object(text)
    error = doc.get("error") if doc is not None and isinstance(doc.get("start"), dict) else None
    return str(error) if error else None


_WGET_DONE = re.compile(r"\((\d+(?:\.\d+)?) ([KMG]?)(B|b)/s\) - .*? saved \[(\d+)(?:/(\d+))?\]")


def parse_wget(stderr_text: str) -> Throughput | None:
    """Bytes and rate from wget's final ``(18.5 MB/s) - '/dev/null' saved [N/N]`` line.

    wget prints bytes per second in powers of 1024 (``KB/s``, ``MB/s``) and,
    with ``--report-speed=bits``, bits in powers of 1000 (``Mb/s``). The rate
    has three significant digits; ``seconds`` is derived from it. With
    several downloads the last one counts. None without a saved line
    (e.g. ``Connection refused``).
    """
    matches = list(_WGET_DONE.finditer(stderr_text))
    if not matches:
        return None
    m = matches[-1]
    bits = m[3] == "b"
    scale = (1000 if bits else 1024) ** "_KMG".index(m[2] or "_")
    bps = float(m[1]) * scale * (1 if bits else 8)
    nbytes = int(m[4])
    return Throughput("wget", bps, None, nbytes, nbytes * 8 / bps if bps else None, protocol="TCP")


# --------------------------------------------------------------------------- ftrace


_STAT_KEYS = {"entries", "overrun", "commit overrun", "bytes", "dropped events", "read events"}


class TraceCmdStat(TypedDict):
    """``trace-cmd report --stat``'s ring buffers (:func:`parse_trace_cmd_stat`): per CPU and in all."""

    per_cpu: dict[str, dict[str, int]]  # CPU -> entries, overrun, commit_overrun, bytes, dropped_events, read_events
    commit_overrun: int
    dropped_events: int
    entries: int
    overrun: int
    read_events: int
    cpus: NotRequired[int]  # the cpus=N line's


def parse_trace_cmd_stat(text: str) -> TraceCmdStat:
    """Per-CPU ring-buffer statistics from ``trace-cmd report --stat`` (or ``record``'s output).

    Returns ``{"per_cpu": {"0": {"entries": 0, "overrun": 17414, "commit_overrun": 0,
    "bytes": 0, "dropped_events": 0, "read_events": 47114}, ...}, "entries": ..,
    "overrun": .., "commit_overrun": .., "dropped_events": .., "read_events": ..}``
    with totals over all CPUs, and ``"cpus"`` from the ``cpus=N`` line when
    present. ``overrun`` counts events overwritten before they were read,
    ``dropped_events`` events refused by a full buffer. Text without a
    ``CPU: N`` block gives ``{"per_cpu": {}}`` and zero totals.
    """
    per_cpu: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    cpus: int | None = None
    for line in text.splitlines():
        key, sep, value = (part.strip() for part in line.partition(":"))
        if (m := re.fullmatch(r"cpus=(\d+)", line.strip())) is not None:
            cpus = int(m[1])
        elif sep and key == "CPU" and value.isdigit():
            current = per_cpu.setdefault(value, {})
        elif sep and current is not None and key in _STAT_KEYS and value.isdigit():
            current[key.replace(" ", "_")] = int(value)
    def total(key: str) -> int:
        return sum(c.get(key, 0) for c in per_cpu.values())

    out: TraceCmdStat = {"per_cpu": per_cpu, "commit_overrun": total("commit_overrun"),
                         "dropped_events": total("dropped_events"), "entries": total("entries"),
                         "overrun": total("overrun"), "read_events": total("read_events")}
    if cpus is not None:
        out["cpus"] = cpus
    return out


def parse_kprobe_profile(text: str) -> dict[str, dict[str, int]]:
    """``/sys/kernel/tracing/kprobe_profile`` as ``{"cpxmit": {"hits": 7300, "misses": 0}}``.

    Each line is ``name hits misses``; misses count kretprobe instances
    lost to ``maxactive`` and probes skipped while another kprobe ran.
    Other lines are skipped.
    """
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
            out[fields[0]] = {"hits": int(fields[1]), "misses": int(fields[2])}
    return out
