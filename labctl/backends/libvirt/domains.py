"""The libvirt backend: each guest is a transient libvirt domain.

The domain (``labctl-<lab>-<guest>``, XML from
:mod:`labctl.backends.libvirt.xml`) runs the same machine as the qemu
backend, on the libvirt URI in ``$LABCTL_LIBVIRT_URI`` (default
``qemu:///system``). Transient domains vanish when they stop, so ``down``
leaves nothing behind in ``virsh list --all``.

QEMU runs as the host's unprivileged QEMU user (libvirt's DAC base label,
``libvirt-qemu`` on Debian) wherever the host's libvirt is set up that way,
and labctl treats every host alike, this machine included
(:mod:`labctl.backends.libvirt.host`): the image and the guest's disk and
fw_cfg files are volumes in the host's ``labctl`` pool
(:mod:`labctl.backends.libvirt.storage`; uploaded to a remote host, hard
linked here), the gdbstub's socket is in the guest's 0700 directory on its
host, and the lab's unix sockets are in the lab's 0700 directory, all owned
by QEMU's user. The console is a pty that a relay process copies into the
run directory (:mod:`labctl.backends.libvirt.relay`), so labctl never
reads a file QEMU could have replaced. A remote guest's SSH goes through
its host's own sshd. Everything created on a host is written to an
ownership journal (:mod:`labctl.backends.owned`) first, and
:meth:`LibvirtBackend.cleanup` removes exactly that.

Every :class:`libvirt.libvirtError` is mapped to a labctl error in one place,
:func:`connection`: failing to connect is a :class:`HostError`, anything
after that a :class:`MachineError`; both name the host and its URI.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import labctl.backends.libvirt.host as hostfs
import labctl.backends.libvirt.host_checks as host_checks  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.backends.libvirt.saved as saved  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.backends.libvirt.storage as storage  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends.base import Backend, GuestPlan, GuestRecord, HostCheck, NetDir
from labctl.backends.libvirt.api import (
    LOG_DIR,
    RELAY,
    connection,
    destroy,
    host_command,
    is_ours,
    is_running,
    libvirt_uri,
    log_reason,
    lookup,
    wait_gone,
    where,
)
from labctl.backends.libvirt.binding import binding
from labctl.backends.libvirt.starter import DomainStarter
from labctl.backends.owned import OwnedEntry
from labctl.backends.owned import entries as owned_entries
from labctl.errors import HostError, LabctlError, MachineError, UsageError
from labctl.lab import HostPlace, Lab, host_place, place_guests
from labctl.proc import stop_pid

log = logging.getLogger(__name__)


class LibvirtBackend(Backend):
    """Runs guests as transient libvirt domains, on this machine or on remote hosts."""

    name = "libvirt"
    states_on_hosts = True

    def __init__(self) -> None:
        self.starter = DomainStarter()

    def command(self, plan: GuestPlan) -> list[str]:
        """The domain XML, one line per element (QEMU's user is asked from the host once)."""
        return self.starter.command(plan)

    def network_dir(self, run_dir: Path, lab: str, hosts: dict[str, HostPlace] | None) -> NetDir:
        return self.starter.network_dir(run_dir, lab, hosts)

    def prepare(self, plans: list[GuestPlan]) -> list[str]:
        return self.starter.prepare(plans)

    def start(self, plan: GuestPlan) -> GuestRecord:
        return self.starter.start(plan)

    def place(self, lab: Lab, no_verify_host_keys: bool = False) -> dict[str, HostPlace]:
        """Every guest on the host the lab names (this machine's URI, ``$LABCTL_LIBVIRT_URI``, by default).

        :raise UsageError: when that URI cannot be used.
        """
        try:
            return place_guests(lab, libvirt_uri(), no_verify_host_keys)
        except ValueError as exc:
            raise UsageError(str(exc), hint="fix $LABCTL_LIBVIRT_URI or the lab's hosts") from exc

    def free_mib(self, host: HostPlace) -> int:
        return host_checks.free_mib(host)

    def host_checks(self) -> list[HostCheck]:
        return host_checks.host_checks()

    def lab_checks(self, lab: Lab) -> list[HostCheck]:
        return host_checks.lab_checks(lab)

    def suspend(self, rec: GuestRecord) -> None:
        saved.suspend(rec)

    def resume(self, rec: GuestRecord) -> None:
        saved.resume(rec)

    def save_state(self, rec: GuestRecord, label: str, resume: bool = True) -> GuestRecord:
        return saved.save(rec, label, resume)

    def restore_state(self, rec: GuestRecord, label: str, fresh_console: bool = True,
                      resume: bool = True) -> GuestRecord:
        return saved.restore(rec, label, fresh_console, resume)

    def has_state(self, rec: GuestRecord, label: str) -> bool:
        return saved.has_state(rec, label)

    def forget_state(self, rec: GuestRecord, label: str) -> GuestRecord:
        return saved.forget(rec, label)

    def template_of(self, rec: GuestRecord, ident: str, drivers: dict[str, str]) -> saved.Template | None:
        return saved.template_of(rec, ident, drivers)

    def alive(self, rec: GuestRecord) -> bool:
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = lookup(conn, rec)
            return dom is not None and is_running(dom)

    def stop(self, rec: GuestRecord, timeout: float) -> None:
        """ACPI power button, wait up to ``timeout`` s, then destroy."""
        lv = binding()
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = lookup(conn, rec)
            if dom is None or not is_running(dom):
                return
            try:
                dom.shutdown()
            except lv.libvirtError:
                pass  # not running any more, or no ACPI: destroy below
            if not wait_gone(conn, rec, timeout):
                destroy(dom)
                wait_gone(conn, rec, 5.0)

    def kill(self, rec: GuestRecord) -> None:
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = lookup(conn, rec)
            if dom is not None:
                destroy(dom)
                wait_gone(conn, rec, 5.0)

    def cleanup(self, guest_dir: Path) -> None:
        """Destroy the journal's domains, stop its relays, delete its volumes and
        directories (newest first). ``guest_dir`` may also be a lab's run directory
        (its journal holds the lab's socket directory).

        Things already gone are fine. Every host is tried; the first failure
        is raised at the end.

        :raise HostError: when a host with something of this guest is unreachable.
        """
        failures: list[LabctlError] = []
        for entry in reversed(owned_entries(guest_dir)):
            try:
                self._release(entry, guest_dir)
            except LabctlError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def _release(self, entry: OwnedEntry, guest_dir: Path) -> None:
        """Remove one journaled thing."""
        kind = entry.get("kind")
        if kind == "process":
            stop_pid(int(entry["pid"]), str(entry.get("marker", RELAY)))
            return
        if kind in ("host-dir", "remote-dir"):  # remote-dir: journals of an older labctl
            path = str(entry.get("path", ""))
            if hostfs.is_run_dir(path):  # never anything else
                host = host_place(str(entry.get("host") or "host"), str(entry["uri"]))
                host_command(host, hostfs.rmdir_argv(path), f"remove {path}")
            return
        with connection(entry["uri"], entry.get("host")) as conn:
            if kind == "domain":
                dom = lookup(conn, entry["name"])
                if dom is not None and is_ours(dom.XMLDesc(0), guest_dir, guest_dir / "console.log"):
                    destroy(dom)
            elif kind == "volume":
                pool = storage.lookup_pool(conn, entry["pool"])
                if pool is not None and storage.delete_volume(pool, entry["name"]):
                    log.info("deleted volume %s on %s", entry["name"], where(entry["uri"], entry.get("host")))

    def capture_dir(self, rec: GuestRecord) -> Path:
        """The guest's directory on its host (QEMU's user's, 0700), when that host is this machine.

        :raise HostError: for a guest on a remote host.
        """
        if rec.extra.get("remote"):
            raise HostError(f"guest {rec.name} runs on remote host {rec.extra.get('host')}: labctl captures "
                            "only on guests of this machine",
                            hint="capture the NIC at the other end of its link (a UDP tunnel carries every frame "
                                 "of the link), or run the guest on this machine")
        return Path(hostfs.guest_run_dir(str(rec.extra["domain"])))

    def emulator_version(self) -> str:
        """Unknown: each host has its own QEMU, asked through a running guest's QMP instead."""
        return "unknown"

    def qemu_log(self, rec: GuestRecord) -> Path | None:
        """libvirt's log of the domain (``/var/log/libvirt/qemu/<name>.log``) for a guest of this machine."""
        return None if rec.extra.get("remote") else LOG_DIR / f"{rec.extra['domain']}.log"

    def exit_reason(self, rec: GuestRecord) -> str:
        """From libvirt's log of the domain (``/var/log/libvirt/qemu/<name>.log``)."""
        path = LOG_DIR / f"{rec.extra['domain']}.log"
        if rec.extra.get("remote"):
            return (f"domain {rec.extra['domain']} stopped on {where(rec.extra['uri'], rec.extra.get('host'))}; "
                    f"QEMU's log is {path} there")
        try:
            with open(path, errors="replace") as f:
                lines = [ln.strip() for ln in f.readlines()[-200:] if ln.strip()]
        except OSError:
            return f"no log from libvirt ({path} is not readable)"
        return log_reason(lines) or "no message from QEMU"

    def qmp(self, rec: GuestRecord, command: str, args: Mapping[str, object] | None = None) -> Any:
        """Run one QMP command through libvirt's monitor passthrough; return its ``return``.

        :raise MachineError: when the domain is gone or the command fails.
        """
        import libvirt_qemu

        request = json.dumps({"execute": command, **({"arguments": args} if args else {})})
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = lookup(conn, rec)
            if dom is None:
                raise MachineError(f"guest {rec.name}: domain {rec.extra['domain']} is not running "
                                   f"on {rec.extra['uri']}")
            reply = json.loads(libvirt_qemu.qemuMonitorCommand(dom, request, 0))
        if "error" in reply:
            err = reply["error"]
            raise MachineError(f"QMP {command} on domain {rec.extra['domain']} failed: "
                               f"{err.get('class')}: {err.get('desc')}")
        return reply.get("return")
