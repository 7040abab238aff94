"""Network statistics snapshots taken in a guest before and after a step.

:func:`snapshot_commands` says what to run in the guest; the runner stores
each command's output as ``stats/before/<stem>.txt`` and
``stats/after/<stem>.txt`` and records each command's exit status itself.
Every command merges stderr into stdout (``2>&1``) so that a missing tool or
an unsupported ioctl leaves its message in the file instead of failing the
snapshot: ``ethtool -c`` on an 8139cp NIC, for example, prints
``netlink error: Operation not supported`` and exits 1.

The parsers here never raise on odd input: a line they do not understand is
skipped, and text with nothing they understand gives an empty result.
:func:`snapshot_delta` compares two snapshot directories and
:func:`write_delta` stores the result as ``stats/delta.json``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypedDict

from labctl.trace.parsers import read_or_none

SNAPSHOTS: dict[str, str] = {
    # -a: absolute values (ignore nstat's history file), -s: leave the
    # history alone, -z: zero counters too; so every run prints the same set.
    "nstat": "nstat -a -s -z",
    "netstat-s": "netstat -s",
    "snmp": "cat /proc/net/snmp",
    "netstat-proc": "cat /proc/net/netstat",
    "softnet_stat": "cat /proc/net/softnet_stat",
    "interrupts": "cat /proc/interrupts",
    "softirqs": "cat /proc/softirqs",
    "ss-tin": "ss -tin",
    "netdev": "cat /proc/net/dev",  # bytes per NIC: the step's bytes moved when no transfer tool says
}
"""Stem -> command for the snapshots that do not depend on a NIC."""

_CAT = re.compile(r"cat (/proc/[\w/]+)")


def _builtin_read(command: str) -> str:
    """``cat /proc/FILE`` as bash builtins where the guest's shell is bash (the same bytes, no process:
    under TCG each process a snapshot starts costs about 60 ms of the guest's only CPU), else as is."""
    m = _CAT.fullmatch(command)
    if m is None:
        return command
    path = m.group(1)
    return (f'if [ -n "$BASH_VERSION" ]; then mapfile -t _l < {path} && '
            f'{{ [ ${{#_l[@]}} -eq 0 ] || printf \'%s\\n\' "${{_l[@]}}"; }}; else {command}; fi')

NIC_SNAPSHOTS: dict[str, str] = {
    "ethtool-S": "ethtool -S {nic}",
    "ethtool-i": "ethtool -i {nic}",
    "ethtool-g": "ethtool -g {nic}",
    "ethtool-c": "ethtool -c {nic}",
    "ethtool-k": "ethtool -k {nic}",
    "link": "ip -s -j link show dev {nic}",
}
"""Stem prefix -> command template for the per-NIC snapshots (``<prefix>-<nic>``)."""

NIC_SETTINGS = frozenset({"ethtool-i", "ethtool-g", "ethtool-c", "ethtool-k"})
"""The per-NIC snapshots that describe the NIC's settings (no counters): taken before a step only."""

SOFTNET_COLUMNS: tuple[str, ...] = (
    "processed", "dropped", "time_squeeze", "unused3",
    "fastroute_hit", "fastroute_success", "fastroute_defer", "fastroute_deferred_out",
    "cpu_collision", "received_rps", "flow_limit_count", "backlog_len", "cpu",
)
"""Columns of ``/proc/net/softnet_stat`` in Linux 6.1 (``softnet_seq_show``).

Columns 3..8 are always 0 (``fastroute`` and ``cpu_collision`` are long gone).
``backlog_len`` is a gauge and ``cpu`` the CPU's index; both appear since
Linux 5.10. Newer kernels may append columns; they are kept as ``colN``.
"""

SOFTNET_SUMMED: tuple[str, ...] = ("processed", "dropped", "time_squeeze")
"""Softnet counters whose deltas are also summed over all CPUs."""

SOFTNET_COUNTERS: tuple[str, ...] = ("processed", "dropped", "time_squeeze", "received_rps", "flow_limit_count")
"""Softnet columns that are live counters in 6.1 (the others are always 0, a gauge or the CPU index)."""


def snapshot_commands(nics: list[str], phase: str = "before") -> dict[str, str]:
    """File stem -> shell command for every snapshot of ``phase`` (``before`` or ``after``), NIC names
    shell-quoted.

    Each command ends in ``2>&1`` (see the module docstring), so store
    what the command writes to stdout, e.g. the SSH channel's stdout, or
    run ``( CMD ) > FILE``: appending ``> FILE`` to the command itself
    would send stderr elsewhere. Stems are unique and safe as file names as
    long as the NIC names are (the lab model validates them). The NIC's settings
    (:data:`NIC_SETTINGS`: ``ethtool -i/-g/-c/-k``) are taken before the step only: they have no
    delta, and each is a process that costs the guest about 0.15 s under TCG. Raises nothing.
    """
    cmds = {stem: f"{_builtin_read(cmd)} 2>&1" for stem, cmd in SNAPSHOTS.items()}
    for nic in nics:
        for prefix, template in NIC_SNAPSHOTS.items():
            if phase == "after" and prefix in NIC_SETTINGS:
                continue
            cmds[f"{prefix}-{nic}"] = template.format(nic=shlex.quote(nic)) + " 2>&1"
    return cmds


# --------------------------------------------------------------------------- parsers

def _int(text: str, base: int = 10) -> int | None:
    """``int(text, base)`` or None."""
    try:
        return int(text, base)
    except ValueError:
        return None


def parse_softnet_stat(text: str) -> list[dict[str, int]]:
    """One dict per line of ``/proc/net/softnet_stat`` (hex columns decoded).

    Keys are :data:`SOFTNET_COLUMNS` (extra columns as ``colN``). A line
    without the ``cpu`` column (kernels before 5.10) gets ``cpu`` = its line
    number, which is only right when no CPU is offline. Lines that are not
    all hex are skipped.
    """
    rows: list[dict[str, int]] = []
    for line in text.splitlines():
        values = [_int(field, 16) for field in line.split()]
        if not values or any(v is None for v in values):
            continue
        names = [SOFTNET_COLUMNS[i] if i < len(SOFTNET_COLUMNS) else f"col{i}" for i in range(len(values))]
        row = {name: v for name, v in zip(names, values) if v is not None}
        row.setdefault("cpu", len(rows))
        rows.append(row)
    return rows


def parse_snmp(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/snmp`` or ``/proc/net/netstat`` as ``{"Ip": {"ReasmFails": 0, ...}}``.

    Both files are pairs of lines, ``Prefix: Name1 Name2 ...`` then
    ``Prefix: v1 v2 ...``. A pair whose lengths differ keeps the common
    part; values that are not integers (none today) are dropped.
    """
    out: dict[str, dict[str, int]] = {}
    header: tuple[str, list[str]] | None = None
    for line in text.splitlines():
        prefix, sep, rest = line.partition(":")
        if not sep or not prefix or prefix != prefix.strip() or " " in prefix:
            header = None
            continue
        fields = rest.split()
        if header is not None and header[0] == prefix and fields and all(_int(f) is not None for f in fields):
            table = out.setdefault(prefix, {})
            for name, value in zip(header[1], fields):
                table[name] = int(value)
            header = None
        else:
            header = (prefix, fields)
    return out


def parse_nstat(text: str) -> dict[str, int]:
    """``nstat`` output (``Name value rate`` lines) as ``{"IpInReceives": 80, ...}``.

    The ``#kernel`` line and anything that is not a name and an integer is
    skipped.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#") and (value := _int(fields[1])) is not None:
            out[fields[0]] = value
    return out


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """``ethtool -S`` output as ``{"tx_ok": 11, ...}``.

    Only indented ``name: integer`` lines count, so the ``NIC statistics:``
    header and error messages (``Operation not supported``, ``no stats
    available``) give an empty dict.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line[:1].isspace():
            continue
        name, sep, value = line.strip().rpartition(":")
        if sep and name and (number := _int(value.strip())) is not None:
            out[name] = number
    return out


def parse_link_stats(text: str) -> dict[str, int]:
    """``ip -s -j link show dev NIC`` as ``{"rx_packets": 12, "tx_bytes": ..., "rx_dropped": ...}``.

    Every integer under ``stats64`` (else ``stats``) ``rx``/``tx``, prefixed
    with its direction. Anything else (an error message) gives an empty dict.
    """
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    link = doc[0] if isinstance(doc, list) and doc and isinstance(doc[0], dict) else {}
    stats = link.get("stats64") or link.get("stats") or {}
    out: dict[str, int] = {}
    for direction in ("rx", "tx"):
        counters = stats.get(direction) if isinstance(stats, dict) else None
        for name, value in (counters or {}).items():
            if isinstance(value, int) and not isinstance(value, bool):
                out[f"{direction}_{name}"] = value
    return out


def parse_ethtool_info(text: str) -> dict[str, str]:
    """``ethtool -i`` output as ``{"driver": "8139cp", "bus-info": ...}``.

    Values are stripped and may be empty (``firmware-version:``). Lines
    without a colon, and error messages, are skipped; an unknown device
    gives an empty dict.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key and re.fullmatch(r"[a-z][a-z-]*", key):
            out[key] = value.strip()
    return out


class IrqCounts(TypedDict):
    """One ``/proc/interrupts`` row (or its delta): a count per CPU, their total, the row's name."""

    cpus: list[int]
    total: int
    name: str


class SoftirqDelta(TypedDict):
    """One softirq's change over a step: per CPU and in all."""

    cpus: list[int]
    total: int


class SoftnetDelta(TypedDict):
    """``/proc/net/softnet_stat``'s change over a step (:func:`softnet_delta`)."""

    per_cpu: dict[str, dict[str, int]]  # CPU -> every SOFTNET_COUNTERS counter's change
    total: dict[str, int]  # SOFTNET_SUMMED, summed over the CPUs


def parse_interrupts(text: str) -> dict[str, IrqCounts]:
    """``/proc/interrupts`` as ``{"11": {"cpus": [n0, n1], "total": n, "name": "IO-APIC 11-fasteoi eth1"}}``.

    The first line names the CPUs; each row has one count per CPU (rows
    such as ``ERR:`` and ``MIS:`` have a single count). ``name`` is the rest
    of the row with runs of spaces collapsed. Returns {} when there is no
    CPU header.
    """
    lines = text.splitlines()
    ncpu = len([f for f in lines[0].split() if f.startswith("CPU")]) if lines else 0
    if ncpu == 0:
        return {}
    out: dict[str, IrqCounts] = {}
    for line in lines[1:]:
        irq, sep, rest = line.partition(":")
        if not sep or not irq.strip():
            continue
        fields = rest.split()
        counts: list[int] = []
        while fields and len(counts) < ncpu and (value := _int(fields[0])) is not None:
            counts.append(value)
            fields.pop(0)
        out[irq.strip()] = {"cpus": counts, "total": sum(counts), "name": " ".join(fields)}
    return out


def parse_softirqs(text: str) -> dict[str, list[int]]:
    """``/proc/softirqs`` as ``{"NET_RX": [cpu0, cpu1, ...], ...}``.

    Lines with non-integer counts are skipped; the CPU header is ignored.
    """
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        counts = [_int(f) for f in rest.split()]
        if sep and name.strip() and counts and all(c is not None for c in counts):
            out[name.strip()] = [c for c in counts if c is not None]
    return out


# --------------------------------------------------------------------------- deltas

def _changed(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """after - before for counters present in both whose value changed."""
    return {k: after[k] - before[k] for k in after if k in before and after[k] != before[k]}


def _delta_nested(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """:func:`_changed` per table, leaving out tables with no change."""
    out = {t: _changed(before.get(t, {}), rows) for t, rows in after.items()}
    return {t: d for t, d in out.items() if d}


def _delta_interrupts(before: dict[str, IrqCounts], after: dict[str, IrqCounts]) -> dict[str, IrqCounts]:
    """Per IRQ: per-CPU and total deltas, name; only IRQs whose total changed."""
    out: dict[str, IrqCounts] = {}
    for irq, row in after.items():
        old = before.get(irq)
        if old is None or old["total"] == row["total"]:
            continue
        cpus = [a - b for a, b in zip(row["cpus"], old["cpus"])]
        out[irq] = {"cpus": cpus, "total": row["total"] - old["total"], "name": row["name"]}
    return out


def _delta_softirqs(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, SoftirqDelta]:
    """Per softirq: per-CPU and total deltas; only softirqs that changed."""
    out: dict[str, SoftirqDelta] = {}
    for name, counts in after.items():
        cpus = [a - b for a, b in zip(counts, before.get(name, []))]
        if name in before and any(cpus):
            out[name] = {"cpus": cpus, "total": sum(cpus)}
    return out


def softnet_delta(before: list[dict[str, int]], after: list[dict[str, int]]) -> SoftnetDelta:
    """Per-CPU deltas of the softnet counters and sums of :data:`SOFTNET_SUMMED`.

    Returns ``{"per_cpu": {"0": {"processed": 5, ...}, ...}, "total":
    {"processed": .., "dropped": .., "time_squeeze": ..}}``. CPUs are matched
    by their ``cpu`` column; a CPU present on one side only is left out.
    ``per_cpu`` lists every :data:`SOFTNET_COUNTERS` counter of each CPU,
    changed or not, so the table has the same shape for every CPU.
    """
    old = {row["cpu"]: row for row in before}
    per_cpu: dict[str, dict[str, int]] = {}
    for row in after:
        prev = old.get(row["cpu"])
        if prev is not None:
            per_cpu[str(row["cpu"])] = {k: row[k] - prev[k] for k in SOFTNET_COUNTERS if k in row and k in prev}
    total = {k: sum(d.get(k, 0) for d in per_cpu.values()) for k in SOFTNET_SUMMED}
    return {"per_cpu": per_cpu, "total": total}


KindDelta = dict[str, int] | dict[str, dict[str, int]] | SoftnetDelta | dict[str, IrqCounts] | dict[str, SoftirqDelta]
"""One snapshot's delta: counters (nstat, ethtool -S, link), tables of counters (snmp, netstat), softnet's,
interrupts', softirqs'."""
StatDelta = KindDelta | list[str]  # a value of delta.json: a snapshot's delta, or the stems missing
_Delta = Callable[[str, str], KindDelta]

_KINDS: dict[str, _Delta] = {
    "nstat": lambda b, a: _changed(parse_nstat(b), parse_nstat(a)),
    "snmp": lambda b, a: _delta_nested(parse_snmp(b), parse_snmp(a)),
    "netstat-proc": lambda b, a: _delta_nested(parse_snmp(b), parse_snmp(a)),
    "softnet_stat": lambda b, a: softnet_delta(parse_softnet_stat(b), parse_softnet_stat(a)),
    "interrupts": lambda b, a: _delta_interrupts(parse_interrupts(b), parse_interrupts(a)),
    "softirqs": lambda b, a: _delta_softirqs(parse_softirqs(b), parse_softirqs(a)),
    "ethtool-S": lambda b, a: _changed(parse_ethtool_stats(b), parse_ethtool_stats(a)),
    "link": lambda b, a: _changed(parse_link_stats(b), parse_link_stats(a)),
}
"""Snapshot kind -> delta function. Kinds not listed (netstat -s, ss, ethtool
-i/-g/-c/-k) are descriptive and get no delta."""


def _kind(stem: str) -> str:
    """``ethtool-S-eth1`` -> ``ethtool-S``; NIC-less stems are their own kind."""
    for prefix in NIC_SNAPSHOTS:
        if stem.startswith(prefix + "-"):
            return prefix
    return stem


def _stems(directory: Path) -> Iterable[str]:
    """Sorted stems of the ``*.txt`` files in ``directory`` (none if it is missing)."""
    try:
        return sorted(p.stem for p in directory.glob("*.txt") if p.is_file())
    except OSError:
        return []


def snapshot_delta(before_dir: Path, after_dir: Path) -> dict[str, StatDelta]:
    """Counter deltas between two snapshot directories, JSON-able.

    Keys are snapshot stems with a delta kind (``nstat``, ``snmp``,
    ``netstat-proc``, ``softnet_stat``, ``interrupts``, ``softirqs``,
    ``ethtool-S-<nic>``); values hold only counters that changed, except
    ``softnet_stat`` (see :func:`softnet_delta`). A stem missing on either
    side, or unreadable, is listed under ``"missing"``; a kind whose text
    parses to nothing on both sides gives an empty dict (e.g. ``ethtool -S``
    on a NIC without statistics). Raises nothing.
    """
    out: dict[str, StatDelta] = {}
    missing: list[str] = []
    for stem in sorted(set(_stems(before_dir)) | set(_stems(after_dir))):
        func = _KINDS.get(_kind(stem))
        if func is None:
            continue
        before, after = read_or_none(before_dir / f"{stem}.txt"), read_or_none(after_dir / f"{stem}.txt")
        if before is None or after is None:
            missing.append(stem)
            continue
        out[stem] = func(before, after)
    out["missing"] = missing
    return out


def write_delta(guest_dir: Path) -> Path:
    """Write ``snapshot_delta(stats/before, stats/after)`` to ``guest_dir/stats/delta.json``.

    Returns the path written. Raises OSError only if the file cannot be
    written (missing snapshot directories just give an empty delta).
    """
    stats = guest_dir / "stats"
    delta = snapshot_delta(stats / "before", stats / "after")
    stats.mkdir(parents=True, exist_ok=True)
    path = stats / "delta.json"
    path.write_text(json.dumps(delta, indent=2, sort_keys=True) + "\n")
    return path
