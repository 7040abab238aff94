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

from labctl.follow.dropwatch import Watch as DropWatch
from labctl.follow.dropwatch import finish as finish_dropwatch
from labctl.follow.dropwatch import remove as remove_dropwatch
from labctl.follow.dropwatch import start as start_dropwatch
from labctl.follow.follower import Follower, libpcap_error, parallel
from labctl.follow.livefollow import LiveFollow, LiveStats
from labctl.follow.recent import Recent
from labctl.follow.recent import read as read_recent
from labctl.follow.xdpfollow import XdpFollow
from labctl.follow.xdpwatch import XdpWatch
from labctl.follow.xdpwatch import finish as finish_xdpwatch
from labctl.follow.xdpwatch import start as start_xdpwatch
from labctl.follow.xdpwatch import stop_texts as xdpwatch_stop_texts

__all__ = [
    "DropWatch",
    "Follower",
    "LiveFollow",
    "LiveStats",
    "Recent",
    "XdpFollow",
    "XdpWatch",
    "finish_dropwatch",
    "finish_xdpwatch",
    "libpcap_error",
    "parallel",
    "read_recent",
    "remove_dropwatch",
    "start_dropwatch",
    "start_xdpwatch",
    "xdpwatch_stop_texts",
]
