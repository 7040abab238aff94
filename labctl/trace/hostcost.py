"""The whole cost of a step: each guest's QEMU on the host and the guest's own CPU, per GB moved.

Pure functions of the files :mod:`labctl.steps.hostwatch` writes into
``steps/<step>/<variant>/_host/<guest>/`` and of the guest's
``window-stat-start.txt``/``window-stat-end.txt`` (its ``/proc/stat`` at
the window's start and end):

* **host CPU** of a guest's QEMU: ``utime + stime`` of the process between
  the window's two reads (clock ticks, exact for the whole process, exited
  threads included), split into its vCPU threads (the thread ids QMP
  ``query-cpus-fast`` gave), its main thread (QEMU's main loop: the network
  backends, timers, the monitor) and the rest (RCU, worker threads);
* **guest CPU**: the guest's busy time (all but idle and iowait) in its
  ``/proc/stat`` over the same window (``USER_HZ`` = 100);
* **bytes moved**: what the transfer tool reports (iperf3's or wget's
  received bytes), else the step NIC's rx + tx byte counters of
  ``/proc/net/dev`` between the statistics snapshots;
* **CPU seconds per GB** (10^9 bytes), host and guest side by side;
* the **host profile** of the QEMU process (``perf-script.txt.gz``): samples
  per thread role and per kind of code: guest code TCG translated
  (``[JIT]``), QEMU's own code, the host kernel, libraries; and the hottest
  functions. QEMU's static functions (its device models among them) are named only when
  the host has QEMU's debug symbols; the share left unnamed is reported.

Under TCG the guest's CPU time is carried out by the vCPU threads, so the
host's CPU time contains it: the two are views of one cost, never a sum.
Nothing here raises on odd input; a figure that cannot be computed is None
and ``notes`` says why.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from labctl.trace.parsers import read_or_none

THREADS_FILE = "qemu-threads.json"
PERF_DATA = "perf.data"
PERF_LOG = "perf-record.log"
PERF_SCRIPT = "perf-script.txt.gz"
PROFILE_UNAVAILABLE = "profile-unavailable.txt"
WINDOW_START = "window-stat-start.txt"
WINDOW_END = "window-stat-end.txt"
USER_HZ = 100  # /proc/stat's unit in every Linux guest on x86
GB = 1e9
TOP_FUNCTIONS = 15

KINDS = ("guest code (TCG)", "QEMU", "host kernel", "libraries", "unknown")
ROLES = ("vCPU", "main loop", "other threads")


class TaskStats(TypedDict):
    """One read of a QEMU process (:func:`labctl.steps.hostwatch.read_task_stats`): its
    ``/proc/PID/stat`` line and each thread's, raw, with the host's monotonic time."""

    monotonic: float
    process: str
    threads: dict[str, str]  # tid -> its /proc/PID/task/TID/stat line


class ThreadsDoc(TypedDict, total=False):
    """``qemu-threads.json``, as :mod:`labctl.steps.hostwatch` writes it for each guest and step."""

    guest: str
    pid: int | None
    accel: str | None
    clock_ticks_per_s: int
    window_s: float | None
    vcpu_threads: dict[str, int]  # tid -> vCPU index (QMP query-cpus-fast)
    start: TaskStats | None
    end: TaskStats | None
    note: str | None


class ThreadCost(TypedDict):
    """One QEMU thread's CPU over the window."""

    tid: int | str
    name: str
    role: str  # one of ROLES
    vcpu: int | None
    cpu_s: float


class TopFunction(TypedDict):
    """One of the host profile's hottest named functions."""

    function: str
    object: str
    kind: str  # one of KINDS
    samples: int
    pct: float


class HostProfile(TypedDict):
    """The host profile of one QEMU (:func:`host_profile`)."""

    samples: int
    by_role: dict[str, dict[str, int]]  # role -> kind -> samples
    kinds: dict[str, float]  # kind -> percent of all samples
    top: list[TopFunction]
    unnamed_qemu_pct: float | None


class QemuThreads(TypedDict, total=False):
    """Host CPU of one QEMU over the window (:func:`qemu_threads`), then its profile (:func:`guest_cost`)."""

    measured: bool
    window_s: float | None
    note: str | None
    cpu_s: float
    user_s: float
    system_s: float
    by_role: dict[str, float]  # role -> seconds
    threads: list[ThreadCost]
    profile: HostProfile
    profile_note: str


class GuestCpu(TypedDict):
    """The guest's own CPU over the window (:func:`guest_window_cpu`)."""

    cpu_s: float
    cpus: int
    busy_pct: float | None
    by_mode: dict[str, float]  # /proc/stat mode -> seconds


class GuestCost(TypedDict):
    """One guest's cost over its step's window (:func:`guest_cost`)."""

    host: QemuThreads
    guest: GuestCpu | None
    notes: list[str]


class GuestStepCost(TypedDict):
    """One guest's entry in a step's cost (:func:`step_cost`): its figures, then its :class:`GuestCost`."""

    host_cpu_s: float | None
    host_vcpu_s: float | None
    host_main_s: float | None
    host_other_s: float | None
    guest_cpu_s: float | None
    host_cpu_s_per_gb: float | None
    guest_cpu_s_per_gb: float | None
    host: QemuThreads
    guest: GuestCpu | None
    notes: list[str]


class StepCost(TypedDict):
    """A step's whole cost (:func:`step_cost`): summary.json's ``cost`` of each step entry."""

    window_s: float | None
    bytes: int | None
    bytes_source: str | None
    guests: dict[str, GuestStepCost]
    host_measured: bool
    host_cpu_s: float | None
    guest_cpu_s: float | None
    host_cpu_s_per_gb: float | None
    guest_cpu_s_per_gb: float | None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- host threads


def parse_stat_line(line: str) -> tuple[str, int, int] | None:
    """``(comm, utime, stime)`` in clock ticks from one ``/proc/PID/stat`` line, or None.

    The comm is between the first ``(`` and the *last* ``)``: it may hold
    spaces and parentheses itself.
    """
    start, end = line.find("("), line.rfind(")")
    if start < 0 or end < start:
        return None
    fields = line[end + 1:].split()
    try:  # fields after the comm: state is field 3, utime 14 and stime 15 of the whole line
        return line[start + 1:end], int(fields[11]), int(fields[12])
    except (IndexError, ValueError):
        return None


def _role(tid: str, pid: int | None, vcpus: Mapping[str, int], name: str) -> str:
    if tid in vcpus or re.fullmatch(r"(CPU \d+|ALL CPUs)/(TCG|KVM)", name):
        return "vCPU"
    return "main loop" if pid is not None and tid == str(pid) else "other threads"


def _vcpus(doc: ThreadsDoc) -> dict[str, int]:
    value = doc.get("vcpu_threads")
    return value if isinstance(value, dict) else {}


def qemu_threads(doc: ThreadsDoc) -> QemuThreads:
    """Host CPU seconds of one QEMU over the window, per role and per thread, from ``qemu-threads.json``.

    Keys: ``measured``, ``window_s``, ``cpu_s`` (the whole process), ``user_s``,
    ``system_s``, ``by_role`` ({vCPU, main loop, other threads}: seconds;
    threads that exited during the window are in ``other threads``),
    ``threads`` (tid, name, role, vcpu index, cpu_s) and ``note``.
    """
    start, end = doc.get("start"), doc.get("end")
    out: QemuThreads = {"measured": False, "window_s": doc.get("window_s"), "note": doc.get("note")}
    if not isinstance(start, dict) or not isinstance(end, dict):
        out["note"] = out["note"] or "the QEMU process was not read at both ends of the window"
        return out
    tck = doc.get("clock_ticks_per_s") or 100
    p0, p1 = parse_stat_line(str(start.get("process", ""))), parse_stat_line(str(end.get("process", "")))
    if p0 is None or p1 is None:
        out["note"] = "unreadable /proc/PID/stat lines"
        return out
    user, system = (p1[1] - p0[1]) / tck, (p1[2] - p0[2]) / tck
    pid = doc.get("pid")
    vcpus = _vcpus(doc)
    threads: list[ThreadCost] = []
    by_role = dict.fromkeys(ROLES, 0.0)
    before = {tid: parse_stat_line(line) for tid, line in (start.get("threads") or {}).items()}
    for tid, line in sorted((end.get("threads") or {}).items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        now, was = parse_stat_line(line), before.get(tid)
        if now is None:
            continue
        ticks = now[1] + now[2] - ((was[1] + was[2]) if was else 0)
        role = _role(tid, pid if isinstance(pid, int) else None, vcpus, now[0])
        threads.append({"tid": int(tid) if tid.isdigit() else tid, "name": now[0], "role": role,
                        "vcpu": vcpus.get(tid), "cpu_s": round(ticks / tck, 3)})
        by_role[role] += ticks / tck
    total = user + system
    by_role["other threads"] += max(0.0, total - sum(by_role.values()))  # threads that exited meanwhile
    out.update({"measured": True, "cpu_s": round(total, 3), "user_s": round(user, 3), "system_s": round(system, 3),
                "by_role": {k: round(v, 3) for k, v in by_role.items()}, "threads": threads})
    return out


# --------------------------------------------------------------------------- guest CPU


def parse_proc_stat(text: str) -> dict[str, list[int]]:
    """``/proc/stat``'s cpu lines: ``{"cpu": [user, nice, system, idle, iowait, irq, softirq, steal...], "cpu0": ...}``."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("cpu") and all(p.isdigit() for p in parts[1:]) and len(parts) > 5:
            out[parts[0]] = [int(p) for p in parts[1:]]
    return out


_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def guest_window_cpu(start_text: str, end_text: str) -> GuestCpu | None:
    """The guest's CPU seconds over the window from two ``/proc/stat`` reads, or None.

    ``cpu_s``: busy time (everything but idle and iowait, guest time being
    inside user already), summed over its CPUs; ``by_mode``: seconds per
    mode; ``cpus``: how many; ``busy_pct``: busy share of all CPUs' time.
    """
    a, b = parse_proc_stat(start_text).get("cpu"), parse_proc_stat(end_text).get("cpu")
    if a is None or b is None:
        return None
    delta = [y - x for x, y in zip(a, b)]
    modes = {m: delta[i] / USER_HZ for i, m in enumerate(_MODES) if i < len(delta)}
    busy = sum(v for m, v in modes.items() if m not in ("idle", "iowait"))
    total = sum(modes.values())
    cpus = sum(1 for k in parse_proc_stat(end_text) if k != "cpu")
    return {"cpu_s": round(busy, 3), "cpus": cpus, "busy_pct": _round(100 * busy / total if total else None, 2),
            "by_mode": {m: round(v, 3) for m, v in modes.items()}}


# --------------------------------------------------------------------------- bytes


def parse_proc_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev`` as ``{"eth1": (rx_bytes, tx_bytes)}``."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) >= 9 and fields[0].isdigit() and fields[8].isdigit():
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def nic_bytes(guest_dir: Path, nic: str) -> int | None:
    """rx + tx bytes of ``nic`` between the step's statistics snapshots, or None."""
    try:
        before = parse_proc_net_dev((guest_dir / "stats" / "before" / "netdev.txt").read_text(errors="replace"))
        after = parse_proc_net_dev((guest_dir / "stats" / "after" / "netdev.txt").read_text(errors="replace"))
    except OSError:
        return None
    if nic not in before or nic not in after:
        return None
    return sum(after[nic]) - sum(before[nic])


def per_gb(seconds: float | None, nbytes: int | None) -> float | None:
    """CPU seconds per GB (10^9 bytes) moved; None without bytes."""
    if seconds is None or not nbytes or nbytes <= 0:
        return None
    return round(seconds / (nbytes / GB), 3)


# --------------------------------------------------------------------------- host profile


_SCRIPT_LINE = re.compile(r"^\s*(\d+)\s+[0-9a-fA-F]+\s+(.*?)\s+\((.*)\)\s*$")


def _kind(dso: str) -> str:
    base = dso.rsplit("/", 1)[-1]
    if dso.startswith("[JIT]") or re.fullmatch(r"perf-\d+\.map", base):
        return "guest code (TCG)"
    if dso.startswith(("[kernel", "[guest.kernel")):
        return "host kernel"
    if base.startswith("qemu-system-"):
        return "QEMU"
    if ".so" in base:
        return "libraries"
    return "unknown"


def host_profile(text: str, pid: int | None, vcpus: Mapping[str, int]) -> HostProfile:
    """Samples of a host ``perf script -F tid,ip,sym,dso``: per thread role and kind of code, and the top functions.

    ``by_role``: {role: {kind: samples}}; ``kinds``: {kind: percent of all};
    ``top``: the :data:`TOP_FUNCTIONS` most sampled named functions (function,
    object, kind, samples, pct); ``unnamed_qemu_pct``: the share of QEMU's own
    samples without a function name.
    """
    by_role: dict[str, Counter[str]] = {}
    funcs: Counter[tuple[str, str, str]] = Counter()
    unnamed_qemu = total = 0
    for line in text.splitlines():
        m = _SCRIPT_LINE.match(line)
        if m is None:
            continue
        tid, sym, dso = m[1], m[2], m[3]
        kind = _kind(dso)
        role = _role(tid, pid, vcpus, "")
        by_role.setdefault(role, Counter())[kind] += 1
        total += 1
        name = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        if kind == "QEMU" and name == "[unknown]":
            unnamed_qemu += 1
        if name != "[unknown]" and kind != "guest code (TCG)":
            funcs[(name, dso.rsplit("/", 1)[-1], kind)] += 1
    kinds: Counter[str] = Counter()
    for c in by_role.values():
        kinds.update(c)
    qemu = kinds.get("QEMU", 0)
    return {
        "samples": total,
        "by_role": {r: dict(sorted(c.items())) for r, c in sorted(by_role.items())},
        "kinds": {k: round(100 * kinds[k] / total, 2) for k in KINDS if kinds.get(k)} if total else {},
        "top": [{"function": f, "object": o, "kind": k, "samples": n, "pct": round(100 * n / total, 2)}
                for (f, o, k), n in sorted(funcs.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FUNCTIONS]],
        "unnamed_qemu_pct": round(100 * unnamed_qemu / qemu, 1) if qemu else None,
    }


# --------------------------------------------------------------------------- per guest, per step


def guest_cost(guest_dir: Path, host_dir: Path) -> GuestCost:
    """One guest's cost over its step's window, from its step directory and the host's record of
    its QEMU: ``host`` (:func:`qemu_threads`, plus ``profile`` or ``profile_note``) and ``guest``
    (:func:`guest_window_cpu`), with ``notes``."""
    notes: list[str] = []
    hdir = host_dir
    doc: ThreadsDoc = {}
    raw = read_or_none(hdir / THREADS_FILE)
    if raw is None:
        notes.append("the host side was not measured (no _host/ record: a bundle of an older labctl?)")
    else:
        try:
            doc = json.loads(raw)
        except ValueError:
            notes.append(f"{THREADS_FILE} is not JSON")
    host: QemuThreads = qemu_threads(doc) if doc else {"measured": False}
    if doc and not host.get("measured") and host.get("note"):
        notes.append(f"host: {host['note']}")
    unavailable = read_or_none(hdir / PROFILE_UNAVAILABLE)
    if unavailable is not None:
        host["profile_note"] = unavailable.strip()
    elif (hdir / PERF_SCRIPT).is_file():
        try:
            with gzip.open(hdir / PERF_SCRIPT, "rt", errors="replace") as f:
                host["profile"] = host_profile(f.read(), doc.get("pid"), _vcpus(doc))
        except (OSError, EOFError) as exc:
            host["profile_note"] = f"{PERF_SCRIPT} unreadable: {exc}"
    start, end = read_or_none(guest_dir / WINDOW_START), read_or_none(guest_dir / WINDOW_END)
    gcpu = guest_window_cpu(start, end) if start is not None and end is not None else None
    if gcpu is None:
        notes.append("the guest's /proc/stat was not read at both ends of the window")
    return {"host": host, "guest": gcpu, "notes": notes}


def step_cost(costs: Mapping[str, GuestCost], nbytes: int | None, bytes_source: str | None,
              window_s: float | None) -> StepCost:
    """The step's whole cost: every involved guest's host and guest CPU, their sums, and both per GB.

    ``costs`` are :func:`guest_cost` results by guest; each guest's entry keeps
    them (``host``: threads and profile, ``guest``, ``notes``) beside its figures.

    ``host_measured`` is True only when every guest's QEMU was measured (the
    sums are then the whole host cost of the step).
    """
    guests: dict[str, GuestStepCost] = {}
    for g, c in costs.items():
        host, guest = c["host"], c["guest"]
        roles = host.get("by_role") or {}
        guest_s = guest["cpu_s"] if guest else None
        guests[g] = {"host_cpu_s": host.get("cpu_s"), "host_vcpu_s": roles.get("vCPU"),
                     "host_main_s": roles.get("main loop"), "host_other_s": roles.get("other threads"),
                     "guest_cpu_s": guest_s,
                     "host_cpu_s_per_gb": per_gb(host.get("cpu_s"), nbytes),
                     "guest_cpu_s_per_gb": per_gb(guest_s, nbytes),
                     "host": host, "guest": guest, "notes": list(c["notes"])}
    hosts = [v["host_cpu_s"] for v in guests.values()]
    inside = [v["guest_cpu_s"] for v in guests.values()]
    host_all = all(h is not None for h in hosts) and bool(hosts)
    guest_all = all(x is not None for x in inside) and bool(inside)
    host_s = round(sum(h for h in hosts if h is not None), 3) if host_all else None
    guest_s = round(sum(x for x in inside if x is not None), 3) if guest_all else None
    return {"window_s": window_s, "bytes": nbytes, "bytes_source": bytes_source, "guests": guests,
            "host_measured": host_all, "host_cpu_s": host_s, "guest_cpu_s": guest_s,
            "host_cpu_s_per_gb": per_gb(host_s, nbytes), "guest_cpu_s_per_gb": per_gb(guest_s, nbytes)}
