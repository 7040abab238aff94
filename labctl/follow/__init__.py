"""Following packets through a lab that is up: probes in every guest's kernel, their clocks, the wire.

Owns the probes that follow packets and catch drops, as guest shell commands (:mod:`.probes`: tracefs
instances, event probes and kprobes with the filter in the kernel; through a tunnel: :mod:`.tunnelprobes`; a packet inside an
802.1Q tag in the frame: :mod:`.vlanprobes`), a following session on some
guests of a lab (:mod:`.follower`: checks first, clock rounds, wire captures, everything removed
after), the live follow of ``labctl follow`` (:mod:`.livefollow`), and the drops every step records
(:mod:`.dropwatch`) and the XDP programs' drops (:mod:`.xdpwatch`: xdpdump and their own counters), XDP verdicts in a live
follow (:mod:`.xdpfollow`), the last packets followed for the web pages (:mod:`.recent`). What the events mean, journeys and drop tables, is :mod:`labctl.trace`'s
(pure); the step kinds that use this are :mod:`labctl.steps`'; the filter language is
:mod:`labctl.pktfilter`.

Imports never: labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.up, labctl.training, labctl.pipeline, labctl.bisect, labctl.web
"""

from __future__ import annotations

from labctl.follow import dropwatch, probes, recent, xdpwatch
from labctl.follow.follower import Follower, libpcap_error, parallel
from labctl.follow.livefollow import LiveFollow, LiveStats
from labctl.follow.recent import Recent
from labctl.follow.xdpfollow import XdpFollow

__all__ = [
    "Follower",
    "LiveFollow",
    "LiveStats",
    "Recent",
    "XdpFollow",
    "dropwatch",
    "libpcap_error",
    "parallel",
    "probes",
    "recent",
    "xdpwatch",
]
