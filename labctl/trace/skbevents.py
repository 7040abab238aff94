"""Events of ``trace-cmd report -t`` text, as the per-packet latency analysis needs them.

A line looks like::

    iperf3-142   [000]    42.068248717: skb_copy_datagram_iovec: skbaddr=0xffff888005780500 len=13032
    <idle>-0     [000]    42.079727009: ip_rcv_core:          (ffffffff818748f0) skb=0xffff888005780500
    <idle>-0     [000]    42.080002653: skb_try_coalesce_ret: (ffffffff817bfb20 <- ffffffff818921ea) ret=1

(``-t`` prints nanoseconds.) Fields are ``key=value`` words; a kprobe's
leading ``(address)`` is dropped. ``napi_poll`` and ``softirq_*`` have
prose bodies, read by :func:`_prose_fields`. Events the ring buffer lost
show up as a line ``CPU:N [M EVENTS DROPPED]`` (or ``[EVENTS DROPPED]``
when the count is unknown) before the first event after the gap.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass, field

_LINE = re.compile(r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?:\S+\s+)?"
                   r"(?P<sec>\d+)\.(?P<frac>\d+):\s+(?P<event>[A-Za-z0-9_]+):\s?(?P<body>.*)$")
_DROPPED = re.compile(r"^\s*CPU:\s*(?P<cpu>\d+)\s+\[(?:(?P<count>\d+)\s+)?EVENTS DROPPED\]")
_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S*)")
_PROBE_ADDR = re.compile(r"^\([0-9a-f]+(?:\s*<-\s*[0-9a-f]+)?\)\s*")
_NAPI_POLL = re.compile(r"napi struct (?P<napi>0x[0-9a-f]+) for device (?P<dev>\S+) work (?P<work>-?\d+) "
                        r"budget (?P<budget>\d+)")
_SOFTIRQ = re.compile(r"vec=(?P<vec>\d+) \[action=(?P<action>[A-Z_]+)\]")


@dataclass(frozen=True)
class Event:
    ts: int  # nanoseconds (trace clock)
    cpu: int
    comm: str
    pid: int
    name: str
    fields: dict[str, str]

    def addr(self, key: str) -> int | None:
        """A hexadecimal address field (``skbaddr=0xffff...``) as an int."""
        return self._number(key, 16)

    def int(self, key: str) -> int | None:
        """A number field (decimal, or hexadecimal with ``0x``) as an int."""
        return self._number(key, 0)

    def _number(self, key: str, base: builtins.int) -> builtins.int | None:
        value = self.fields.get(key)
        try:
            return int(value, base) if value else None
        except ValueError:
            return None


@dataclass(frozen=True)
class Drop:
    """Events the ring buffer lost on ``cpu`` just before ``ts`` (``count`` None: unknown)."""

    ts: int
    cpu: int
    count: int | None


@dataclass
class TraceLog:
    events: list[Event] = field(default_factory=list)
    drops: list[Drop] = field(default_factory=list)
    unparsed: int = 0  # lines that look like events but could not be read

    @property
    def dropped_events(self) -> int:
        return sum(d.count or 0 for d in self.drops)


def _ns(sec: str, frac: str) -> int:
    return int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])


def _prose_fields(event: str, body: str) -> dict[str, str]:
    if event == "napi_poll":
        m = _NAPI_POLL.search(body)
        return m.groupdict() if m else {}
    if event.startswith("softirq_"):
        m = _SOFTIRQ.search(body)
        return m.groupdict() if m else {}
    return {}


def parse_line(line: str) -> Event | None:
    m = _LINE.match(line)
    if m is None:
        return None
    body = _PROBE_ADDR.sub("", m["body"])
    fields = dict(_FIELD.findall(body))
    fields.update(_prose_fields(m["event"], body))
    return Event(_ns(m["sec"], m["frac"]), int(m["cpu"]), m["comm"].strip(), int(m["pid"]), m["event"], fields)


def parse_report(text: str) -> TraceLog:
    """All events of a ``trace-cmd report -t`` text, sorted by time, and the drop markers.

    A drop marker gets the time of the next event on its CPU. Never raises:
    lines it cannot read are counted in ``unparsed`` (headers such as
    ``cpus=1`` and ``version = 6`` are not counted).
    """
    log = TraceLog()
    pending: dict[int, int | None] = {}  # cpu -> dropped count waiting for that cpu's next event
    for line in text.splitlines():
        d = _DROPPED.match(line)
        if d is not None:
            cpu = int(d["cpu"])
            count = int(d["count"]) if d["count"] else None
            prev = pending.get(cpu, 0) if cpu in pending else 0
            pending[cpu] = None if count is None or prev is None else prev + count
            continue
        ev = parse_line(line)
        if ev is None:
            if re.match(r"^\s*\S.*\[\d+\]\s+\d+\.\d+:", line):
                log.unparsed += 1
            continue
        if ev.cpu in pending:
            log.drops.append(Drop(ev.ts, ev.cpu, pending.pop(ev.cpu)))
        log.events.append(ev)
    log.events.sort(key=lambda e: e.ts)  # stable: same-time events keep their order
    return log
