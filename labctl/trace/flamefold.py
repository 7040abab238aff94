"""Folding ``perf script`` text into stacks for flame graphs, and Brendan Gregg's folded format.

Public API::

    fold_perf_script(text, *, comm=True, module_symbols=None) -> Folded
    kallsyms_modules(text) -> {function: module}
    write_folded(stacks) -> str            read_folded(text) -> {Stack: samples}
    guest_flamegraph(guest_dir, driver_modules) -> (what the summary keeps, folded text) | None

A *stack* is a tuple of :class:`Frame` from the root (the process, when
``comm`` is on) to the leaf; a *stacks* mapping counts samples per stack.
Parsing never raises: what it does not understand is skipped and counted.

Folded text is Brendan Gregg's format (``a;b;c 12``, one stack per line,
root first, count last), so ``flamegraph.pl``, inferno and speedscope read
it. Each frame carries its kind as a suffix, extending the ``_[k]`` that
``stackcollapse-perf.pl --kernel`` writes:

========================  ==========================================
``tcp_sendmsg_[k]``       kernel core (``[kernel.kallsyms]``, vmlinux)
``e1000_clean_[k:e1000]`` kernel module ``e1000``
``Nwrite_[u:libiperf.so.0.0.0]``  user space, dso base name (``_[u]`` if none)
``iperf3_[p]``            the process (``comm``), root of its stacks
``[unknown]``             no suffix: unknown (also any foreign frame)
========================  ==========================================

A guest's step directory: a recording with call graphs (``perf_record: {call_graph: true}``)
leaves ``perf script``'s text of every sample, gzipped (:data:`RECORDING`). :func:`guest_flamegraph`
folds the sampling event's stacks (a tracepoint's stacks say where it fired, not where the CPU
went), gives kernel-core frames back their module from ``kallsyms-modules.txt``, and returns the
folded text (which the summary writes to ``flamegraph.folded``) and what the summary keeps: the
event, the samples, each module's samples (stacks that pass through it) and the driver's hottest
functions.

The SVG rendering is :mod:`labctl.report.flamegraph`'s.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from labctl.trace.parsers import is_tracepoint

KINDS = ("process", "kernel", "module", "user", "unknown")
"""Frame kinds; ``Frame.module`` is the module name for ``module``, the dso base name for ``user``."""


@dataclass(frozen=True, order=True)
class Frame:
    """One function on a stack: its name without offset, its kind and its module or dso."""

    function: str
    kind: str = "unknown"
    module: str = ""

    @property
    def where(self) -> str:
        """Where the function lives, for people: ``kernel``, ``module e1000``, ``user libc.so.6`` ..."""
        if self.kind == "module":
            return f"module {self.module}"
        if self.kind == "user":
            return f"user {self.module}" if self.module else "user"
        return self.kind


Stack = tuple[Frame, ...]


@dataclass
class Folded:
    """``perf script`` folded per event.

    ``events`` maps each event name, as perf prints it (``cpu-clock:pppH``,
    ``net:net_dev_queue``), to its stacks, in order of first appearance.
    ``skipped_samples`` counts samples that gave no stack or were cut off at
    the end of the text (a callchain not closed by a blank line, as
    ``perf script | head`` leaves); ``skipped_lines`` counts lines that
    were neither a sample header, a frame nor blank.
    """

    events: dict[str, dict[Stack, int]] = field(default_factory=dict)
    skipped_samples: int = 0
    skipped_lines: int = 0

    def total(self, event: str) -> int:
        """Samples folded for ``event`` (0 for an event not seen)."""
        return sum(self.events.get(event, {}).values())


# --------------------------------------------------------------------------- parsing

_HEADER = re.compile(
    r"^\s*(?P<comm>\S.*?)\s+-?\d+(?:/-?\d+)?\s+(?:\[\d+\]\s+)?(?:\d+\.\d+:\s+)?(?:\d+\s+)?"
    r"(?P<event>[^\s:]\S*?):(?:\s+(?P<rest>.*))?$")
_FRAME = re.compile(r"^\s*[0-9a-fA-F]+\s+(?P<sym>.+?)(?:\s+\((?P<dso>(?:[^()]|\([^()]*\))*)\))?\s*$")
_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")
_MODULE = re.compile(r"[A-Za-z0-9_-]+")
_KO = re.compile(r"(?P<name>.+)\.ko(?:\.(?:xz|gz|zst))?")
_USER_MAPS = frozenset({"vdso", "vsyscall", "vectors", "uprobes", "heap", "stack"})


def _clean(text: str) -> str:
    """A name usable inside folded text: no ``;`` (perf's comms and C++ names may have one), one line."""
    return text.replace(";", ":").replace("\n", " ").replace("\r", " ").strip()


def _classify(dso: str | None) -> tuple[str, str]:
    """(kind, module) for perf's dso text, e.g. ``[e1000]`` -> ("module", "e1000")."""
    dso = (dso or "").strip().removesuffix(" (deleted)")
    if not dso or dso == "[unknown]":
        return "unknown", ""
    if dso.startswith(("[kernel.", "[guest.kernel.")) or dso.endswith("vmlinux") or "/vmlinux-" in dso:
        return "kernel", ""
    if dso.startswith("[") and dso.endswith("]"):
        name = dso[1:-1]
        if name in _USER_MAPS or name.startswith("anon"):
            return "user", name
        return ("module", name) if _MODULE.fullmatch(name) and name != "hypervisor" else ("unknown", "")
    base = dso.rstrip("/").rsplit("/", 1)[-1]
    ko = _KO.fullmatch(base)
    if ko is not None:
        return "module", ko["name"].replace("-", "_")
    return "user", _clean(base).replace("]", "_")


def _parse_frame(text: str) -> Frame | None:
    """A callchain entry such as ``ffffffffc018e017 e1000_xmit_frame+0x17 ([e1000])``, or None."""
    m = _FRAME.match(text)
    if m is None:
        return None
    kind, module = _classify(m["dso"])
    return Frame(_clean(_OFFSET.sub("", m["sym"])) or "[unknown]", kind, module)


def _stack(comm: str | None, frames: list[Frame], module_symbols: Mapping[str, str]) -> Stack:
    """Root-to-leaf stack from perf's leaf-first frames; ``(inlined)`` frames take their caller's kind."""
    out: list[Frame] = [Frame(_clean(comm) or "[unknown]", "process")] if comm is not None else []
    for f in reversed(frames):
        if f.kind == "user" and f.module == "inlined" and out and out[-1].kind != "process":
            f = Frame(f.function, out[-1].kind, out[-1].module)
        elif f.kind == "kernel" and f.function in module_symbols:
            f = Frame(f.function, "module", module_symbols[f.function])
        out.append(f)
    return tuple(out)


def fold_perf_script(text: str, *, comm: bool = True,
                     module_symbols: Mapping[str, str] | None = None) -> Folded:
    """Fold ``perf script`` output (default fields, with or without ``-g``) into stacks per event.

    Each sample counts once, whatever its period. A sample is a header line
    (``comm pid [cpu] time: [period] event: ...``), its callchain lines
    (leaf first) and a blank line; without ``-g`` the one frame is on the
    header line and no blank line follows. With ``comm`` the process name
    is the root frame of every stack. ``module_symbols`` (see
    :func:`kallsyms_modules`) gives kernel-core frames back their module,
    for recordings where perf filed modules under ``[kernel.kallsyms]``.
    Never raises; see :class:`Folded` for what is skipped.
    """
    out = Folded()
    mods = module_symbols or {}
    event: str | None = None
    who: str | None = None
    frames: list[Frame] = []
    chained = False  # frames came on their own lines (-g), so a blank line must close the sample

    def flush() -> None:
        nonlocal event
        if event is not None:
            stack = _stack(who if comm else None, frames, mods)
            if stack:
                bucket = out.events.setdefault(event, {})
                bucket[stack] = bucket.get(stack, 0) + 1
            else:
                out.skipped_samples += 1
        event = None
        frames.clear()

    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it is not a blank line closing a sample
    for raw in lines:
        line = raw.rstrip("\r")
        if not line.strip():
            flush()
            chained = False
            continue
        frame = _parse_frame(line) if line.startswith("\t") and event is not None else None
        if frame is not None:
            frames.append(frame)
            chained = True
            continue
        header = _HEADER.match(line)
        if header is not None:
            flush()
            event, who, chained = header["event"], header["comm"], False
            inline = _parse_frame(header["rest"] or "")
            if inline is not None:
                frames.append(inline)
            continue
        frame = _parse_frame(line) if event is not None else None
        if frame is not None:
            frames.append(frame)
            chained = True
        else:
            out.skipped_lines += 1
    if event is not None and chained:
        out.skipped_samples += 1  # cut off mid-callchain: its root frames are missing
        event = None
    flush()
    return out


def kallsyms_modules(text: str) -> dict[str, str]:
    """``{function: module}`` from ``/proc/kallsyms`` lines such as ``ffffffffc0150000 t e1000_clean\\t[e1000]``.

    Names that several modules define (``init_module`` ...) are left out.
    Never raises; other lines are ignored.
    """
    found: dict[str, str] = {}
    clash: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or not (parts[3].startswith("[") and parts[3].endswith("]")):
            continue
        name, module = parts[2], parts[3][1:-1]
        if not _MODULE.fullmatch(module):
            continue
        if found.get(name, module) != module:
            clash.add(name)
        found[name] = module
    return {k: v for k, v in found.items() if k not in clash}


# --------------------------------------------------------------------------- folded text

_TAG = re.compile(r"^(?P<fn>.*)_\[(?P<tag>p|k|u|k:[A-Za-z0-9_-]+|u:[^\];]+)\]$")


def _encode(f: Frame) -> str:
    fn = _clean(f.function)
    module = _clean(f.module).replace("]", "_")
    tag = {"process": "p", "kernel": "k", "module": f"k:{module}",
           "user": f"u:{module}" if module else "u"}.get(f.kind)
    return fn if tag is None else f"{fn}_[{tag}]"


def _decode(text: str) -> Frame:
    m = _TAG.match(text)
    if m is None:
        return Frame(text, "unknown")
    tag = m["tag"]
    kind = {"p": "process", "k": "kernel", "u": "user"}[tag[0]]
    if tag.startswith("k:"):
        kind = "module"
    return Frame(m["fn"], kind, tag[2:])


def write_folded(stacks: Mapping[Stack, int]) -> str:
    """Folded text, one ``frame;frame;... count`` line per stack with a positive count, lines sorted.

    Frames are encoded as the module docstring shows, so that
    ``read_folded(write_folded(s)) == s`` for stacks from :func:`fold_perf_script`.
    """
    lines = sorted(f"{';'.join(_encode(f) for f in stack)} {n}" for stack, n in stacks.items() if stack and n > 0)
    return "".join(line + "\n" for line in lines)


def read_folded(text: str) -> dict[Stack, int]:
    """Stacks from folded text (ours or any ``stackcollapse-*`` output); repeated stacks add up.

    Lines without a trailing integer count, blank lines and ``#`` comments
    are skipped; frames without a kind suffix are ``unknown``. Never raises.
    """
    stacks: dict[Stack, int] = {}
    for line in text.splitlines():
        body, _, count = line.strip().rpartition(" ")
        if not body or body.startswith("#") or not count.isdigit():
            continue
        stack = tuple(_decode(part) for part in body.split(";") if part)
        if stack and int(count) > 0:
            stacks[stack] = stacks.get(stack, 0) + int(count)
    return stacks


# --------------------------------------------------------------------------- a guest's recording

RECORDING = "perf-script-g.txt.gz"  # perf script of a call-graph recording, gzipped
KALLSYMS_MODULES = "kallsyms-modules.txt"
TOP_FUNCTIONS = 10


def _module(name: str) -> str:
    return name.strip("[]").replace("-", "_")


def _inclusive(stacks: Mapping[Stack, int]) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Samples of stacks passing through each module, and through each (module, function), each stack once."""
    modules: Counter[str] = Counter()
    functions: Counter[tuple[str, str]] = Counter()
    for stack, n in stacks.items():
        mods = {f.module for f in stack if f.kind == "module"}
        funcs = {(f.module, f.function) for f in stack if f.kind == "module"}
        for m in mods:
            modules[m] += n
        for key in funcs:
            functions[key] += n
    return modules, functions


class DriverFunction(TypedDict):
    """One of the driver's most sampled functions (inclusive)."""

    function: str
    module: str
    samples: int
    pct: float | None


class DriverSamples(TypedDict):
    """The samples whose stacks pass through the driver's modules."""

    modules: list[str]
    samples: int
    pct: float | None
    functions: list[DriverFunction]


class StackFigures(TypedDict):
    """What :func:`summarize_stacks` says of a recording's stacks."""

    samples: int
    modules: dict[str, int]  # module -> samples, the most sampled first
    driver: DriverSamples


class FlameFigures(TypedDict, total=False):
    """A guest's ``flamegraph`` in summary.json (:func:`guest_flamegraph`; the report adds ``folded``)."""

    event: str | None
    skipped_samples: int
    samples: int
    modules: dict[str, int]
    driver: DriverSamples
    other_events: dict[str, int]  # event -> samples
    folded: str | None  # the folded stacks' file beside the recording (labctl.report.flames)


def summarize_stacks(stacks: Mapping[Stack, int], driver_modules: list[str]) -> StackFigures:
    """Samples, per-module samples and the driver's functions (inclusive: a stack counts once per frame kind)."""
    total = sum(stacks.values())
    modules, functions = _inclusive(stacks)
    drivers = {_module(m) for m in driver_modules}
    in_driver = sum(n for stack, n in stacks.items() if any(f.kind == "module" and f.module in drivers
                                                             for f in stack))
    top = sorted(((fn, mod, n) for (mod, fn), n in functions.items() if mod in drivers),
                 key=lambda item: (-item[2], item[0]))[:TOP_FUNCTIONS]
    return {
        "samples": total,
        "modules": dict(sorted(modules.items(), key=lambda kv: (-kv[1], kv[0]))),
        "driver": {"modules": sorted(drivers), "samples": in_driver,
                   "pct": round(100 * in_driver / total, 2) if total else None,
                   "functions": [{"function": fn, "module": mod, "samples": n,
                                  "pct": round(100 * n / total, 2) if total else None} for fn, mod, n in top]},
    }


def guest_flamegraph(guest_dir: Path, driver_modules: list[str]) -> tuple[FlameFigures, str] | None:
    """Fold the guest's call-graph recording: (what the summary keeps, the folded text); None without one.

    The summary keeps ``event`` (None when the recording has no sampling
    event; the folded text is then empty), ``samples``, ``skipped_samples``, ``modules``, ``driver`` (see
    :func:`summarize_stacks`) and ``other_events`` (the recording's other
    events with their sample counts, tracepoints included).

    :raise OSError: when the recording cannot be read.
    """
    path = guest_dir / RECORDING
    if not path.is_file():
        return None
    with gzip.open(path, "rt", errors="replace") as f:
        text = f.read()
    try:
        mods = kallsyms_modules((guest_dir / KALLSYMS_MODULES).read_text(errors="replace"))
    except OSError:
        mods = {}
    folded = fold_perf_script(text, module_symbols=mods)
    sampling = [e for e in folded.events if not is_tracepoint(e.rstrip(":"))]
    if not sampling:
        return {"event": None, "samples": 0,
                "other_events": {e: folded.total(e) for e in folded.events}}, ""
    event = max(sampling, key=folded.total)
    stacks = folded.events[event]
    fig = summarize_stacks(stacks, driver_modules)
    info: FlameFigures = {"event": event, "skipped_samples": folded.skipped_samples, "samples": fig["samples"],
                          "modules": fig["modules"], "driver": fig["driver"],
                          "other_events": {e: folded.total(e) for e in folded.events if e != event}}
    return info, write_folded(stacks)
