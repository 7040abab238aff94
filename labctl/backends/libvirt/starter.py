"""Starting a libvirt guest: the host made ready (its pool, the image and kernel volumes, QEMU's user
and security drivers learnt once), the guest's volumes and directory, its domain started (or
restored from a class's shared post-boot state), its console relay attached.

:class:`DomainStarter` is what :class:`labctl.backends.libvirt.domains.LibvirtBackend`
starts guests with (one per backend: what it learns of each host is kept for the lab's guests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import labctl.backends.libvirt.host as hostfs
import labctl.backends.libvirt.saved as saved  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.backends.libvirt.saveimage as saveimage  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.backends.libvirt.storage as storage  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends.base import POSTBOOT, GuestPlan, GuestRecord, NetDir
from labctl.backends.libvirt.api import (
    HostFacts,
    check_socket_paths,
    connection,
    destroy,
    host_command,
    host_facts,
    host_run,
    is_ours,
    libvirt_uri,
    lookup,
    message,
    qemu_pid,
    where,
)
from labctl.backends.libvirt.binding import binding
from labctl.backends.libvirt.host import QemuUser
from labctl.backends.libvirt.saved import attach_console
from labctl.backends.libvirt.xml import (
    FW_CFG_NAMES,
    DomainFiles,
    disk_volume,
    domain_name,
    domain_xml,
    fw_cfg_volumes,
    gdb_socket,
    planned_files,
)
from labctl.backends.owned import OwnedEntry
from labctl.backends.owned import forget as forget_owned
from labctl.backends.owned import record as record_owned
from labctl.errors import HostError, MachineError
from labctl.lab import HostPlace, host_place
from labctl.paths import ensure_private_dir
from labctl.proc import pid_cmdline

BACKEND = "libvirt"  # what its records and journal entries say


class DomainStarter:
    """Starts guests as transient libvirt domains (see the module docstring)."""

    name = BACKEND

    def __init__(self) -> None:
        self._images: dict[str, storage.HostImage] = {}  # host URI -> image volumes there
        self._kernels: dict[tuple[str, Path], storage.HostKernel] = {}  # (host URI, initrd) -> kernel volumes
        self._facts: dict[str, HostFacts] = {}  # host URI -> QEMU's user and security drivers

    def command(self, plan: GuestPlan) -> list[str]:
        """The domain XML, one line per element (QEMU's user is asked from the host once)."""
        facts = self._host_facts(self._host(plan))
        return domain_xml(plan, facts.user, facts.models, self._files_preview(plan)).splitlines()

    @staticmethod
    def _host(plan: GuestPlan) -> HostPlace:
        return plan.host or host_place("local", libvirt_uri())

    def _host_facts(self, host: HostPlace, conn: Any = None) -> HostFacts:
        """The host's :class:`HostFacts`, read once per backend.

        :raise HostError: when the host is unreachable or has no DAC model.
        """
        if host.uri not in self._facts:
            if conn is None:
                with connection(host.uri, host.name) as c:
                    self._facts[host.uri] = host_facts(c, where(host.uri, host.name))
            else:
                self._facts[host.uri] = host_facts(conn, where(host.uri, host.name))
        return self._facts[host.uri]

    def _files_preview(self, plan: GuestPlan) -> DomainFiles:
        """The paths the guest will use on its host (this run's image volumes when known)."""
        files = planned_files(plan)
        k = self._kernels.get((self._host(plan).uri, plan.initrd))
        if k is None:
            return files
        return DomainFiles(k.boot, k.initrd, files.disk, files.fw_cfg, files.gdb_socket, k.modules)

    def network_dir(self, run_dir: Path, lab: str, hosts: dict[str, HostPlace] | None) -> NetDir:
        """The lab's directory on this machine for its unix sockets, owned by QEMU's user (0700).

        Only guests on a local URI use unix sockets; a lab without any gets
        the run directory's ``net/``, which nothing uses. The directory is
        journaled in the lab's run directory before it is made, and refused
        when it exists: it belongs to a lab of that name from another labctl
        state directory (or was left behind).

        :raise HostError: when it exists, or cannot be made.
        """
        local = next((h for h in (hosts or {}).values() if not h.remote), None)
        if local is None:
            return NetDir(ensure_private_dir(run_dir / "net"))
        user = self._host_facts(local).user
        path = hostfs.lab_net_dir(lab)
        self._host_dir(run_dir, local, path, user, replace=False)
        return NetDir(Path(path), (user.uid, user.gid))

    def prepare(self, plans: list[GuestPlan]) -> list[str]:
        """Connect to every host once (an unreachable one is named), learn whom QEMU runs
        as there, and put the image in its pool when it is not there yet.

        Remote hosts come first: a host that cannot be reached is named before
        anything else is done, and their uploads are the slow part.

        :raise HostError: when a host is unreachable or lacks something.
        :raise ImageError: when an upload does not verify.
        """
        notes: list[str] = []
        hosts = {self._host(p).uri: (self._host(p), p.image) for p in plans}
        for uri, (host, image) in sorted(hosts.items(), key=lambda kv: not kv[1][0].remote):
            with connection(uri, host.name) as conn:
                self._host_facts(host, conn)
                self._passable_pool(conn, host)
                uploaded: list[tuple[str, float]] = []
                if uri not in self._images:
                    img = storage.ensure_image(conn, image, local=not host.remote)
                    self._images[uri] = img
                    uploaded += img.uploaded
                for p in plans:
                    if self._host(p).uri == uri:
                        uploaded += self._kernel_files(conn, p, host).uploaded
                notes += [f"uploaded {vol} to pool {storage.POOL} on host {host.name} in {secs:.1f} s "
                          "(read back, sha256 matches)" for vol, secs in uploaded]
        return notes

    def _kernel_files(self, conn: Any, plan: GuestPlan, host: HostPlace) -> storage.HostKernel:
        """The guest's kernel files in the host's pool (placed once per host and initramfs)."""
        key = (host.uri, plan.initrd)
        if key not in self._kernels:
            self._kernels[key] = storage.ensure_kernel(conn, plan.kernel, plan.initrd, local=not host.remote)
        return self._kernels[key]

    def _passable_pool(self, conn: Any, host: HostPlace) -> None:
        """The pool, with a directory QEMU's user may pass through (an older labctl made it 0700).

        :raise HostError: when its mode cannot be changed.
        """
        pool = storage.ensure_pool(conn)
        path, mode = storage.pool_target(pool)
        if not storage.pool_is_passable(mode):
            host_command(host, ["chmod", f"{storage.POOL_MODE:04o}", "--", path],
                         f"let QEMU's user reach the volumes of pool {storage.POOL} ({path})")
            storage.refresh(pool)

    def start(self, plan: GuestPlan) -> GuestRecord:
        """Volumes and the guest's directory on its host, the domain started paused,
        the console relay attached, resume.

        :raise MachineError: when libvirt refuses the domain or the console.
        :raise HostError: when the host lacks something.
        """
        host = self._host(plan)
        name = domain_name(plan.lab, plan.guest.name)
        check_socket_paths(plan)
        lv = binding()
        with connection(host.uri, host.name) as conn:
            facts = self._host_facts(host, conn)
            self._clear_stale(conn, host.uri, name, plan)
            img = self._images.get(host.uri) or storage.ensure_image(conn, plan.image, local=not host.remote)
            self._images[host.uri] = img
            pool = storage.ensure_pool(conn)
            files = self._volumes(conn, pool, plan, host, img, facts.user)
            self._host_dir(plan.dir, host, hostfs.guest_run_dir(name), facts.user, replace=True)
            xml = domain_xml(plan, facts.user, facts.models, files)
            (plan.dir / "domain.xml").write_text(xml)
            # A guest of the same machine as the shared state's starts from it; any other boots.
            started_from = plan.template is not None and saveimage.shape(xml, plan.lab) == plan.template.shape
            if started_from:
                dom = self._start_from(conn, plan, host, name, files.disk)
            else:
                dom = self._create(conn, plan, host, name, xml, lv.VIR_DOMAIN_START_PAUSED)
            uuid = dom.UUIDString()
            relay = self._attach_console(plan, host, uuid)
            dom.resume()
        pid = 0 if host.remote else qemu_pid(name)
        argv = pid_cmdline(pid) if pid else []
        hop = host.ssh_hop
        shared = {"saved": [POSTBOOT], "throwaway_state": POSTBOOT,
                  "started_from": plan.template.ident} if started_from else {}
        return GuestRecord(name=plan.guest.name, backend=self.name, pid=pid, dir=str(plan.dir),
                           console=str(plan.console), qmp="", ssh_port=plan.ssh_port, accel=plan.accel,
                           argv=argv or xml.splitlines(), gdb=files.gdb_socket,
                           extra={"uri": host.uri, "host": host.name, "domain": name, "uuid": uuid,
                                  "remote": host.remote, "relay_pid": relay, "qemu_user": facts.user.label,
                                  "ssh_via": hop.to_dict() if hop else None,
                                  "volumes": [files.disk, *files.fw_cfg.values()], **shared})

    def _create(self, conn: Any, plan: GuestPlan, host: HostPlace, name: str, xml: str, flags: int) -> Any:
        """Create the transient domain, journaled first.

        :raise MachineError: when libvirt refuses it.
        """
        record_owned(plan.dir, {"backend": self.name, "kind": "domain", "uri": host.uri, "host": host.name,
                                "name": name, "run_dir": str(plan.dir)})
        try:
            return conn.createXML(xml, flags)
        except binding().libvirtError as exc:
            raise MachineError(f"libvirt ({where(host.uri, host.name)}) could not start guest "
                               f"{plan.guest.name} as domain {name}: {message(exc)}") from exc

    def _start_from(self, conn: Any, plan: GuestPlan, host: HostPlace, name: str, disk: str) -> Any:
        """The domain restored (paused) from the shared post-boot state ``plan.template``,
        journaled first.

        :raise MachineError: when libvirt refuses it.
        """
        record_owned(plan.dir, {"backend": self.name, "kind": "domain", "uri": host.uri, "host": host.name,
                                "name": name, "run_dir": str(plan.dir)})
        return saved.start_from(conn, plan.template, host, plan.dir, plan.guest.name, name, plan.lab,
                                plan.ssh_port, disk)

    def _volumes(self, conn: Any, pool: Any, plan: GuestPlan, host: HostPlace, img: storage.HostImage,
                 user: QemuUser) -> DomainFiles:
        """The guest's overlay and fw_cfg volumes, owned by QEMU's user (0600), each journaled
        before it is created."""
        owner = (user.uid, user.gid)

        def make(vol: str, create: Any) -> str:
            record_owned(plan.dir, {"backend": self.name, "kind": "volume", "uri": host.uri,
                                    "host": host.name, "pool": storage.POOL, "name": vol})
            storage.delete_volume(pool, vol)  # a leftover of this very guest (its domain is gone)
            return str(create(vol).path())

        disk = make(disk_volume(plan),
                    lambda v: storage.create_overlay(pool, v, img.rootfs, img.rootfs_size, owner))
        keys = (plan.boot_authorized_keys, plan.boot_host_key) if plan.boot_keys else (plan.authorized_keys,
                                                                                      plan.host_key)
        local = dict(zip(FW_CFG_NAMES, (plan.config, *keys), strict=True))
        fw_cfg = {entry: make(vol, lambda v, p=local[entry]: storage.upload_bytes(conn, pool, v, p.read_bytes(),
                                                                                 owner=owner))
                  for entry, vol in fw_cfg_volumes(plan).items()}
        k = self._kernel_files(conn, plan, host)
        return DomainFiles(k.boot, k.initrd, disk, fw_cfg, gdb_socket(plan), k.modules)

    def _host_dir(self, journal_dir: Path, host: HostPlace, path: str, user: QemuUser, replace: bool) -> None:
        """A 0700 directory below ``RUN_ROOT`` on ``host``, owned by QEMU's user, journaled in
        ``journal_dir`` first. ``replace`` empties a leftover; otherwise one is refused (and
        taken out of the journal again: it is not ours).

        :raise HostError: when the host cannot make it, or it exists and may not be replaced.
        """
        entry: OwnedEntry = {"backend": self.name, "kind": "host-dir", "uri": host.uri, "host": host.name, "path": path}
        record_owned(journal_dir, entry)
        status, err = host_run(host, hostfs.mkdir_argv(path, user, replace))
        if status == hostfs.EXISTS_STATUS and not replace:
            forget_owned(journal_dir, entry)
            raise HostError(f"{path} already exists on {where(host.uri, host.name)}: a lab of that name "
                            "runs there from another labctl state directory, or one was left behind",
                            hint=f"take that lab down where it was started, or remove {path} if nothing uses it")
        if status != 0:
            raise HostError(f"could not make {path} for QEMU's user ({user.describe(not host.remote)}) on "
                            f"{where(host.uri, host.name)}: {err or f'exit status {status}'}")

    def _attach_console(self, plan: GuestPlan, host: HostPlace, uuid: str) -> int:
        """Start the console relay and wait until it is attached (it then creates ``console.log``).

        :raise MachineError: when the relay exits or does not attach in time.
        """
        return attach_console(plan.dir, plan.guest.name, host, uuid, fresh=True)

    def _clear_stale(self, conn: Any, uri: str, name: str, plan: GuestPlan) -> None:
        """Destroy a leftover domain of this very guest; refuse one that belongs elsewhere.

        :raise MachineError: when a domain of that name runs from another run directory.
        """
        dom = lookup(conn, name)
        if dom is None:
            return
        if not is_ours(dom.XMLDesc(0), plan.dir, plan.console):
            raise MachineError(f"libvirt ({uri}) already has a domain named {name}, "
                               "run from another labctl state directory",
                               hint=f"take it down there, or: virsh -c {uri} destroy {name}")
        destroy(dom)
