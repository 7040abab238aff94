"""Lab networks: how each network is wired (:mod:`.plan`), labctl's L2 switch
(:mod:`.switch`), each NIC's netdev by its kind (:mod:`.netdevs`), free ports on 127.0.0.1 (:mod:`.ports`), impairments as
netem commands (:mod:`.netem`), capture files (:mod:`.pcap`) and the guest's
virtual clock that dates them (:mod:`.vmclock`), and pictures of the
topology (:mod:`.graph`).

Pure or nearly: nothing here starts a guest or talks to QEMU. Must not
import backends, the ``up`` stage, steps or the CLI.

Imports never: labctl.backends, labctl.up, labctl.steps, labctl.cli, labctl.state, labctl.live, labctl.training
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.net.graph import Runtime, runtime_from_state, to_dot, to_mermaid, to_svg, topology
    from labctl.net.netdevs import NETDEVS, NetdevKind, kind_of_option, netdev_kind, option_id
    from labctl.net.netem import apply_command
    from labctl.net.pcap import (
        FORMATS,
        SNAPLEN,
        Frame,
        PcapError,
        PcapReader,
        Retimer,
        Writer,
        read_pcapng,
        summary_line,
    )
    from labctl.net.plan import (
        SWITCH,
        TAP,
        UDP,
        Port,
        PortRecord,
        Segment,
        SegmentRecord,
        TapDev,
        UdpAddr,
        plan_networks,
    )
    from labctl.net.ports import free_port
    from labctl.net.vmclock import VmClockError
    from labctl.net.vmclock import sample as sample_vmclock
else:  # each name loaded at its first use (labctl.lazyface): exec and down load no topology pictures
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())

__all__ = [
    "FORMATS",
    "NETDEVS",
    "SNAPLEN",
    "SWITCH",
    "TAP",
    "UDP",
    "Frame",
    "NetdevKind",
    "PcapError",
    "PcapReader",
    "Port",
    "PortRecord",
    "Retimer",
    "Runtime",
    "Segment",
    "SegmentRecord",
    "TapDev",
    "UdpAddr",
    "VmClockError",
    "Writer",
    "apply_command",
    "free_port",
    "kind_of_option",
    "netdev_kind",
    "option_id",
    "plan_networks",
    "read_pcapng",
    "runtime_from_state",
    "sample_vmclock",
    "summary_line",
    "to_dot",
    "to_mermaid",
    "to_svg",
    "topology",
]
