"""The live network controls of a lab that is up: impairments (netem in the
guest) and link state (QMP ``set_link``) in :mod:`.netctl`, packet captures
through QEMU's filter-dump in :mod:`.capture`. Used by ``up`` (the lab file's
impairments), ``labctl impair|link|capture`` and the steps runner; every change
is recorded in :mod:`labctl.state.netstate`, so ``status`` and ``graph`` show it.

Imports never: labctl.up, labctl.training, labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.bisect
"""

from __future__ import annotations

from labctl.live import capture, netctl

__all__ = [
    "capture",
    "netctl",
]
