"""A step's ``trace:`` section, guest by guest: what to trace there (:class:`TraceSpec`), checked with
every problem's line (:class:`TraceParser`), and its templates filled in for a matrix row
(:func:`render_trace`). The tracers themselves are :mod:`labctl.steps.tracers`'.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.lab.checker import Checker, close_match
from labctl.lab.netopts import trace_capture
from labctl.lab.specs import GuestSpec
from labctl.lab.templates import render, yaml_bool, yaml_strings
from labctl.lab.trust import named_path_reason, read_capped
from labctl.lab.yamlpos import YamlMap

_TRACE_KEYS = ("perf_record", "perf_stat", "ftrace", "kprobes", "mpstat", "skb_latency", "stats", "capture", "bpftrace")
_BPFTRACE_KEYS = ("script", "file")
MAX_SCRIPT = 64 * 1024
_SKB_LATENCY_KEYS = ("buffer_kb",)
_PERF_RECORD_KEYS = ("events", "call_graph", "frequency", "target")
_PERF_STAT_KEYS = ("events",)
_FTRACE_KEYS = ("events", "tracer", "functions", "filter", "buffer_kb")
_MPSTAT_KEYS = ("interval",)
_EVENT = re.compile(r"[A-Za-z0-9_:.*/=,{}-]{1,128}")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")
# An ftrace filter expression (trace-cmd -f): fields, numbers, strings, comparisons, && || ( ).
_FILTER = re.compile(r"[A-Za-z0-9_ .:<>=!&|()'\"*~/-]{1,512}")
TRACERS = ("function", "function_graph", "nop")
TARGETS = ("system", "command")


@dataclass(frozen=True)
class PerfRecord:
    events: tuple[str, ...] = ("cpu-clock",)
    call_graph: bool = False
    frequency: int | None = None
    target: str = "system"


@dataclass(frozen=True)
class Ftrace:
    events: tuple[str, ...] = ()
    tracer: str | None = None
    functions: tuple[str, ...] = ()
    filter: str | None = None
    buffer_kb: int | None = None


@dataclass(frozen=True)
class SkbLatency:
    buffer_kb: int | None = None  # trace-cmd's per-CPU buffer (default skbprobes.DEFAULT_BUFFER_KB)


@dataclass(frozen=True)
class Bpftrace:
    """A bpftrace program run in the guest for the step: its text (from ``script:``, or read from ``file:``,
    a file of the user's or root's), and where it came from."""

    script: str
    source: str | None = None  # the file it was read from


@dataclass(frozen=True)
class TraceSpec:
    """What to trace on one guest during a step."""

    perf_record: PerfRecord | None = None
    perf_stat: tuple[str, ...] | None = None
    ftrace: Ftrace | None = None
    kprobes: tuple[str, ...] = ()
    mpstat: float | None = None  # sampling interval in seconds
    stats: bool = True
    skb_latency: SkbLatency | None = None
    capture: tuple[str, ...] = ()  # NIC names whose traffic goes into the bundle as pcapng
    bpftrace: Bpftrace | None = None


def check_filter(value: str) -> str:
    """An ftrace filter expression as filled in, checked.

    :raise ValueError: for characters a filter never needs (control characters, ``;``, ``$``, backquotes...).
    """
    if not _FILTER.fullmatch(value):
        raise ValueError(f"invalid ftrace filter '{value}' (fields, values, comparisons, && || and parentheses)")
    return value


def render_trace(spec: TraceSpec, row: dict[str, str], addresses: dict[str, str]) -> TraceSpec:
    """``spec`` with its templates (the ftrace filter) filled in from ``row``, checked again.

    :raise ValueError: when a filled-in value is not allowed.
    """
    if spec.ftrace is None or spec.ftrace.filter is None:
        return spec
    filt = check_filter(render(spec.ftrace.filter, row, addresses, quote=False))
    return dataclasses.replace(spec, ftrace=dataclasses.replace(spec.ftrace, filter=filt))


@dataclass
class TraceParser:
    """Checks a step's ``trace`` with the lab checker; ``templates(text, line, path)`` reports unknown
    variables, ``each_row(text, check, line, path)`` checks a template as every matrix row fills it in."""

    check: Checker
    guests: dict[str, GuestSpec]
    templates: Callable[[str, int, str], None]
    each_row: Callable[[str, Any, int, str], bool]
    trusted: tuple[Path, ...] = ()  # --trust-dir: a bpftrace file: may be under these

    def parse(self, m: YamlMap, path: str) -> dict[str, TraceSpec]:
        return self._traces(m, path)

    def _traces(self, m: YamlMap, path: str) -> dict[str, TraceSpec]:
        c = self.check
        if "trace" not in m:
            return {}
        tm = c.mapping(m["trace"], m.value_line("trace"), f"{path}.trace")
        out: dict[str, TraceSpec] = {}
        if tm is None:
            return out
        for guest in tm:
            gpath = f"{path}.trace.{guest}"
            if guest not in self.guests:
                c.add(tm.key_line(guest), gpath, f"unknown guest '{guest}'{close_match(str(guest), self.guests)}")
                continue
            body = c.mapping(tm[guest], tm.value_line(guest), gpath)
            if body is not None:
                out[str(guest)] = self._trace(body, gpath, self.guests[str(guest)])
        return out

    def _section(self, body: YamlMap, key: str, path: str, keys: tuple[str, ...]) -> YamlMap | None:
        """A tracer section: ``true``/``{}`` -> defaults, ``false``/absent -> None."""
        value = body.get(key)
        if value is None or value is False:
            return None
        if value is True:
            return YamlMap(body.value_line(key))
        sec = self.check.mapping(value, body.value_line(key), f"{path}.{key}")
        if sec is not None:
            self.check.keys(sec, f"{path}.{key}", keys)
        return sec

    def _trace(self, body: YamlMap, path: str, guest: GuestSpec) -> TraceSpec:
        c = self.check
        c.keys(body, path, _TRACE_KEYS)
        pr = self._section(body, "perf_record", path, _PERF_RECORD_KEYS)
        perf_record = None
        if pr is not None:
            ppath = f"{path}.perf_record"
            events = yaml_strings(self.check, pr, "events", ppath, _EVENT, "perf event") or ("cpu-clock",)
            target = c.string(pr, "target", ppath) or "system"
            if target not in TARGETS:
                c.add(pr.value_line("target"), f"{ppath}.target", f"target must be one of {', '.join(TARGETS)}")
            perf_record = PerfRecord(events, yaml_bool(self.check, pr, "call_graph", ppath, False),
                                     c.integer(pr, "frequency", ppath, (1, 100000)), target)
        ps = self._section(body, "perf_stat", path, _PERF_STAT_KEYS)
        perf_stat = None
        if ps is not None:
            perf_stat = yaml_strings(self.check, ps, "events", f"{path}.perf_stat", _EVENT, "perf event") or (
                "cpu-clock", "context-switches", "irq:softirq_entry")
        ft = self._section(body, "ftrace", path, _FTRACE_KEYS)
        ftrace = None
        if ft is not None:
            fpath = f"{path}.ftrace"
            tracer = c.string(ft, "tracer", fpath)
            if tracer is not None and tracer not in TRACERS:
                c.add(ft.value_line("tracer"), f"{fpath}.tracer", f"tracer must be one of {', '.join(TRACERS)}")
            filt = c.string(ft, "filter", fpath)
            if filt is not None:
                self.templates(filt, ft.value_line("filter"), f"{fpath}.filter")
                if not self.each_row(filt, check_filter, ft.value_line("filter"), f"{fpath}.filter"):
                    filt = None
            ftrace = Ftrace(yaml_strings(self.check, ft, "events", fpath, _EVENT, "trace event"), tracer,
                            yaml_strings(self.check, ft, "functions", fpath, _SYMBOL, "function"), filt,
                            c.integer(ft, "buffer_kb", fpath, (64, 1048576)))
            if not ftrace.events and not ftrace.tracer:
                c.add(ft.line, fpath, "ftrace needs events or a tracer")
        mp = self._section(body, "mpstat", path, _MPSTAT_KEYS)
        mpstat = None if mp is None else float(c.integer(mp, "interval", f"{path}.mpstat", (1, 60)) or 1)
        sl = self._section(body, "skb_latency", path, _SKB_LATENCY_KEYS)
        skb = None
        if sl is not None:
            skb = SkbLatency(c.integer(sl, "buffer_kb", f"{path}.skb_latency", (64, 1048576)))
            if ftrace is not None:
                c.add(body.key_line("skb_latency"), f"{path}.skb_latency",
                      "skb_latency records with ftrace itself: trace ftrace events in another step")
        return TraceSpec(perf_record, perf_stat, ftrace, yaml_strings(self.check, body, "kprobes", path, _SYMBOL, "function"),
                         mpstat, yaml_bool(self.check, body, "stats", path, True), skb, trace_capture(c, body, path, guest),
                         self._bpftrace(body, path))

    def _bpftrace(self, body: YamlMap, path: str) -> Bpftrace | None:
        """``bpftrace: {script: TEXT}`` or ``{file: PATH}`` (relative to the lab file; the user's or root's)."""
        sec = self._section(body, "bpftrace", path, _BPFTRACE_KEYS)
        if sec is None:
            return None
        where = f"{path}.bpftrace"
        script, name = self.check.string(sec, "script", where), self.check.string(sec, "file", where)
        if (script is None) == (name is None):
            self.check.add(sec.line, where, "give the program as script: or file:, one of them")
            return None
        if name is not None:
            return self._script_file(name, sec.value_line("file"), f"{where}.file")
        assert script is not None
        if len(script.encode()) > MAX_SCRIPT or "\0" in script:
            self.check.add(sec.value_line("script"), f"{where}.script", f"a program of at most {MAX_SCRIPT} bytes of text")
            return None
        return Bpftrace(script)

    def _script_file(self, name: str, line: int, where: str) -> Bpftrace | None:
        c = self.check
        f = (Path(c.file).parent / os.path.expanduser(name)).resolve()
        why = named_path_reason(f, self.trusted, c.owner, c.remote, c.remote_root)
        if why is not None:
            c.add(line, where, f"bpftrace file {f} is not trusted: {why}" +
                  ("" if c.remote else "; pass --trust-dir if you trust it"))
            return None
        try:
            data = read_capped(f, MAX_SCRIPT)  # never read further than the cap
            text = "" if len(data) > MAX_SCRIPT else data.decode()
        except (OSError, UnicodeDecodeError) as exc:
            c.add(line, where, f"cannot read {f}: {getattr(exc, 'strerror', None) or exc}")
            return None
        if len(data) > MAX_SCRIPT or "\0" in text:
            c.add(line, where, f"{f}: a program of at most {MAX_SCRIPT} bytes of text")
            return None
        return Bpftrace(text, str(f))
