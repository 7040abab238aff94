"""The XDP drops of a step, per NIC with an XDP program (:mod:`labctl.lab.xdp`): xdpdump (xdp-tools)
on the program's exit for the step's span, and the program's own counters before and after.

:func:`start` reads the counters and starts one ``xdpdump -i NIC --rx-capture exit -x`` per NIC in the
guest (its output in ``/run/labctl-xdp/``, line-buffered), and returns once each says it listens;
:func:`finish` stops them (SIGINT: they print what they captured and what their perf ring lost),
reads the counters again and gives the rows of :func:`labctl.trace.xdpverdicts.rows`: labctl's count
of each dropping verdict next to the program's own. Its counters are the ``counters`` map of a built
program, or ``xdp-filter status``'s aggregate (one xdp-filter NIC per guest keeps it per NIC).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from labctl.lab import Xdp, nic_xdp
from labctl.ssh import Session
from labctl.trace import XdpRow, parse_xdpdump, xdp_counter_values, xdp_filter_status, xdp_rows

DIR = "/run/labctl-xdp"
START_TIMEOUT = 90.0
_COUNTERS_BEGIN, _COUNTERS_END = "labctl-xdp-counters-begin", "labctl-xdp-counters-end"


@dataclass
class XdpWatch:
    """One guest's XDP watch: its NICs with programs, the counters when it started."""

    guest: str
    nics: dict[str, Xdp]
    before: dict[str, dict[str, int] | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tag: str = "d"  # its files' prefix: a step's drops (d) and its follow (f) watch the same NICs

    def file(self, nic: str, ext: str) -> str:
        return f"{DIR}/dump-{self.tag}-{nic}.{ext}"


def programs(nics: Sequence[Mapping[str, Any]]) -> dict[str, Xdp]:
    """The guest's NICs (``to_dict()`` form) that have an XDP program, by name."""
    out = {}
    for n in nics:
        x = nic_xdp(dict(n))
        if x is not None:
            out[str(n.get("name"))] = x
    return out


def _counters_command(nic: str, x: Xdp) -> str:
    """Prints the program's own counters between markers (nothing when it has none)."""
    if x.source is None:
        body = "xdp-filter status"
    elif x.counters:
        q, name = shlex.quote(nic), shlex.quote(x.counters[:15])
        body = (f"p=$(ip -d link show dev {q} | sed -n 's/.*prog\\/xdp id \\([0-9]*\\).*/\\1/p' | head -n 1); "
                f"for m in $(bpftool prog show id \"$p\" | sed -n 's/.*map_ids \\([0-9,]*\\).*/\\1/p' | tr , ' '); do "
                f"bpftool map show id \"$m\" | grep -q \" name {name} \" && bpftool map dump id \"$m\" -j; done")
    else:
        return ""
    return f"echo {_COUNTERS_BEGIN} {nic}; {body}; echo {_COUNTERS_END}"


def _counters(out: str, nics: Mapping[str, Xdp]) -> dict[str, dict[str, int] | None]:
    found: dict[str, dict[str, int] | None] = {n: None for n in nics}
    for part in out.split(_COUNTERS_BEGIN + " ")[1:]:
        nic, _, rest = part.partition("\n")
        body = rest.partition(_COUNTERS_END)[0]
        x = nics.get(nic.strip())
        if x is None:
            continue
        found[nic.strip()] = xdp_filter_status(body) if x.source is None else xdp_counter_values(body)
    return found


def _read_counters(session: Session, nics: Mapping[str, Xdp]) -> dict[str, dict[str, int] | None]:
    cmd = "; ".join(c for c in (_counters_command(n, x) for n, x in nics.items()) if c)
    if not cmd:
        return {n: None for n in nics}
    return _counters(session.run(cmd, timeout=60).stdout.decode(errors="replace"), nics)


def start(session: Session, guest: str, nics: Sequence[Mapping[str, Any]], tag: str = "d",
          counters: bool = True) -> XdpWatch | None:
    """Start watching ``guest``'s XDP verdicts; None when none of its NICs has a program.

    :raise GuestError: when the guest cannot be reached.
    """
    progs = programs(nics)
    if not progs:
        return None
    w = XdpWatch(guest, progs, tag=tag)
    w.before = _read_counters(session, progs) if counters else {}
    cmds = [f"umask 077; mkdir -p {DIR}"]
    for nic in progs:
        q, txt, err, pid = (shlex.quote(x) for x in (nic, w.file(nic, "txt"), w.file(nic, "err"), w.file(nic, "pid")))
        cmds.append(f"rm -f {txt} {err}; setsid sh -c 'exec stdbuf -oL xdpdump -i {q} --rx-capture exit -x "
                    f"> {txt} 2> {err}' </dev/null >/dev/null 2>&1 & echo $! > {pid}")
    session.run("; ".join(cmds), timeout=60)
    deadline = time.monotonic() + START_TIMEOUT
    waiting = set(progs)
    while waiting and time.monotonic() < deadline:
        check = "; ".join(f"grep -q 'listening on' {w.file(n, 'err')} && echo ok {n}" for n in sorted(waiting))
        out = session.run(check + "; true", timeout=60).stdout.decode(errors="replace")
        waiting -= {ln.split()[1] for ln in out.splitlines() if ln.startswith("ok ")}
        if waiting:
            time.sleep(0.5)
    for nic in sorted(waiting):
        err = session.run(f"cat {w.file(nic, 'err')}", timeout=30).stdout.decode(errors="replace").strip()
        w.notes.append(f"{nic}: xdpdump did not start: {err[-300:] or 'no answer'}")
    return w


def stop_texts(session: Session, w: XdpWatch) -> dict[str, str]:
    """Stop the watch's xdpdumps; what each printed, by NIC (its files removed).

    :raise GuestError: when the guest cannot be reached.
    """
    stop = "; ".join(f"kill -INT $(cat {w.file(n, 'pid')}) 2>/dev/null" for n in w.nics)
    wait = " && ".join(f"grep -q 'dropped by perf ring' {w.file(n, 'err')}" for n in w.nics)  # its last words
    session.run(f"{stop}; for i in $(seq 120); do {{ {wait}; }} && break; sleep 0.5; done; true", timeout=120)
    out = {}
    for nic in w.nics:
        out[nic] = session.run(f"cat {w.file(nic, 'txt')} {w.file(nic, 'err')}; rm -f {DIR}/dump-{w.tag}-{nic}.*",
                               timeout=120).stdout.decode(errors="replace")
    return out


def finish(session: Session, w: XdpWatch) -> list[XdpRow]:
    """Stop the watch's xdpdumps and read them and the counters: the rows of the step's XDP drops.

    :raise GuestError: when the guest cannot be reached.
    """
    texts = stop_texts(session, w)
    after = _read_counters(session, w.nics)
    out: list[XdpRow] = []
    for nic, x in w.nics.items():
        out += xdp_rows(w.guest, nic, x.program, x.mode, parse_xdpdump(texts[nic]), w.before.get(nic),
                        after.get(nic))
    return out
