"""The live network controls of a lab that is up: impairments (netem in the
guest) and link state (QMP ``set_link``) in :mod:`.netctl`, packet captures
through QEMU's filter-dump in :mod:`.capture`. Used by ``up`` (the lab file's
impairments), ``labctl impair|link|capture`` and the steps runner; every change
is recorded in :mod:`labctl.state.netstate`, so ``status`` and ``graph`` show it.

Imports never: labctl.up, labctl.training, labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.bisect
"""

from __future__ import annotations

from labctl.live.capture import Capture
from labctl.live.capture import Tail as CaptureTail
from labctl.live.capture import Written as CaptureWritten
from labctl.live.capture import active as active_captures
from labctl.live.capture import description as capture_description
from labctl.live.capture import discard as discard_capture
from labctl.live.capture import follow as follow_capture
from labctl.live.capture import reap as reap_captures
from labctl.live.capture import save as save_capture
from labctl.live.capture import start as start_capture
from labctl.live.capture import stop as stop_capture
from labctl.live.netctl import apply_impairment, lab_impairments, lab_nic, set_link

__all__ = [
    "Capture",
    "CaptureTail",
    "CaptureWritten",
    "active_captures",
    "apply_impairment",
    "capture_description",
    "discard_capture",
    "follow_capture",
    "lab_impairments",
    "lab_nic",
    "reap_captures",
    "save_capture",
    "set_link",
    "start_capture",
    "stop_capture",
]
