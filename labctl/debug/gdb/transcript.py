"""A scripted gdb session: what to do (:class:`GdbSpec`), what happened (:class:`Transcript`),
the MI records that say so, and the transcript files in the bundle."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from labctl.debug.symbolize import normalize_path
from labctl.errors import UsageError

TRANSCRIPT_JSON = "gdb-transcript.json"
TRANSCRIPT_TXT = "gdb-transcript.txt"

# -- the MI records, as pygdbmi parses them ------------------------------------------
# The keys labctl reads; gdb's others (thread-id, core, thread-groups...) pass through.


class MiArg(TypedDict, total=False):
    """A function argument in a frame: ``{name=..., value=..., type=...}``."""

    name: str
    value: str
    type: str


class MiFrame(TypedDict, total=False):
    """An MI ``frame={...}`` tuple (all its values are MI strings)."""

    level: str
    addr: str
    func: str
    file: str
    fullname: str
    line: str
    args: list[MiArg]


class MiStackItem(MiFrame, total=False):
    """An item of ``stack=[...]``/``stack-args=[...]``: a frame, or ``{frame={...}}``."""

    frame: MiFrame


class MiBreakpoint(MiFrame, total=False):
    """``-break-insert``'s ``bkpt={...}``, with the ``where`` labctl adds."""

    number: str
    type: str
    disp: str
    enabled: str
    times: str
    where: str


class MiRegister(TypedDict, total=False):
    """An item of ``register-values=[...]``."""

    number: str
    value: str


# A result or ``*stopped`` record's payload (the keys of both).
MiPayload = TypedDict("MiPayload", {
    "reason": str, "bkptno": str, "signal-name": str, "frame": MiFrame,  # *stopped
    "msg": str, "bkpt": MiBreakpoint, "stack": list[MiStackItem], "stack-args": list[MiStackItem],
    "register-names": list[str], "register-values": list[MiRegister],
}, total=False)


class MiRecord(TypedDict):
    """One MI output record (:func:`pygdbmi.gdbmiparser.parse_response`), timed by :class:`MiSession`."""

    type: str  # result, notify, console, log, target, output
    message: str | None
    payload: MiPayload | str | None  # a str for the stream records
    token: int | None
    stream: str
    t: NotRequired[float]


class FrameJson(TypedDict):
    """A :class:`FrameInfo` in ``gdb-transcript.json``."""

    func: str | None
    file: str | None
    line: int | None
    addr: str | None
    level: int | None


class ArgJson(TypedDict):
    """An :class:`ArgValue` in ``gdb-transcript.json``."""

    name: str
    value: str | None
    type: str | None


class StopJson(TypedDict):
    """A :class:`StopRecord` in ``gdb-transcript.json``."""

    kind: str
    hit: int
    step: int
    reason: str
    frame: FrameJson
    elapsed: float
    args: list[ArgJson]
    registers: dict[str, str]
    backtrace: list[FrameJson]
    raw: MiPayload


class TranscriptJson(TypedDict):
    """``gdb-transcript.json``."""

    location: str
    hits: int
    timed_out: bool
    interrupted: bool
    message: str
    error: str | None
    breakpoint: MiBreakpoint
    timings: dict[str, float]
    guest_resumed: bool
    stops: list[StopJson]

# -- what to do and what happened ----------------------------------------------------

@dataclass(frozen=True)
class GdbSpec:
    """One scripted breakpoint session.

    :param location: a gdb location: function name (in vmlinux or a loaded
        module), ``file.c:LINE`` or ``*0xADDR``.
    :param hits: stop after this many hits.
    :param step: single-steps recorded after each hit.
    :param step_mode: ``line`` (``next``), ``into`` (``step``) or
        ``instruction`` (``nexti``).
    :param timeout: seconds to wait for all the hits after the first continue.
    """

    location: str
    hits: int = 1
    step: int = 0
    step_mode: Literal["line", "into", "instruction"] = "line"
    registers: tuple[str, ...] = ("rip", "rsp", "rdi", "rsi")
    args: bool = True
    backtrace: int = 10
    timeout: float = 60.0
    hardware: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not self.location.strip():
            problems.append("an empty location")
        if self.hits < 1:
            problems.append(f"hits={self.hits} (at least 1)")
        if self.step < 0:
            problems.append(f"step={self.step} (0 or more)")
        if self.step_mode not in ("line", "into", "instruction"):
            problems.append(f"step_mode={self.step_mode!r} (line, into or instruction)")
        if self.timeout <= 0:
            problems.append(f"timeout={self.timeout} (more than 0)")
        if self.backtrace < 0:
            problems.append(f"backtrace={self.backtrace} (0 or more)")
        if problems:
            raise UsageError("bad gdb breakpoint spec: " + ", ".join(problems))


@dataclass(frozen=True)
class FrameInfo:
    """Where a stop or a backtrace frame is: function, source file and line, address."""

    func: str | None
    file: str | None
    line: int | None
    addr: str | None
    level: int | None = None

    def where(self) -> str:
        """``func (file:line)`` or what is known of it."""
        name = self.func or self.addr or "??"
        if self.file:
            return f"{name} ({self.file}:{self.line})" if self.line else f"{name} ({self.file})"
        return name

    def to_json(self) -> FrameJson:
        return {"func": self.func, "file": self.file, "line": self.line, "addr": self.addr, "level": self.level}


@dataclass(frozen=True)
class ArgValue:
    """A function argument at a stop: ``value`` is None when it is not a simple value."""

    name: str
    value: str | None
    type: str | None = None

    def to_json(self) -> ArgJson:
        return {"name": self.name, "value": self.value, "type": self.type}


@dataclass
class StopRecord:
    """One stop of the target, parsed from gdb/MI.

    ``kind`` is ``hit`` (our breakpoint), ``step`` (after a single-step),
    ``interrupt`` (we stopped the target) or ``other``.
    """

    kind: str
    hit: int
    step: int
    reason: str
    frame: FrameInfo
    elapsed: float
    args: list[ArgValue] = field(default_factory=list)
    registers: dict[str, str] = field(default_factory=dict)
    backtrace: list[FrameInfo] = field(default_factory=list)
    raw: MiPayload = field(default_factory=lambda: MiPayload())

    def to_json(self) -> StopJson:
        return {"kind": self.kind, "hit": self.hit, "step": self.step, "reason": self.reason,
                "frame": self.frame.to_json(), "elapsed": self.elapsed, "args": [a.to_json() for a in self.args],
                "registers": dict(self.registers), "backtrace": [f.to_json() for f in self.backtrace],
                "raw": deepcopy(self.raw)}


@dataclass
class Transcript:
    """The outcome of :func:`run_breakpoint_session`."""

    location: str
    hits: int = 0
    stops: list[StopRecord] = field(default_factory=list)
    timed_out: bool = False
    interrupted: bool = False
    message: str = ""
    error: str | None = None
    breakpoint: MiBreakpoint = field(default_factory=lambda: MiBreakpoint())
    timings: dict[str, float] = field(default_factory=dict)
    guest_resumed: bool = False

    @property
    def hit_stops(self) -> list[StopRecord]:
        return [s for s in self.stops if s.kind == "hit"]

    def to_json(self) -> TranscriptJson:
        return {"location": self.location, "hits": self.hits, "timed_out": self.timed_out,
                "interrupted": self.interrupted, "message": self.message, "error": self.error,
                "breakpoint": self.breakpoint, "timings": self.timings, "guest_resumed": self.guest_resumed,
                "stops": [s.to_json() for s in self.stops]}

    def to_text(self) -> str:
        return format_transcript(self)


# -- parsing MI records --------------------------------------------------------------

def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_frame(frame: MiFrame | None) -> FrameInfo:
    """A :class:`FrameInfo` from an MI ``frame={...}`` tuple (stop or stack frame)."""
    frame = frame or {}
    file = frame.get("file") or frame.get("fullname")
    return FrameInfo(func=frame.get("func"), file=normalize_path(file) if file else None,
                     line=_int(frame.get("line")), addr=frame.get("addr"), level=_int(frame.get("level")))


def parse_stack(payload: MiPayload) -> list[FrameInfo]:
    """Frames from ``-stack-list-frames``' ``stack=[frame={...},...]``."""
    frames = []
    for item in payload.get("stack") or []:
        frame = item.get("frame", item) if isinstance(item, Mapping) else {}
        frames.append(parse_frame(frame))
    return frames


def parse_stack_args(payload: MiPayload) -> list[ArgValue]:
    """Frame 0's arguments from ``-stack-list-arguments --simple-values 0 0``."""
    frames = payload.get("stack-args") or []
    if not frames:
        return []
    frame = frames[0].get("frame", frames[0]) if isinstance(frames[0], Mapping) else {}
    return [parse_arg(a) for a in frame.get("args") or [] if isinstance(a, Mapping)]


def parse_arg(arg: MiArg) -> ArgValue:
    return ArgValue(name=str(arg.get("name", "?")), value=arg.get("value"), type=arg.get("type"))


def parse_register_names(payload: MiPayload) -> dict[str, int]:
    """``{name: number}`` from ``-data-list-register-names`` (empty names are gaps)."""
    return {name: i for i, name in enumerate(payload.get("register-names") or []) if name}


def parse_register_values(payload: MiPayload, numbers: Mapping[str, int]) -> dict[str, str]:
    """``{name: value}`` from ``-data-list-register-values``, named through ``numbers``."""
    by_number = {n: name for name, n in numbers.items()}
    values = {}
    for item in payload.get("register-values") or []:
        name = by_number.get(_int(item.get("number")) or -1)
        if name is not None:
            values[name] = str(item.get("value"))
    return values


def stop_reason(stopped: MiPayload) -> str:
    """The reason of a ``*stopped`` record (``signal-received SIGINT`` for signals)."""
    reason = str(stopped.get("reason") or "unknown")
    if reason == "signal-received" and stopped.get("signal-name"):
        reason = f"{reason} {stopped['signal-name']}"
    return reason


def is_breakpoint_hit(stopped: MiPayload, number: str) -> bool:
    """True when a ``*stopped`` record is a hit of breakpoint ``number``."""
    return stopped.get("reason") == "breakpoint-hit" and str(stopped.get("bkptno")) == str(number)


def mi_quote(text: str) -> str:
    """``text`` as an MI c-string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# -- formatting ----------------------------------------------------------------------

def format_args(args: Sequence[ArgValue]) -> str:
    return ", ".join(f"{a.name}={a.value if a.value is not None else '…'}" for a in args)


def format_stop(stop: StopRecord) -> list[str]:
    """The readable lines of one stop."""
    if stop.kind == "hit":
        head = f"hit {stop.hit} at {stop.frame.where()}"
        if stop.args:
            head += f" args: {format_args(stop.args)}"
        lines = [head]
        if stop.registers:
            lines.append("  registers: " + " ".join(f"{k}={v}" for k, v in stop.registers.items()))
        for i, f in enumerate(stop.backtrace):
            lines.append(f"  #{f.level if f.level is not None else i:<2} {f.where()}")
        return lines
    if stop.kind == "step":
        return [f"  step {stop.step}: {stop.frame.where()}" + ("" if stop.reason == "end-stepping-range"
                                                               else f" [{stop.reason}]")]
    return [f"{stop.kind} stop ({stop.reason}) at {stop.frame.where()}"]


def format_transcript(t: Transcript) -> str:
    """The whole session as text (``gdb-transcript.txt``)."""
    bp = t.breakpoint
    if bp:
        lines = [f"breakpoint {bp.get('number', '?')} ({bp.get('type', 'breakpoint')}) at {t.location}"
                 + (f" = {bp['where']}" if bp.get("where") else "")]
    else:
        lines = [f"no breakpoint set at {t.location}"]
    for stop in t.stops:
        lines.extend(format_stop(stop))
    if t.message:
        lines.append(t.message)
    if t.timings:
        lines.append("timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.timings.items()))
    return "\n".join(lines) + "\n"


def write_transcript(t: Transcript, out_dir: Path) -> None:
    """Write ``gdb-transcript.json`` and ``gdb-transcript.txt`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TRANSCRIPT_JSON).write_text(json.dumps(t.to_json(), indent=2) + "\n")
    (out_dir / TRANSCRIPT_TXT).write_text(t.to_text())


