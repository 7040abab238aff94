"""Bringing a lab up and down: what ``up`` may be asked (:mod:`.options`), keys
(:mod:`.keys`), each guest's configuration (:mod:`.guestconf`) and kernel
command line (:mod:`.bootargs`), the checks made before anything starts
(:mod:`.envcheck`) and whether the host holds the guests (:mod:`.capacity`,
the pipeline's first check); one ``up`` (:mod:`.lifecycle`): its networks
(:mod:`.netsetup`, tap networks in :mod:`.taps`), each guest's plan
(:mod:`.planner`), the guests started on their backend and waited for
(:mod:`.waiting`, :mod:`.console`); shares mounted in guests (:mod:`.mounts`),
firewalls loaded in guests (:mod:`.nftload`), tunnels and VRFs made in them (:mod:`.tunsetup`),
XDP programs attached (:mod:`.xdpload`),
taking a lab down (:mod:`.teardown`), each guest's live status
(:mod:`.status`), and the warm start every lab gets: post-boot snapshots
(:mod:`.snapshots`), restoring them with the guest's own keys (:mod:`.warm`)
through the guest agent (:mod:`.agent`), at the clock rate they were taken at
(:mod:`.tsc`). The accelerator is the backends' (:mod:`labctl.backends.accel`).

``up`` takes each guest's kernel prepared (:func:`labctl.pipeline.prepare`);
it never builds an image or prepares a kernel itself. What a lab's state on
disk is belongs to :mod:`labctl.state`; changing a lab that is up to
:mod:`labctl.live`; courses (classes, reset, checkpoints, grading) to
:mod:`labctl.training`, which sits on top of this package.

Imports never: labctl.training, labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.bisect
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.up import agent, mounts, nftload, snapshots, taps, tunsetup, warm, xdpload
    from labctl.up.capacity import QEMU_OVERHEAD_MIB, Estimate, check_capacity
    from labctl.up.lifecycle import UpOptions, dry_run, up
    from labctl.up.status import guest_statuses
    from labctl.up.teardown import down
    from labctl.up.warm import shared_templates
else:  # each name loaded at its first use (labctl.lazyface): reset and checkpoint load no paramiko
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())


__all__ = [
    "QEMU_OVERHEAD_MIB",
    "Estimate",
    "UpOptions",
    "agent",
    "check_capacity",
    "down",
    "dry_run",
    "guest_statuses",
    "mounts",
    "nftload",
    "shared_templates",
    "snapshots",
    "taps",
    "tunsetup",
    "up",
    "warm",
    "xdpload",
]
