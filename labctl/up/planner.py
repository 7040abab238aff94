"""Each guest's plan for one ``up``: its kernel command line, ports and files (:class:`~labctl.backends.GuestPlan`,
as data), and how it starts: restored from its post-boot snapshot, booted to become one (with a
throwaway host key, :mod:`.warm`), started from a class's shared post-boot state, or booted.

:meth:`GuestPlanner.plan` makes the guest's directory, keys and disk; :meth:`GuestPlanner.guest_plan`
only computes (``up --dry-run``).
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

import labctl.up.guestconf as guestconf  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.mounts as mounts  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.snapshots as snapshots  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.warm as warm  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import Backend, GuestPlan
from labctl.image import Image
from labctl.kernel import Kernel, kernel_initrd
from labctl.lab import Guest, HostPlace, Lab, mgmt_mac
from labctl.net import Segment, free_port
from labctl.paths import ensure_private_dir
from labctl.up.bootargs import kernel_args
from labctl.up.keys import new_keypair
from labctl.up.options import UpOptions
from labctl.up.tsc import host_tsc_khz


class GuestPlanner:
    """Plans the guests of ``lab`` for one ``up``; says which are restored (``warm``), which boot to
    become a snapshot or a shared state (``throwaway``) and each one's snapshot key (``snaps``)."""

    def __init__(self, lab: Lab, image: Image, kernels: dict[str, Kernel], opts: UpOptions, backend: Backend,
                 hosts: dict[str, HostPlace] | None, run_dir: Path) -> None:
        self.lab, self.image, self.kernels, self.opts = lab, image, kernels, opts
        self.backend, self.hosts, self.dir = backend, hosts, run_dir
        self.snaps: dict[str, str] = {}  # guest -> its snapshot key (post-boot snapshot backends)
        self.warm: dict[str, snapshots.Snapshot] = {}  # guests restored instead of booted
        self.throwaway: set[str] = set()  # guests booting with a throwaway host key (to be snapshotted)

    def guest_plan(self, g: Guest, accel: str, segments: dict[str, Segment], gdir: Path) -> GuestPlan:
        """The guest's plan, as data (nothing made but the kernel's cached initrd)."""
        ports = {nic.name: next(p for p in segments[nic.network].ports
                                if p.guest == g.name and p.nic == nic.name) for nic in g.nics}
        kernel = self.kernels[g.name]
        host = self.hosts[g.name] if self.hosts else None
        tsc_khz = host_tsc_khz() if accel == "tcg" and self.backend.pins_tsc else None
        args = kernel_args(self.image, g, kernel, self.opts.extra_kernel_args, tsc_khz)
        initrd = kernel_initrd(kernel, self.image.initramfs_cpio, self.image.key)
        return GuestPlan(lab=self.lab.ident, guest=g, dir=gdir, image=self.image, accel=accel,
                         ssh_port=free_port(), mgmt_mac=mgmt_mac(self.lab.name, g.name),
                         ports=ports, kernel_args=args, kernel=kernel, initrd=initrd, host=host)

    def dry_plan(self, g: Guest, accel: str, segments: dict[str, Segment]) -> GuestPlan:
        """The guest's plan as :meth:`plan` would make it, warm when its snapshot is there; nothing made."""
        plan = self.guest_plan(g, accel, segments, self.dir / "guests" / g.name)
        if self.backend.post_boot_snapshots and self.opts.snapshots and not self.opts.cold and not g.record \
                and snapshots.find(snapshots.key(plan, self.backend)) is not None:
            plan = dataclasses.replace(plan, warm=True)
        return plan

    def plan(self, g: Guest, accel: str, segments: dict[str, Segment], client_pub: str) -> GuestPlan:
        """The guest's plan with its directory, keys, disk and configuration made."""
        gdir = ensure_private_dir(self.dir / "guests" / g.name)
        mounts.make_directories(gdir, self.lab.ident, g.name, g.shares)
        plan = self.guest_plan(g, accel, segments, gdir)
        new_keypair(plan.host_key, f"{g.name}.{self.lab.ident}")
        plan.authorized_keys.write_text(client_pub + "\n")
        if plan.host is not None:
            plan = self._shared_state(plan)
        if self.backend.post_boot_snapshots:  # its disk here (a libvirt host gets an overlay volume in its pool)
            snap = self._snapshot_of(plan)
            if snap is not None:
                plan = dataclasses.replace(plan, warm=True)
                warm.restore_disk(snap, plan.overlay, plan.console)
            else:
                snapshots.new_overlay(self.image.rootfs, plan.overlay, "raw")
            if snap is None and g.name in self.snaps and snapshots.find(self.snaps[g.name]) is None:
                # This boot becomes the post-boot snapshot: no guest's own key may be in it.
                warm.boot_with_throwaway(gdir, f"labctl-boot-{secrets.token_hex(4)}")
                self.throwaway.add(g.name)
            else:
                warm.boot_with_own_key(gdir)
        # A boot that becomes the snapshot with no setup commands (nor firewall) is not logged into before the
        # snapshot: its sshd waits for the guest's own key (one sshd start fewer under TCG).
        # (a guest without the agent starts its sshd with the throwaway key)
        plan.config.write_text(guestconf.render(g, plan.mgmt_mac, standby_sshd=g.name in self.throwaway
                                                and not (g.setup or g.firewall or g.tunnels or g.vrfs or any(n.xdp or n.tc for n in g.nics))
                                                and self.backend.guest_agent))
        return plan

    def _shared_state(self, plan: GuestPlan) -> GuestPlan:
        """A guest of a class on a backend that saves states on its hosts: started from its host's
        shared post-boot state when there is one (the backend boots it instead if the state's domain
        has another shape), else booted with throwaway keys so that its post-boot state becomes
        that state (labctl.up.warm)."""
        if not (self.opts.saved_states and self.opts.shared_states) or self.opts.cold or plan.host is None:
            return plan
        name = plan.guest.name
        template = self.opts.templates.get((name, plan.host.name))
        if template is not None:
            warm.take_shared_keys(Path(template.dir), plan.dir)
            return dataclasses.replace(plan, template=template)
        warm.boot_shared(plan.dir, plan.boot_authorized_keys, f"labctl-boot-{secrets.token_hex(4)}")
        self.throwaway.add(name)
        return dataclasses.replace(plan, boot_keys=True)

    def _snapshot_of(self, plan: GuestPlan) -> snapshots.Snapshot | None:
        """The guest's post-boot snapshot to restore (None: it boots), noting its key."""
        if not self.opts.snapshots or plan.guest.record:  # a recording starts at the machine's reset
            return None
        key = self.snaps[plan.guest.name] = snapshots.key(plan, self.backend)
        snap = None if self.opts.cold else snapshots.find(key)
        if snap is not None:
            self.warm[plan.guest.name] = snap
        return snap
