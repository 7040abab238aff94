"""Analysis of what tracers leave in a step's guest directory: pure functions of files.

* :mod:`.parsers`: perf, trace-cmd, mpstat, iperf3 and wget output;
* :mod:`.stats`: network statistics snapshots, their parsers and before/after deltas;
* :mod:`.analyze`: one guest's figures for one step (:func:`~.analyze.guest_figures`);
* :mod:`.skbevents`, :mod:`.skbpath`, :mod:`.skblatency`: per-packet latency;
* :mod:`.netfigures`: receive work per CPU, reassembly, UDP loss, a step's captures read back;
* :mod:`.tpcounts`: tracepoint counts per command and CPU;
* :mod:`.hostcost`: the whole cost of a step (each QEMU on the host, the guest's CPU, per GB);
* :mod:`.flamefold`: perf script folded into flame graph stacks;
* :mod:`.ktap`: the kernel's KTAP test output (selftests);
* :mod:`.hops`, :mod:`.clocks`, :mod:`.journey`, :mod:`.journeyfiles`: packets followed through the lab's kernels and wires;
  :mod:`.pathmodel`: a followed packet's path as data, grouped by path; :mod:`.hoporder`: its hops in the wire's order;
  :mod:`.ends`: how its path ended;
  :mod:`.nfhops`: their NAT rewrites, conntrack states and nftables chains and rules;
  :mod:`.encap`: through a tunnel (the inner packet followed, the outer one its wire);
  :mod:`.vlanhops`: the 802.1Q VLANs a packet travelled on (what a filter's ``vlan`` keeps);
* :mod:`.drops`: every skb a guest dropped, as a table; which netfilter rule dropped;
* :mod:`.xdpverdicts`, :mod:`.xdphops`: XDP programs' verdicts (xdpdump's) and own counters, as drop rows and as
  a followed packet's hop and end;
* :mod:`.bpfmaps`: a bpftrace program's maps and histograms;
* :mod:`.perfetto`, :mod:`.tracks`, :mod:`.tef`: recordings as Perfetto timelines (Trace Event Format).

The guest commands that produce these files are :mod:`labctl.steps`'.
Standard library only; functions return what they could compute and say
why in warnings rather than raise on odd input. Must not import steps,
bundles, reports, backends or the CLI.

Imports never: labctl.steps, labctl.bundle, labctl.report, labctl.backends, labctl.cli, labctl.state, labctl.live, labctl.training
"""

from __future__ import annotations

from labctl.trace.analyze import GuestFigures, guest_figures, step_figures
from labctl.trace.bpfmaps import BPFTRACE_JSON, BpftraceSummary, bucket_label
from labctl.trace.bpfmaps import summary as bpftrace_summary
from labctl.trace.clocks import Clock
from labctl.trace.drops import DropRecord, DropRow, DropSummary, GuestDrops, netfilter_note
from labctl.trace.drops import table as drop_table
from labctl.trace.flamefold import FlameFigures, Frame, Stack, guest_flamegraph, read_folded
from labctl.trace.hops import PARSERS, Event, frame_vlans, parse_frame, parse_ipv4, parse_line, parse_text, window_words
from labctl.trace.hops import Header as PacketHeader
from labctl.trace.hostcost import (
    KINDS,
    PERF_DATA,
    PERF_LOG,
    PERF_SCRIPT,
    PROFILE_UNAVAILABLE,
    THREADS_FILE,
    WINDOW_END,
    WINDOW_START,
    GuestCost,
    StepCost,
    TaskStats,
    ThreadsDoc,
    guest_cost,
    nic_bytes,
    step_cost,
)
from labctl.trace.journey import Correlator
from labctl.trace.journeyfiles import (
    FOLLOW_DIR,
    FOLLOW_INPUTS,
    JOURNEY_JSON,
    JOURNEY_TRACE,
    FollowSummary,
    follow_inputs,
)
from labctl.trace.journeyfiles import analyze as analyze_follow
from labctl.trace.ktap import FAIL as KTAP_FAIL
from labctl.trace.ktap import SKIP as KTAP_SKIP
from labctl.trace.ktap import counts as ktap_counts
from labctl.trace.ktap import kselftest_name
from labctl.trace.ktap import parse_text as parse_ktap
from labctl.trace.ktap import walk as walk_ktap
from labctl.trace.netfigures import capture_figures
from labctl.trace.pathmodel import Journey, PathHop, Topology, Wire
from labctl.trace.perfetto import TRACE_JSON, guest_trace, trace_summary
from labctl.trace.skblatency import DirectionFigures, GroupFigures, Latency, Lost, SkbLatency
from labctl.trace.stats import snapshot_commands, write_delta
from labctl.trace.tef import write_trace
from labctl.trace.tpcounts import CountSource, EventCount
from labctl.trace.xdphops import CANDIDATE_ENDS as XDP_CANDIDATE_ENDS
from labctl.trace.xdphops import XDP_FILE, XdpVerdicts
from labctl.trace.xdpverdicts import XdpRow
from labctl.trace.xdpverdicts import counter_values as xdp_counter_values
from labctl.trace.xdpverdicts import filter_status as xdp_filter_status
from labctl.trace.xdpverdicts import parse_dump as parse_xdpdump
from labctl.trace.xdpverdicts import rows as xdp_rows

__all__ = [
    "BPFTRACE_JSON",
    "FOLLOW_DIR",
    "FOLLOW_INPUTS",
    "JOURNEY_JSON",
    "JOURNEY_TRACE",
    "KINDS",
    "KTAP_FAIL",
    "KTAP_SKIP",
    "PARSERS",
    "PERF_DATA",
    "PERF_LOG",
    "PERF_SCRIPT",
    "PROFILE_UNAVAILABLE",
    "THREADS_FILE",
    "TRACE_JSON",
    "WINDOW_END",
    "WINDOW_START",
    "XDP_CANDIDATE_ENDS",
    "XDP_FILE",
    "BpftraceSummary",
    "Clock",
    "Correlator",
    "CountSource",
    "DirectionFigures",
    "DropRecord",
    "DropRow",
    "DropSummary",
    "Event",
    "EventCount",
    "FlameFigures",
    "FollowSummary",
    "Frame",
    "GroupFigures",
    "GuestCost",
    "GuestDrops",
    "GuestFigures",
    "Journey",
    "Latency",
    "Lost",
    "PacketHeader",
    "PathHop",
    "SkbLatency",
    "Stack",
    "StepCost",
    "TaskStats",
    "ThreadsDoc",
    "Topology",
    "Wire",
    "XdpRow",
    "XdpVerdicts",
    "analyze_follow",
    "bpftrace_summary",
    "bucket_label",
    "capture_figures",
    "drop_table",
    "follow_inputs",
    "frame_vlans",
    "guest_cost",
    "guest_figures",
    "guest_flamegraph",
    "guest_trace",
    "kselftest_name",
    "ktap_counts",
    "netfilter_note",
    "nic_bytes",
    "parse_frame",
    "parse_ipv4",
    "parse_ktap",
    "parse_line",
    "parse_text",
    "parse_xdpdump",
    "read_folded",
    "snapshot_commands",
    "step_cost",
    "step_figures",
    "trace_summary",
    "walk_ktap",
    "window_words",
    "write_delta",
    "write_trace",
    "xdp_counter_values",
    "xdp_filter_status",
    "xdp_rows",
]
