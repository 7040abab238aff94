"""``labctl follow LAB FILTER [-c N] [--json]``: each matching packet's path through the lab, live.

The filter is pcap-filter syntax (checked by libpcap, ``tcpdump -d``) in the subset labctl follows
(:mod:`labctl.pktfilter`); a bad filter, guest or option is refused with exit status 2 before
anything starts, and a guest whose kernel cannot follow with exit 1, also before anything starts.
Each packet is printed once its path ended, hop by hop: time since its first hop, time since the
previous hop, the guest, the function or tracepoint, the device, the task; the wire between two
guests is a hop of its own; then how it ended. ``--json``: one JSON object per packet and line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.text import Text

from labctl.backends import get_backend
from labctl.cli.ui import console, out, safe, warn
from labctl.errors import UsageError
from labctl.follow import Follower, LiveFollow, Recent, XdpFollow, libpcap_error
from labctl.lab import close_match
from labctl.pktfilter import FilterError, parse
from labctl.state import LabState
from labctl.trace import Journey


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("follow", help="follow matching packets through every guest's kernel and wire, live",
                       description="Print each packet that matches FILTER (pcap-filter syntax: host, net, port, "
                                   "icmp/icmp6/tcp/udp, ip/ip6/arp, IPv4 and IPv6 addresses, and/or/not; 'vlan [ID] and ...' "
                                   "for the journeys on a VLAN) with its path hop by hop through the lab's kernels "
                                   "and wires, and where it ended: delivered, dropped (where, why), lost on the "
                                   "wire. Ctrl-C stops.")
    p.add_argument("lab")
    p.add_argument("filter", help="pcap-filter expression, e.g. 'icmp and host 10.0.0.2', 'icmp6 and net fd00:2::/64', "
                        "'arp host 10.1.0.99', 'vlan 10 and icmp' ('': every IPv4, IPv6 and ARP packet)")
    p.add_argument("-c", "--count", type=int, metavar="N", help="stop after N packets")
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this many seconds")
    p.add_argument("--guests", metavar="G,G...", help="follow on these guests only (default: all)")
    p.add_argument("--no-wire", action="store_true", help="do not capture the host side of the NICs")
    p.add_argument("--json", action="store_true", help="one JSON object per packet and line")
    p.set_defaults(func=cmd_follow)


def _guests(state: LabState, text: str | None) -> list[str]:
    if not text:
        return list(state.guests)
    names = [g.strip() for g in text.split(",") if g.strip()]
    for g in names:
        if g not in state.guests:
            raise UsageError(f"lab '{state.lab}' has no guest '{g}'{close_match(g, state.guests)}",
                             hint=f"its guests: {', '.join(state.guests)}")
    return list(dict.fromkeys(names))


def _check(args: argparse.Namespace) -> None:
    if args.count is not None and args.count < 1:
        raise UsageError("-c must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be more than 0 seconds")
    why = libpcap_error(args.filter) if args.filter.strip() else None
    if why:
        raise UsageError(f"bad filter '{args.filter}': {why}", hint="pcap-filter syntax, as tcpdump takes it")


def cmd_follow(args: argparse.Namespace) -> int:
    _check(args)
    try:
        node = parse(args.filter)
    except FilterError as exc:
        raise UsageError(str(exc)) from exc
    state = LabState.load(args.lab)
    guests = _guests(state, args.guests)
    f = Follower(state, get_backend(state.backend), guests, node, wire=not args.no_wire)
    f.check()
    recent = Recent(state)
    said: set[str] = set()
    xdp = XdpFollow(f)  # XDP verdicts as hops and ends (labctl.follow.xdpfollow)
    try:
        f.start()
        xdp.start()
        f.warnings += xdp.warnings
        for w in f.warnings:
            warn(w)
            said.add(w)
        console.print(Text(f"following '{args.filter}' on {', '.join(guests)} of lab {state.lab}; Ctrl-C stops",
                           style="dim"))
        started = time.monotonic()

        def done() -> bool:
            recent.tick()
            return args.duration is not None and time.monotonic() - started >= args.duration

        def show(j: Journey) -> None:
            xdp.fix(j)
            recent.add(j)
            if not said.intersection({"clocks"}) and not args.json:
                said.add("clocks")
                console.print(Text("clocks mapped onto the host's within " + ", ".join(
                    f"{g} ±{c.bound_ns / 1000:.0f} µs" for g, c in live.stats.clocks.items() if c.known), style="dim"))
            if args.json:
                sys.stdout.write(json.dumps(j.as_dict()) + "\n")
                sys.stdout.flush()
            else:
                print_journey(j)

        live = LiveFollow(f, show)
        try:
            stats = live.run(done, args.count)
        except KeyboardInterrupt:
            stats = live.stats
        bounds = ", ".join(f"{g} ±{c.bound_ns / 1000:.0f} µs" for g, c in stats.clocks.items() if c.known)
        lost = ", ".join(f"{g}: {n}" for g, n in stats.lost.items() if n)
        console.print(Text(f"{stats.journeys} packets followed; clock bounds {bounds or 'unknown'}"
                           + (f"; events lost {lost}" if lost else "")
                           + (f"; stream ended on {', '.join(stats.ended)}" if stats.ended else ""), style="dim"))
    finally:
        recent.flush()
        xdp.stop()
        for w in f.stop() + xdp.warnings:
            if w not in said:
                warn(w)
        f.close()
    return 0


def print_journey(j: Journey) -> None:
    """A packet's path as the terminal shows it."""
    d = j.as_dict()
    end = d["end"]
    style = "bold red" if end.get("kind") in ("dropped", "lost") else "bold"
    head = Text(f"#{d['id']} ", style="bold")
    head.append(safe(d["packet"], multiline=False))
    head.append(": ")
    head.append(safe(str(end.get("text")), style, multiline=False))
    out.print(head)
    for h in d["hops"]:
        delta = "" if h["delta_us"] is None else f"{h['delta_us'] / 1000:+.3f}"
        where = f"{h['where']} {h['dev']}" if h.get("dev") else h["where"]
        line = Text(f"  {h['t_us'] / 1000:9.3f} ms {delta:>9}  ")
        line.append(safe(f"{'' if h['point'] == 'wire' else h['guest']:<8} ", multiline=False))
        line.append(safe(where, "cyan" if h["point"] == "wire" else "", multiline=False))
        if h.get("task"):
            line.append(safe(f"  [{h['task']}]", "dim", multiline=False))
        if h.get("note"):
            line.append(safe(f"  {h['note']}", "dim", multiline=False))
        out.print(line)
