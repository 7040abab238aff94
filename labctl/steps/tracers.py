"""The trace kinds a guest's ``trace:`` may ask for (:data:`TRACE_KINDS`, each a registered object),
and the shell commands that start, stop and post-process their tracers inside a guest.

Pure functions from a :class:`~labctl.lab.tracespec.TraceSpec` to command
lines; every value is shell-quoted. A tracer runs in the background with its
pid in ``NAME.pid`` and its messages in ``NAME.log`` in the step's guest
directory, and is stopped with SIGINT (perf and trace-cmd then write their
files out cleanly).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
from dataclasses import dataclass

import labctl.steps.skbprobes as skbprobes  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.lab import TraceSpec

q = shlex.quote


# How long a tracer may take to start recording. perf record -a takes about
# 4 s under TCG on an idle guest (it reads every process's maps first); bpftrace 0.17 typing a
# program by a 6.12 kernel's BTF took 39 s on a busy host and 78 s on a very busy one. A tracer that
# exits is noticed at once (the wait watches its pid), so only a tracer that hangs waits this long.
READY_TIMEOUT = 300
TRACEFS = "/sys/kernel/tracing"


@dataclass(frozen=True)
class Tracer:
    """One background tracer of a step.

    ``signal`` is how :func:`ready` tells that it records: ``control`` (perf,
    started with its events disabled and enabled through its control FIFO,
    which acknowledges once they are on), ``banner`` (trace-cmd, which prints
    "Hit Ctrl^C to stop recording" once tracing is on), ``attached`` (bpftrace, whose JSON
    output says ``attached_probes`` once its probes are in), or "" (starts at once).
    """

    name: str  # perf-record, perf-stat, trace-cmd, skb-latency, mpstat
    tool: str  # binary that must exist in the guest
    argv: list[str]
    stdout: str = ""  # file for its standard output (default NAME.log, with stderr)
    signal: str = ""  # control | banner | attached | ""


def kprobe_events(spec: TraceSpec) -> list[str]:
    return [f"probe:{fn}" for fn in spec.kprobes]


class TraceKind:
    """One kind of tracer a guest's ``trace:`` may ask for: the background tracers it starts, the
    guest commands that turn its output into text once stopped, the probes it leaves to remove.
    :data:`TRACE_KINDS` lists them in order; a new one (say ``follow``, packet journeys) is a class
    here and a report section (:mod:`labctl.report`) for what it leaves."""

    name = ""

    def tracers(self, spec: TraceSpec) -> list[Tracer]:
        return []

    def postprocess(self, spec: TraceSpec) -> list[str]:
        return []

    def cleanup(self, spec: TraceSpec) -> list[str]:
        return []


class PerfRecordKind(TraceKind):
    """``perf_record``: samples (system-wide, or the step's first command), reports and stacks in the guest."""

    name = "perf_record"

    def tracers(self, spec: TraceSpec) -> list[Tracer]:
        pr = spec.perf_record
        if pr is None or pr.target != "system":
            return []
        return [Tracer("perf-record", "perf", perf_record_argv(spec, system=True) + _perf_control("perf-record"),
                       signal="control")]

    def postprocess(self, spec: TraceSpec) -> list[str]:
        return _perf_reports(spec) if spec.perf_record is not None else []


class PerfStatKind(TraceKind):
    """``perf_stat``: event counts over the step."""

    name = "perf_stat"

    def tracers(self, spec: TraceSpec) -> list[Tracer]:
        if spec.perf_stat is None:
            return []
        argv = ["perf", "stat", "-a", "-x,", "-o", "perf-stat.txt"]
        for ev in spec.perf_stat:
            argv += ["-e", ev]
        return [Tracer("perf-stat", "perf", argv + _perf_control("perf-stat"), signal="control")]


class FtraceKind(TraceKind):
    """``ftrace``: trace-cmd's recording (events, a tracer and its functions, kprobes as events)."""

    name = "ftrace"

    def tracers(self, spec: TraceSpec) -> list[Tracer]:
        ft = spec.ftrace
        if ft is None:
            return []
        argv = ["trace-cmd", "record", "-o", "trace.dat"]
        if ft.buffer_kb:
            argv += ["-b", str(ft.buffer_kb)]
        if ft.tracer:
            argv += ["-p", ft.tracer]
            for fn in ft.functions:
                argv += ["-g" if ft.tracer == "function_graph" else "-l", fn]
        for ev in ft.events:
            argv += ["-e", ev]
            if ft.filter:
                argv += ["-f", ft.filter]
        for ev in kprobe_events(spec):
            argv += ["-e", ev]
        return [Tracer("trace-cmd", "trace-cmd", argv, signal="banner")]

    def postprocess(self, spec: TraceSpec) -> list[str]:
        if spec.ftrace is None:
            return []
        return ["[ -s trace.dat ] && trace-cmd report -i trace.dat > trace-report.txt 2> trace-report.err",
                "[ -s trace.dat ] && trace-cmd report -i trace.dat --stat > trace-stat.txt 2>> trace-report.err"]


class KprobesKind(TraceKind):
    """``kprobes``: perf probes on kernel functions, their hit and miss counts."""

    name = "kprobes"

    def postprocess(self, spec: TraceSpec) -> list[str]:
        return ["cat /sys/kernel/tracing/kprobe_profile > kprobe_profile.txt 2>/dev/null"] if spec.kprobes else []

    def cleanup(self, spec: TraceSpec) -> list[str]:
        return ["perf probe -q -d 'probe:*' 2>/dev/null; true"] if spec.kprobes else []


class SkbLatencyKind(TraceKind):
    """``skb_latency``: per-packet stage latency (:mod:`labctl.steps.skbprobes`)."""

    name = "skb_latency"

    def tracers(self, spec: TraceSpec) -> list[Tracer]:
        if spec.skb_latency is None:
            return []
        return [Tracer("skb-latency", "trace-cmd", skbprobes.record_argv(spec.skb_latency.buffer_kb), signal="banner")]

    def postprocess(self, spec: TraceSpec) -> list[str]:
        return [skbprobes.postprocess_command()] if spec.skb_latency is not None else []

    def cleanup(self, spec: TraceSpec) -> list[str]:
        return [skbprobes.remove_command()] if spec.skb_latency is not None else []


class BpftraceKind(TraceKind):
    """``bpftrace``: the step's own eBPF program; its output (maps and histograms printed when it stops) as
    JSON lines in ``bpftrace.json`` (:mod:`labctl.trace.bpfmaps` reads them)."""

    name = "bpftrace"

    def tracers(self, spec: TraceSpec) -> list[Tracer]:
        if spec.bpftrace is None:
            return []
        b64 = base64.b64encode(spec.bpftrace.script.encode()).decode()
        write = f"echo {b64} | base64 -d > bpftrace.bt && exec bpftrace -f json bpftrace.bt"
        return [Tracer("bpftrace", "bpftrace", ["sh", "-c", write], "bpftrace.json", signal="attached")]


class MpstatKind(TraceKind):
    """``mpstat``: CPU load, per CPU, every interval."""

    name = "mpstat"

    def tracers(self, spec: TraceSpec) -> list[Tracer]:
        if spec.mpstat is None:
            return []
        return [Tracer("mpstat", "mpstat", ["mpstat", "-P", "ALL", "-o", "JSON", str(int(spec.mpstat))], "mpstat.json")]


TRACE_KINDS: tuple[TraceKind, ...] = (PerfRecordKind(), PerfStatKind(), FtraceKind(), KprobesKind(), SkbLatencyKind(),
                                      BpftraceKind(), MpstatKind())
"""The trace kinds, in the order their tracers start and their output is post-processed."""


def tracers(spec: TraceSpec) -> list[Tracer]:
    """The background tracers of one guest's trace spec (system-wide ones)."""
    return [t for kind in TRACE_KINDS for t in kind.tracers(spec)]


def perf_record_argv(spec: TraceSpec, system: bool) -> list[str]:
    pr = spec.perf_record
    assert pr is not None
    argv = ["perf", "record", "-o", "perf.data"]  # its stderr (perf-record.log) has the exact counts
    if system:
        argv.append("-a")
    if pr.call_graph:
        argv.append("-g")
    if pr.frequency:
        argv += ["-F", str(pr.frequency)]
    for ev in (*pr.events, *kprobe_events(spec)):
        argv += ["-e", ev]
    return argv


#: Linux puts build ids in mmap events from 5.12 on; perf 6.1 asks for them and fails on an older kernel.
BUILD_IDS_IN_MMAP = (5, 12)


def with_build_ids(argv: list[str], release: str) -> list[str]:
    """A ``perf record`` command line with ``--buildid-mmap`` where the kernel of ``release`` (the
    guest's, or the host's) supports it, else unchanged: the build ids then ride in the mmap events,
    so perf has no pass over the samples to make when it stops (1.6 s to 0.55 s after a 3 s iperf3
    under a call-graph recording in a TCG guest, measured). Any other command line is returned as it is."""
    m = re.match(r"(\d+)\.(\d+)", release)
    if (len(argv) < 2 or os.path.basename(argv[0]) != "perf" or argv[1] != "record" or m is None
            or (int(m[1]), int(m[2])) < BUILD_IDS_IN_MMAP):
        return argv
    return [*argv[:2], "--buildid-mmap", *argv[2:]]


def _perf_control(name: str) -> list[str]:
    """perf options: start with the events off, take commands on NAME.ctl, answer on NAME.ack."""
    return ["-D", "-1", "--control", f"fifo:{name}.ctl,{name}.ack"]


def _fifos(tracer: Tracer) -> list[str]:
    return [tracer.name + ".ctl", tracer.name + ".ack"] if tracer.signal == "control" else []


def start(workdir: str, tracer: Tracer) -> str:
    """Start ``tracer`` in the background in ``workdir``; its pid goes to NAME.pid."""
    # trace-cmd's banner goes to stdout: line-buffered, so it is there as soon as printed
    inner = "exec " + shlex.join((["stdbuf", "-oL"] if tracer.signal in ("banner", "attached") else []) + tracer.argv)
    log = q(tracer.name + ".log")
    redirect = f"> {q(tracer.stdout)} 2> {log}" if tracer.stdout else f"> {log} 2>&1"
    fifos = _fifos(tracer)
    mkfifo = f"rm -f {shlex.join(fifos)} && mkfifo -m 600 {shlex.join(fifos)} && " if fifos else ""
    return (f"cd {q(workdir)} && {mkfifo}(setsid sh -c {q(inner)} {redirect} < /dev/null & "
            f"echo $! > {q(tracer.name + '.pid')})")


def ready(workdir: str, tracer: Tracer, timeout: int = READY_TIMEOUT) -> str | None:
    """A command that returns (status 0) once ``tracer`` records, or fails
    after ``timeout`` s; None for a tracer that records from its start."""
    alive = f"kill -0 \"$(cat {q(tracer.name + '.pid')})\" 2>/dev/null"
    if tracer.signal == "control":
        ctl, ack = _fifos(tracer)
        # Hold the ack FIFO open read-write (perf's write-only open of it then
        # returns), wait until perf has it open (it opened ctl just before),
        # say "enable", and read the ack perf writes once its events are on.
        wait = (f"exec 3<> {q(ack)}; "
                f"until find /proc/$(cat {q(tracer.name + '.pid')})/fd -lname {q('*/' + ack)} 2>/dev/null | grep -q .; do "
                f"{alive} || exit 1; sleep 0.1; done; "
                f"echo enable > {q(ctl)}; "
                f"while {alive}; do read -r -t 1 answer <&3 && {{ [ \"$answer\" = ack ]; exit; }}; done; exit 1")
    elif tracer.signal == "attached":
        wait = (f"until grep -q attached_probes {q(tracer.stdout)} 2>/dev/null; do "
                f"{alive} || exit 1; sleep 0.1; done")
    elif tracer.signal == "banner":
        wait = (f"until grep -q '^Hit Ctrl^C' {q(tracer.name + '.log')}; do "
                f"{alive} || exit 1; sleep 0.1; done")
    else:
        return None
    return f"cd {q(workdir)} && timeout {int(timeout)} bash -c {q(wait)}"


def stop(workdir: str, names: list[str], timeout: int = 120, flush: tuple[str, ...] = ()) -> str:
    """SIGINT each named background process, then wait (up to ``timeout`` s) for them to exit; the
    trace-cmd recordings named in ``flush`` first get the events still in the kernel's buffer
    (:func:`flush_command`) just before they are stopped, after the others: each tracer's recording
    ends when it did before, after the ones named before it (perf before trace-cmd). They are told
    all at once and then waited for: a perf takes about half a second to write its file out under
    TCG, which each later tracer used to wait for."""
    parts = [f"cd {q(workdir)}"]
    for name in [n for n in names if n not in flush] + [n for n in names if n in flush]:
        pidf = q(name + ".pid")
        if name in flush:
            parts.append(flush_command(name))
        parts.append(f"[ -f {pidf} ] && kill -INT \"$(cat {pidf})\" 2>/dev/null")
    for name in names:
        pidf = q(name + ".pid")
        parts.append(
            f"if [ -f {pidf} ]; then p=$(cat {pidf}); i=0; "
            f"while kill -0 $p 2>/dev/null && [ $i -lt {timeout * 5} ]; do sleep 0.2; i=$((i+1)); done; "
            f"kill -KILL $p 2>/dev/null; fi; rm -f {q(name + '.ctl')} {q(name + '.ack')}")
    return "; ".join(parts) + "; true"


def flush_command(name: str, rounds: int = 25) -> str:
    """Shell: tracing off, then the trace-cmd recording ``name`` takes what is left in the buffer.

    trace-cmd 3.1 (Debian 12) moves whole pages while it records and the last, partial page of each
    CPU when it stops; under load that last read sometimes fails (its log says ``0 bytes in size``)
    and trace-cmd then clears the buffer: a short step lost every event. So the events stop first
    (``tracing_on``: the step's work is over), and each recorder is told (SIGUSR2, trace-cmd's own
    "flush" signal to its per-CPU recorders) to write what the buffer holds, until the kernel's
    per-CPU ``entries`` say nothing is left (at most ``rounds`` tries, 0.2 s apart).
    """
    pid = q(name + ".pid")
    left = f"cat {TRACEFS}/per_cpu/cpu*/stats 2>/dev/null | awk '/^entries:/ {{n += $2}} END {{exit n == 0}}'"
    return (f"if [ -f {pid} ]; then echo 0 > {TRACEFS}/tracing_on; i=0; "
            f"while [ $i -lt {int(rounds)} ] && {left}; do pkill -USR2 -P \"$(cat {pid})\" 2>/dev/null; "
            "sleep 0.2; i=$((i+1)); done; fi")


def add_kprobes(spec: TraceSpec) -> str | None:
    if not spec.kprobes:
        return None
    return "; ".join(f"perf probe -q -a {q(fn)}" for fn in spec.kprobes)


def remove_kprobes(spec: TraceSpec) -> str | None:
    """The commands that remove what the trace kinds left in the kernel (probes), or None."""
    return "; ".join(c for kind in TRACE_KINDS for c in kind.cleanup(spec)) or None


def _perf_reports(spec: TraceSpec) -> list[str]:
    """perf_record's reports and stacks, as text, in the guest (symbols resolve there)."""
    assert spec.perf_record is not None
    ks = "--kallsyms kallsyms.txt"
    # With call graphs, the tables stay flat (self time); the stacks go to the flame graphs.
    flat = " --no-children -g none" if spec.perf_record.call_graph else ""
    cmds = [
        (f"[ -s perf.data ] && perf report -i perf.data {ks}{flat} --stdio --sort dso,sym --percent-limit 0.1 "
         "> perf-report.txt 2> perf-report.err"),
        (f"[ -s perf.data ] && perf report -i perf.data {ks}{flat} --stdio --sort dso > perf-report-dso.txt "
         "2>> perf-report.err"),
        "[ -s perf.data ] && perf report -i perf.data --header-only > perf-report-header.txt 2>> perf-report.err",
    ]
    if any(":" in ev for ev in (*spec.perf_record.events, *kprobe_events(spec))):
        cmds += [(f"[ -s perf.data ] && perf report -i perf.data {ks}{flat} --stdio --sort comm "
                  "> perf-report-events.txt 2>> perf-report.err"),
                 ("[ -s perf.data ] && perf script -i perf.data 2>> perf-report.err | head -n 20000 "
                  "> perf-script.txt"),
                 # every hit counted, per command and CPU (labctl.trace.tpcounts)
                 ("[ -s perf.data ] && perf script -i perf.data -F comm,cpu,event 2>> perf-report.err "
                  "| sort | uniq -c > perf-event-counts.txt")]
    if spec.perf_record.call_graph:  # the stacks of every sample, for flame graphs (labctl.trace.flamefold)
        cmds.append(f"[ -s perf.data ] && perf script -i perf.data {ks} 2>> perf-report.err "
                    "| gzip -1 > perf-script-g.txt.gz")
    return cmds


def postprocess(workdir: str, spec: TraceSpec) -> str:
    """Turn binary traces into text inside the guest (symbols resolve there)."""
    # Module symbols with their module: perf often files module samples under
    # [kernel.kallsyms]; this map gives each symbol back its driver.
    # Without vmlinux perf reads /proc/kcore and files every module's samples
    # under [kernel.kallsyms]; a copy of kallsyms gives modules their own rows.
    # Only perf's reports read them (4 MB a guest and step, 2 s under TCG to write and copy back).
    cmds = [f"cd {q(workdir)}"]
    if spec.perf_record is not None:
        cmds += ["cat /proc/kallsyms > kallsyms.txt", "grep -F '[' kallsyms.txt > kallsyms-modules.txt"]
    cmds += [c for kind in TRACE_KINDS for c in kind.postprocess(spec)]
    return "; ".join(cmds) + "; true"


def snapshot(workdir: str, phase: str, commands: dict[str, str]) -> str:
    """Run every statistics command, output to stats/PHASE/STEM.txt, exit codes to stats/PHASE/_status."""
    d = f"stats/{phase}"
    parts = [f"cd {q(workdir)}", f"mkdir -p {q(d)}"]
    for stem, cmd in commands.items():
        out = q(f"{d}/{stem}.txt")
        parts.append(f"{{ {cmd} ; }} > {out} 2>&1; echo {q(stem)} $? >> {q(d + '/_status')}")
    return "; ".join(parts) + "; true"
