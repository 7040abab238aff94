"""XDP verdicts, parsed: what xdpdump (xdp-tools) saw each packet's program return, and what the
program's own counters say (a per-action map read with ``bpftool map dump -j``, or ``xdp-filter
status``), as drop-table rows.

An XDP program drops a packet before the kernel makes an skb of it (native mode) or frees that skb
itself (generic), so ``skb:kfree_skb`` does not see its drops as the program's. xdpdump attaches to
the program's exit (fexit) and prints every verdict::

    1796172840.763023040: xdp_drop_icmp()@exit[DROP]: packet size 98 bytes, captured 98 bytes on if_index 2, rx queue 0, id 1
      0x0000:  ff ff ff ff ff ff 52 54 00 6c 99 aa 08 06 00 01  ......RT.l......

and at its end ``N packets captured`` and ``M packets dropped by perf ring`` (verdicts it missed).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace

from labctl.trace.drops import DropRecord

__all__ = ["ACTIONS", "DumpResult", "XdpRow", "counter_values", "filter_status", "parse_dump", "rows"]

ACTIONS = ("ABORTED", "DROP", "PASS", "TX", "REDIRECT")  # by number, as the kernel's enum xdp_action
DROPPING = ("ABORTED", "DROP")  # the verdicts that end a packet in XDP (TX and REDIRECT send it on)
_VERDICT = re.compile(r"^(?P<ts>\d+\.\d+): (?P<func>[\w.]+)\(\)@(?:exit|entry)\[(?P<action>\w+)\]: packet size "
                      r"(?P<size>\d+) bytes, captured (?P<cap>\d+) bytes on if_index (?P<ifindex>\d+)")
_HEX = re.compile(r"^\s+0x[0-9a-f]{4}:\s+((?:[0-9a-f]{2} ?)+)")
_LOST = re.compile(r"^(\d+) packets dropped by perf ring")
_CAPTURED = re.compile(r"^(\d+) packets captured")


@dataclass(frozen=True)
class Verdict:
    """One packet's verdict: the program's function, its action name, the ifindex, the bytes captured."""

    ts: float
    func: str
    action: str
    ifindex: int
    size: int
    data: bytes = b""


@dataclass
class DumpResult:
    """What one xdpdump run printed: the verdicts, how many it said it captured, how many it lost."""

    verdicts: list[Verdict] = field(default_factory=list)
    captured: int | None = None
    lost: int = 0

    def counts(self) -> Counter[str]:
        return Counter(v.action for v in self.verdicts)


def parse_dump(text: str) -> DumpResult:
    """xdpdump's text output (with ``-x``: each packet's bytes after its line)."""
    out = DumpResult()
    cur: Verdict | None = None  # its bytes come with the lines after it
    chunks: list[bytes] = []

    def close() -> None:
        if cur is not None:
            out.verdicts.append(replace(cur, data=b"".join(chunks)))

    for line in text.splitlines():
        m = _VERDICT.match(line)
        if m is not None:
            close()
            cur = Verdict(float(m["ts"]), m["func"], m["action"], int(m["ifindex"]), int(m["size"]))
            chunks = []
            continue
        h = _HEX.match(line)
        if h is not None and cur is not None:
            chunks.append(bytes.fromhex(h.group(1).replace(" ", "")))
            continue
        if (lost := _LOST.match(line)) is not None:
            out.lost = int(lost.group(1))
        elif (cap := _CAPTURED.match(line)) is not None:
            out.captured = int(cap.group(1))
    close()
    return out


def counter_values(dump_json: str) -> dict[str, int]:
    """A per-action map's counts by action name, from ``bpftool map dump -j`` (an array or a per-CPU
    array keyed by the XDP action: per-CPU values are summed); {} when it is not such a map."""
    try:
        entries = json.loads(dump_json or "[]")
    except json.JSONDecodeError:
        return {}
    out: dict[str, int] = {}
    for e in entries if isinstance(entries, list) else []:
        f = e.get("formatted") if isinstance(e, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("key"), int) or not 0 <= f["key"] < len(ACTIONS):
            continue
        if isinstance(f.get("values"), list):
            total = sum(int(v.get("value", 0)) for v in f["values"] if isinstance(v, dict))
        elif isinstance(f.get("value"), int):
            total = f["value"]
        else:
            continue
        out[ACTIONS[f["key"]]] = out.get(ACTIONS[f["key"]], 0) + total
    return out


def filter_status(text: str) -> dict[str, int]:
    """xdp-filter's aggregate per-action counts from ``xdp-filter status`` (``XDP_DROP  12 pkts``)."""
    out: dict[str, int] = {}
    for m in re.finditer(r"^\s*XDP_(\w+)\s+(\d+) pkts", text, re.MULTILINE):
        out[m.group(1)] = int(m.group(2))
    return out


@dataclass
class XdpRow:
    """The XDP drops of one program on one NIC during a step: labctl's count (xdpdump's verdicts), the
    program's own (its counters' growth; None when it has none), what xdpdump missed."""

    guest: str
    nic: str
    program: str
    func: str
    mode: str
    action: str
    count: int
    own: int | None = None
    lost: int = 0

    @property
    def where(self) -> str:
        return f"XDP {self.program} ({self.func}, {self.mode}) on {self.nic}"

    def as_dict(self) -> DropRecord:
        return {"guest": self.guest, "where": self.where, "function": f"xdp:{self.func}", "reason": f"XDP_{self.action}",
                "dev": self.nic, "protocol": "?", "count": self.count, "headers": [],
                "xdp": {"program": self.program, "mode": self.mode, "own_count": self.own, "missed": self.lost}}


def rows(guest: str, nic: str, program: str, mode: str, dump: DumpResult,
         before: dict[str, int] | None, after: dict[str, int] | None) -> list[XdpRow]:
    """The drop rows of one NIC: one per dropping verdict labctl saw or the program counted."""
    seen = dump.counts()
    func = next((v.func for v in dump.verdicts), program)
    out = []
    for action in DROPPING:
        own = None if before is None or after is None else after.get(action, 0) - before.get(action, 0)
        if seen.get(action, 0) or own:
            out.append(XdpRow(guest, nic, program, func, mode, action, seen.get(action, 0), own, dump.lost))
    return out
