"""A picture of a lab's topology: guests, their NICs (with their addresses and VLANs, and the bonds
and bridges they are in) and the networks they join.

:func:`topology` turns a resolved lab (``Lab.to_dict()``) and, for a lab that
is up, optional runtime facts into a small :class:`Topology`. Three renderers
draw it: :func:`to_svg` (:mod:`.svg`: self-contained, deterministic, no scripts and no
URLs, in the report's colours), :func:`to_dot` (Graphviz) and
:func:`to_mermaid` (a Mermaid flowchart), both in :mod:`.text`; the model is
:mod:`.nodes`, the shared palette and text helpers :mod:`.style`. Everything here is pure: nothing
is read, run or printed.

Runtime facts (every key optional, unknown keys ignored, wrong types treated
as missing)::

    {
      "guests": {
        "a": {
          "state": "running",            # running | crashed | stopped | ...
          "host": "h1",                  # overrides the lab's host
          "nics": {
            "eth1": {
              "driver": "8139cp",        # the driver bound to the NIC (guest text: controls shown escaped)
              "link": "down",            # "up" | "down" (also True/False)
              "impairments": {"delay": "20ms", "loss": "1%"},  # or one string
              "capture": True,           # traffic of this NIC is captured
              "vlan_offloads": {"rx-vlan-offload": "on"},  # as the guest said them (controls escaped)
            },
          },
        },
      },
      "networks": {
        "lan": {"mechanism": "switch",   # unix-dgram | switch | udp-tunnel | alone
                "capture": True},        # the whole network is captured
      },
    }

Without a runtime mechanism a network shows the one labctl plans for it
(:mod:`labctl.net.plan`): two members on this machine ``unix-dgram``, three or
more ``switch``, one ``alone``, members on a remote host or on different
hosts ``udp-tunnel``. :func:`runtime_from_state` builds the runtime dict from
what ``labctl up`` records (drivers, network plan, hosts, guest states).

The SVG layout is deliberately simple (:mod:`.svg` says how); the canvas grows with the lab.
"""

from labctl.net.graph.nodes import (
    GuestNode,
    MasterRow,
    NetworkNode,
    NicRow,
    Runtime,
    Topology,
    VlanRow,
    planned_mechanism,
    runtime_from_state,
    topology,
)
from labctl.net.graph.svg import to_svg
from labctl.net.graph.text import to_dot, to_mermaid

__all__ = [
    "GuestNode",
    "MasterRow",
    "NetworkNode",
    "NicRow",
    "Runtime",
    "Topology",
    "VlanRow",
    "planned_mechanism",
    "runtime_from_state",
    "to_dot",
    "to_mermaid",
    "to_svg",
    "topology",
]
