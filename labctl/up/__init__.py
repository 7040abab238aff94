"""Bringing a lab up and down: what ``up`` may be asked (:mod:`.options`), keys
(:mod:`.keys`), each guest's configuration (:mod:`.guestconf`) and kernel
command line (:mod:`.bootargs`), the checks made before anything starts
(:mod:`.envcheck`) and whether the host holds the guests (:mod:`.capacity`,
the pipeline's first check); one ``up`` (:mod:`.lifecycle`): its networks
(:mod:`.netsetup`, tap networks in :mod:`.taps`), each guest's plan
(:mod:`.planner`), the guests started on their backend and waited for
(:mod:`.waiting`, :mod:`.console`; a restored guest's sshd, :mod:`.banner`); shares mounted in guests (:mod:`.mounts`),
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
    from labctl.up.agent import channel_of as agent_channel
    from labctl.up.agent import set_clock as set_guest_clock
    from labctl.up.banner import wait_banner
    from labctl.up.capacity import QEMU_OVERHEAD_MIB, Estimate, check_capacity
    from labctl.up.lifecycle import UpOptions, dry_run, up
    from labctl.up.mounts import directories as share_directories
    from labctl.up.mounts import mount as mount_shares
    from labctl.up.mounts import of as shares_of
    from labctl.up.mounts import umount as umount_shares
    from labctl.up.nftload import load as load_firewall
    from labctl.up.snapshots import find as find_snapshot
    from labctl.up.snapshots import find_restorable, new_overlay, record_clone, snapshots_root
    from labctl.up.snapshots import in_use as snapshots_in_use
    from labctl.up.snapshots import list_all as list_snapshots
    from labctl.up.snapshots import prune as prune_snapshots
    from labctl.up.snapshots import remove_lab as remove_lab_snapshots
    from labctl.up.status import guest_statuses
    from labctl.up.taps import close as close_taps
    from labctl.up.taps import reopen as reopen_taps
    from labctl.up.teardown import down
    from labctl.up.tunsetup import configure as configure_tunnels
    from labctl.up.tunsetup import hand_keys as hand_tunnel_keys
    from labctl.up.tunsetup import lab_nets
    from labctl.up.warm import adopt as adopt_restored
    from labctl.up.warm import check_memory as check_snapshot_memory
    from labctl.up.warm import clock_command, hand_over_shared, restore_disk, shared_templates
    from labctl.up.warm import load as load_saved_state
    from labctl.up.xdpload import attach as attach_xdp
else:  # each name loaded at its first use (labctl.lazyface): reset and checkpoint load no paramiko
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())


__all__ = [
    "QEMU_OVERHEAD_MIB", "Estimate", "UpOptions", "adopt_restored", "agent_channel", "attach_xdp", "check_capacity",
    "check_snapshot_memory", "clock_command", "close_taps", "configure_tunnels", "down", "dry_run",
    "find_restorable", "find_snapshot", "guest_statuses", "hand_over_shared", "hand_tunnel_keys", "lab_nets",
    "list_snapshots", "load_firewall", "load_saved_state", "mount_shares", "new_overlay", "prune_snapshots",
    "record_clone", "remove_lab_snapshots", "reopen_taps", "restore_disk", "set_guest_clock", "share_directories",
    "shared_templates", "shares_of", "snapshots_in_use", "snapshots_root", "umount_shares", "up", "wait_banner",
]
