"""A lab's state on disk, shared by every stage that acts on a lab that is up:
where its run directory is (:mod:`.rundir`, a leaf that ``exec`` reads before anything else), its
lock and recorded guests (:mod:`.runstate`), what is in
force on its links, impairments, links down and live captures' records
(:mod:`.netstate`), and each guest's live status (:mod:`.gueststatus`: the one
place that asks a backend, imported when asked). Leaves only at import:
``status`` and ``exec`` read a lab without paramiko or the backends.

Records only: nothing here starts a guest, opens a session or talks to QEMU.

Imports never: labctl.up, labctl.live, labctl.training, labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.bisect
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.state.gueststatus import GuestStatus, guest_statuses
    from labctl.state.netstate import CAPTURES, Capture
    from labctl.state.netstate import active as active_captures
    from labctl.state.netstate import load as load_netstate
    from labctl.state.netstate import update as update_netstate
    from labctl.state.rundir import STATE, check_lab_name, run_dir
    from labctl.state.runstate import (
        STARTING,
        UP,
        LabState,
        SwitchRecord,
        lab_lock,
        recorded_snapshots,
        remove_run_dir,
        up_labs,
    )
else:  # each name loaded at its first use (labctl.lazyface)
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())


__all__ = [
    "CAPTURES", "STARTING", "STATE", "UP", "Capture", "GuestStatus", "LabState", "SwitchRecord", "active_captures",
    "check_lab_name", "guest_statuses", "lab_lock", "load_netstate", "recorded_snapshots", "remove_run_dir",
    "run_dir", "up_labs", "update_netstate",
]
