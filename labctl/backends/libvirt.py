"""The libvirt backend: each guest is a transient libvirt domain.

The domain (``labctl-<lab>-<guest>``, XML from
:mod:`labctl.backends.libvirt_xml`) runs the same machine as the qemu
backend, on the libvirt URI in ``$LABCTL_LIBVIRT_URI`` (default
``qemu:///system``). Transient domains vanish when they stop, so ``down``
leaves nothing behind in ``virsh list --all``.

QEMU runs as the host's unprivileged QEMU user (libvirt's DAC base label,
``libvirt-qemu`` on Debian) wherever the host's libvirt is set up that way,
and labctl treats every host alike, this machine included
(:mod:`labctl.backends.libvirt_host`): the image and the guest's disk and
fw_cfg files are volumes in the host's ``labctl`` pool
(:mod:`labctl.backends.libvirt_storage`; uploaded to a remote host, hard
linked here), the gdbstub's socket is in the guest's 0700 directory on its
host, and the lab's unix sockets are in the lab's 0700 directory, all owned
by QEMU's user. The console is a pty that a relay process copies into the
run directory (:mod:`labctl.backends.libvirt_console`), so labctl never
reads a file QEMU could have replaced. A remote guest's SSH goes through
its host's own sshd. Everything created on a host is written to an
ownership journal (:mod:`labctl.owned`) first, and
:meth:`LibvirtBackend.cleanup` removes exactly that.

Every :class:`libvirt.libvirtError` is mapped to a labctl error in one place,
:func:`connection`: failing to connect is a :class:`HostError`, anything
after that a :class:`MachineError`; both name the host and its URI.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl import owned
from labctl.backends import libvirt_host as hostfs
from labctl.backends import libvirt_storage as storage
from labctl.backends.base import GuestPlan, GuestRecord, NetDir
from labctl.backends.libvirt_host import QemuUser
from labctl.backends.libvirt_xml import (
    FW_CFG_NAMES,
    DomainFiles,
    disk_volume,
    domain_name,
    domain_xml,
    fw_cfg_volumes,
    gdb_socket,
    planned_files,
)
from labctl.errors import HostError, LabctlError, MachineError, ProcessError
from labctl.hosts import HostPlace, host_place
from labctl.netplan import UdpAddr
from labctl.paths import ensure_private_dir
from labctl.proc import pid_alive, pid_cmdline, run, spawn

log = logging.getLogger(__name__)

URI_ENV = "LABCTL_LIBVIRT_URI"
DEFAULT_URI = "qemu:///system"
SETUP_HINT = "run scripts/libvirt-setup.sh as root (installs libvirt, starts libvirtd, installs libvirt-python)"
REMOTE_HINT = ("check that 'virsh -c {uri} version' works from here: the host needs sshd, libvirtd, and "
               "virt-ssh-helper or nc; the URI's user, port and keyfile must log in without a password")
RELAY = "labctl.backends.libvirt_console"
CONSOLE_ATTACH_TIMEOUT = 60.0
RUN_DIR = Path("/run/libvirt/qemu")  # qemu:///system's pidfiles
LOG_DIR = Path("/var/log/libvirt/qemu")  # qemu:///system's per-domain QEMU logs
ROOT_WHY = ("a guest that escapes QEMU (a bug in an emulated device) owns the host as root; as an "
            "unprivileged user it reaches only what that user may")
ROOT_FIX = ("drop user/group \"+0\" (or \"root\") from /etc/libvirt/qemu.conf and restart libvirtd "
            "(scripts/libvirt-setup.sh does)")


def host_run(host: HostPlace, argv: list[str], timeout: float = 30.0) -> tuple[int, str]:
    """Run ``argv`` on ``host``: here for a local URI, else through the host's SSH login
    (as its URI logs in). Returns (exit status, error text); 255 when the host cannot be reached."""
    hop = host.ssh_hop
    if hop is None:
        try:
            res = run(argv, timeout=timeout, check=False)
        except ProcessError as exc:
            return 255, exc.message
        return res.returncode, res.stderr.decode(errors="replace").strip()
    from labctl.ssh import run_on_host

    return run_on_host(hop, argv, timeout)


def host_command(host: HostPlace, argv: list[str], what: str, timeout: float = 30.0) -> None:
    """:func:`host_run`, failing loudly.

    :raise HostError: when the host cannot be reached or the command fails.
    """
    status, err = host_run(host, argv, timeout)
    if status != 0:
        raise HostError(f"could not {what} on {_where(host.uri, host.name)}: {err or f'exit status {status}'}")


@dataclass(frozen=True)
class HostFacts:
    """What labctl learns once from a host's capabilities."""

    user: QemuUser  # whom QEMU runs as
    models: tuple[str, ...]  # security drivers (none, dac, apparmor...)


def host_facts(conn: Any, where: str) -> HostFacts:
    """QEMU's user (the DAC model's base label) and the security drivers of a host.

    :raise HostError: when the host has no DAC model or an unreadable label.
    """
    caps = conn.getCapabilities()
    try:
        users = hostfs.dac_users(caps)
    except ValueError as exc:
        raise HostError(f"libvirt at {where}: {exc}") from exc
    user = users.get("kvm") or users.get("qemu") or next(iter(users.values()), None)
    if user is None:
        raise HostError(f"libvirt at {where} has no DAC security model, so labctl cannot tell which "
                        "user QEMU runs as", hint="check security_driver in /etc/libvirt/qemu.conf there")
    return HostFacts(user, tuple(hostfs.security_models(caps)))


def libvirt_uri() -> str:
    """The libvirt URI labctl uses: ``$LABCTL_LIBVIRT_URI`` or ``qemu:///system``."""
    return os.environ.get(URI_ENV) or DEFAULT_URI


def _libvirt() -> Any:
    """The ``libvirt`` module, with its default error printing to stderr silenced.

    :raise HostError: when libvirt-python is not installed.
    """
    try:
        import libvirt
    except ImportError as exc:
        raise HostError("the libvirt backend needs libvirt-python, which is not installed",
                        hint=SETUP_HINT) from exc
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


def _message(exc: Exception) -> str:
    """libvirt's own message of an error, on one line."""
    text = exc.get_error_message() if hasattr(exc, "get_error_message") else None
    return " ".join(str(text or exc).split())


def _where(uri: str, host: str | None) -> str:
    """``host h2 (qemu+ssh://...)``, or just the URI when the host has no name."""
    return f"host {host} ({uri})" if host else uri


@contextmanager
def connection(uri: str, host: str | None = None) -> Iterator[Any]:
    """An open ``virConnect`` to ``uri``: the boundary where libvirt errors become labctl's.

    ``host`` is the lab's name for that host, used in messages.

    :raise HostError: when libvirtd cannot be reached at ``uri``.
    :raise MachineError: for any libvirt error while connected.
    """
    lv = _libvirt()
    try:
        conn = lv.open(uri)
    except lv.libvirtError as exc:
        remote = "+ssh" in uri.split(":", 1)[0]
        what = f"host {host} ({uri}) is unreachable" if host else f"cannot connect to libvirt at {uri}"
        raise HostError(f"{what}: {_message(exc)}",
                        hint=REMOTE_HINT.format(uri=uri) if remote else SETUP_HINT) from exc
    try:
        yield conn
    except lv.libvirtError as exc:
        raise MachineError(f"libvirt ({_where(uri, host)}): {_message(exc)}") from exc
    finally:
        try:
            conn.close()
        except lv.libvirtError:
            pass


def _lookup(conn: Any, rec_or_name: GuestRecord | str) -> Any | None:
    """The domain of a record (by UUID if known, else by name), or None if it is gone."""
    lv = _libvirt()
    try:
        if isinstance(rec_or_name, str):
            return conn.lookupByName(rec_or_name)
        uuid = rec_or_name.extra.get("uuid")
        if uuid:
            return conn.lookupByUUIDString(uuid)
        return conn.lookupByName(rec_or_name.extra["domain"])
    except lv.libvirtError as exc:
        if exc.get_error_code() == lv.VIR_ERR_NO_DOMAIN:
            return None
        raise


def _is_running(dom: Any) -> bool:
    """True while the domain's machine exists (running, paused, shutting down...)."""
    lv = _libvirt()
    try:
        state = dom.state()[0]
    except lv.libvirtError as exc:
        if exc.get_error_code() == lv.VIR_ERR_NO_DOMAIN:
            return False
        raise
    return state not in (lv.VIR_DOMAIN_SHUTOFF, lv.VIR_DOMAIN_CRASHED, lv.VIR_DOMAIN_NOSTATE)


def _console_path(xml: str) -> str | None:
    """The serial console file of a domain's XML."""
    import xml.etree.ElementTree as ET

    src = ET.fromstring(xml).find("./devices/serial/source")
    return src.get("path") if src is not None else None


def qemu_pid(name: str) -> int:
    """QEMU's pid for a running domain of ``qemu:///system`` (0 when unknown)."""
    try:
        return int((RUN_DIR / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return 0


def _wait_gone(conn: Any, rec: GuestRecord, timeout: float) -> bool:
    """Wait up to ``timeout`` s for the domain to stop; True if it did."""
    deadline = time.monotonic() + timeout
    while True:
        dom = _lookup(conn, rec)
        if dom is None or not _is_running(dom):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _destroy(dom: Any) -> None:
    """Hard-stop a domain; one that is already gone is fine."""
    lv = _libvirt()
    try:
        dom.destroy()
    except lv.libvirtError as exc:
        if exc.get_error_code() not in (lv.VIR_ERR_NO_DOMAIN, lv.VIR_ERR_OPERATION_INVALID):
            raise


def _log_reason(lines: list[str]) -> str:
    """The telling part of a libvirt QEMU log: QEMU's last error of the last run, and why it stopped."""
    starts = [i for i, ln in enumerate(lines) if ": starting up" in ln]
    run = lines[starts[-1]:] if starts else lines
    errors = [ln for ln in run if "qemu-system" in ln and ": " in ln
              and not ln.startswith("LC_ALL") and "terminating on signal" not in ln]
    last = run[-1] if run else ""
    if errors and errors[-1] != last:
        return f"{errors[-1]} ({last})" if "shutting down" in last else errors[-1]
    return last


def _is_ours(xml: str, run_dir: Path, console: Path) -> bool:
    """True when a domain's XML says it was started from ``run_dir`` (or logs to its console file)."""
    import xml.etree.ElementTree as ET

    desc = ET.fromstring(xml).findtext("description") or ""
    return desc == f"labctl run directory {run_dir}" or _console_path(xml) == str(console)


def _stop_relay(pid: int, marker: str) -> None:
    """SIGTERM a console relay (if that pid still is one) and wait for it."""
    if not pid_alive(pid) or not any(marker in a for a in pid_cmdline(pid)):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 3
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)

def _check_socket_paths(plan: GuestPlan) -> None:
    """Refuse a guest whose unix socket paths (gdbstub, lab links) do not fit in ``sun_path``.

    :raise MachineError: naming the longest one.
    """
    paths = [gdb_socket(plan)] + [str(a) for p in plan.ports.values() for a in (p.local, p.remote)
                                  if a is not None and not isinstance(a, UdpAddr)]
    long = hostfs.too_long(paths)
    if long:
        raise MachineError(f"guest {plan.guest.name}: the socket path {long[0]} is longer than "
                           f"{hostfs.SUN_PATH_MAX} bytes", hint="use a shorter lab or guest name")


class LibvirtBackend:
    """Runs guests as transient libvirt domains, on this machine or on remote hosts."""

    name = "libvirt"

    def __init__(self) -> None:
        self._images: dict[str, storage.HostImage] = {}  # host URI -> image volumes there
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
                    self._facts[host.uri] = host_facts(c, _where(host.uri, host.name))
            else:
                self._facts[host.uri] = host_facts(conn, _where(host.uri, host.name))
        return self._facts[host.uri]

    def _files_preview(self, plan: GuestPlan) -> DomainFiles:
        """The paths the guest will use on its host (this run's image volumes when known)."""
        files = planned_files(plan)
        img = self._images.get(self._host(plan).uri)
        if img is None:
            return files
        return DomainFiles(img.kernel, img.initrd, files.disk, files.fw_cfg, files.gdb_socket)

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
                if uri not in self._images:
                    img = storage.ensure_image(conn, image, local=not host.remote)
                    self._images[uri] = img
                    notes += [f"uploaded {vol} to pool {storage.POOL} on host {host.name} in {secs:.1f} s "
                              "(read back, sha256 matches the image manifest)" for vol, secs in img.uploaded]
        return notes

    def _passable_pool(self, conn: Any, host: HostPlace) -> None:
        """The pool, with a directory QEMU's user may pass through (an older labctl made it 0700).

        :raise HostError: when its mode cannot be changed.
        """
        pool = storage.ensure_pool(conn)
        path, mode = storage.pool_target(pool)
        if not storage.pool_is_passable(mode):
            host_command(host, ["chmod", f"{storage.POOL_MODE:04o}", "--", path],
                         f"let QEMU's user reach the volumes of pool {storage.POOL} ({path})")
            pool.refresh(0)

    def start(self, plan: GuestPlan) -> GuestRecord:
        """Volumes and the guest's directory on its host, the domain started paused,
        the console relay attached, resume.

        :raise MachineError: when libvirt refuses the domain or the console.
        :raise HostError: when the host lacks something.
        """
        host = self._host(plan)
        name = domain_name(plan.lab, plan.guest.name)
        _check_socket_paths(plan)
        lv = _libvirt()
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
            dom = self._create(conn, plan, host, name, xml, lv.VIR_DOMAIN_START_PAUSED)
            uuid = dom.UUIDString()
            relay = self._attach_console(plan, host, uuid)
            dom.resume()
        pid = 0 if host.remote else qemu_pid(name)
        argv = pid_cmdline(pid) if pid else []
        hop = host.ssh_hop
        return GuestRecord(name=plan.guest.name, backend=self.name, pid=pid, dir=str(plan.dir),
                           console=str(plan.console), qmp="", ssh_port=plan.ssh_port, accel=plan.accel,
                           argv=argv or xml.splitlines(), gdb=files.gdb_socket,
                           extra={"uri": host.uri, "host": host.name, "domain": name, "uuid": uuid,
                                  "remote": host.remote, "relay_pid": relay, "qemu_user": facts.user.label,
                                  "ssh_via": hop.to_dict() if hop else None,
                                  "volumes": [files.disk, *files.fw_cfg.values()]})

    def _create(self, conn: Any, plan: GuestPlan, host: HostPlace, name: str, xml: str, flags: int) -> Any:
        """Create the transient domain, journaled first.

        :raise MachineError: when libvirt refuses it.
        """
        owned.record(plan.dir, {"backend": self.name, "kind": "domain", "uri": host.uri, "host": host.name,
                                "name": name, "run_dir": str(plan.dir)})
        try:
            return conn.createXML(xml, flags)
        except _libvirt().libvirtError as exc:
            raise MachineError(f"libvirt ({_where(host.uri, host.name)}) could not start guest "
                               f"{plan.guest.name} as domain {name}: {_message(exc)}") from exc

    def _volumes(self, conn: Any, pool: Any, plan: GuestPlan, host: HostPlace, img: storage.HostImage,
                 user: QemuUser) -> DomainFiles:
        """The guest's overlay and fw_cfg volumes, owned by QEMU's user (0600), each journaled
        before it is created."""
        owner = (user.uid, user.gid)

        def make(vol: str, create: Any) -> str:
            owned.record(plan.dir, {"backend": self.name, "kind": "volume", "uri": host.uri,
                                    "host": host.name, "pool": storage.POOL, "name": vol})
            storage.delete_volume(pool, vol)  # a leftover of this very guest (its domain is gone)
            return str(create(vol).path())

        disk = make(disk_volume(plan),
                    lambda v: storage.create_overlay(pool, v, img.rootfs, img.rootfs_size, owner))
        local = dict(zip(FW_CFG_NAMES, (plan.config, plan.authorized_keys, plan.host_key), strict=True))
        fw_cfg = {entry: make(vol, lambda v, p=local[entry]: storage.upload_bytes(conn, pool, v, p.read_bytes(),
                                                                                 owner=owner))
                  for entry, vol in fw_cfg_volumes(plan).items()}
        return DomainFiles(img.kernel, img.initrd, disk, fw_cfg, gdb_socket(plan))

    def _host_dir(self, journal_dir: Path, host: HostPlace, path: str, user: QemuUser, replace: bool) -> None:
        """A 0700 directory below ``RUN_ROOT`` on ``host``, owned by QEMU's user, journaled in
        ``journal_dir`` first. ``replace`` empties a leftover; otherwise one is refused (and
        taken out of the journal again: it is not ours).

        :raise HostError: when the host cannot make it, or it exists and may not be replaced.
        """
        entry = {"backend": self.name, "kind": "host-dir", "uri": host.uri, "host": host.name, "path": path}
        owned.record(journal_dir, entry)
        status, err = host_run(host, hostfs.mkdir_argv(path, user, replace))
        if status == hostfs.EXISTS_STATUS and not replace:
            owned.forget(journal_dir, entry)
            raise HostError(f"{path} already exists on {_where(host.uri, host.name)}: a lab of that name "
                            "runs there from another labctl state directory, or one was left behind",
                            hint=f"take that lab down where it was started, or remove {path} if nothing uses it")
        if status != 0:
            raise HostError(f"could not make {path} for QEMU's user ({user.describe(not host.remote)}) on "
                            f"{_where(host.uri, host.name)}: {err or f'exit status {status}'}")

    def _attach_console(self, plan: GuestPlan, host: HostPlace, uuid: str) -> int:
        """Start the console relay and wait until it is attached (it then creates ``console.log``).

        :raise MachineError: when the relay exits or does not attach in time.
        """
        plan.console.unlink(missing_ok=True)
        log_path = plan.dir / "console-relay.log"
        proc = spawn([sys.executable, "-m", RELAY, host.uri, uuid, str(plan.console)], log_path)
        owned.record(plan.dir, {"backend": self.name, "kind": "process", "pid": proc.pid, "marker": RELAY})
        deadline = time.monotonic() + CONSOLE_ATTACH_TIMEOUT
        while not plan.console.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log_path.read_text(errors="replace").strip() if log_path.exists() else ""
                raise MachineError(f"could not read the console of guest {plan.guest.name} on "
                                   f"{_where(host.uri, host.name)}: {text or 'the console relay did not attach'}")
            time.sleep(0.05)
        return proc.pid

    def _clear_stale(self, conn: Any, uri: str, name: str, plan: GuestPlan) -> None:
        """Destroy a leftover domain of this very guest; refuse one that belongs elsewhere.

        :raise MachineError: when a domain of that name runs from another run directory.
        """
        dom = _lookup(conn, name)
        if dom is None:
            return
        if not _is_ours(dom.XMLDesc(0), plan.dir, plan.console):
            raise MachineError(f"libvirt ({uri}) already has a domain named {name}, "
                               "run from another labctl state directory",
                               hint=f"take it down there, or: virsh -c {uri} destroy {name}")
        _destroy(dom)

    def alive(self, rec: GuestRecord) -> bool:
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = _lookup(conn, rec)
            return dom is not None and _is_running(dom)

    def stop(self, rec: GuestRecord, timeout: float) -> None:
        """ACPI power button, wait up to ``timeout`` s, then destroy."""
        lv = _libvirt()
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = _lookup(conn, rec)
            if dom is None or not _is_running(dom):
                return
            try:
                dom.shutdown()
            except lv.libvirtError:
                pass  # not running any more, or no ACPI: destroy below
            if not _wait_gone(conn, rec, timeout):
                _destroy(dom)
                _wait_gone(conn, rec, 5.0)

    def kill(self, rec: GuestRecord) -> None:
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = _lookup(conn, rec)
            if dom is not None:
                _destroy(dom)
                _wait_gone(conn, rec, 5.0)

    def cleanup(self, guest_dir: Path) -> None:
        """Destroy the journal's domains, stop its relays, delete its volumes and
        directories (newest first). ``guest_dir`` may also be a lab's run directory
        (its journal holds the lab's socket directory).

        Things already gone are fine. Every host is tried; the first failure
        is raised at the end.

        :raise HostError: when a host with something of this guest is unreachable.
        """
        failures: list[LabctlError] = []
        for entry in reversed(owned.entries(guest_dir)):
            try:
                self._release(entry, guest_dir)
            except LabctlError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def _release(self, entry: dict[str, Any], guest_dir: Path) -> None:
        """Remove one journaled thing."""
        kind = entry.get("kind")
        if kind == "process":
            _stop_relay(int(entry["pid"]), str(entry.get("marker", RELAY)))
            return
        if kind in ("host-dir", "remote-dir"):  # remote-dir: journals of an older labctl
            path = str(entry.get("path", ""))
            if hostfs.is_run_dir(path):  # never anything else
                host = host_place(str(entry.get("host") or "host"), str(entry["uri"]))
                host_command(host, hostfs.rmdir_argv(path), f"remove {path}")
            return
        with connection(entry["uri"], entry.get("host")) as conn:
            if kind == "domain":
                dom = _lookup(conn, entry["name"])
                if dom is not None and _is_ours(dom.XMLDesc(0), guest_dir, guest_dir / "console.log"):
                    _destroy(dom)
            elif kind == "volume":
                pool = storage.lookup_pool(conn, entry["pool"])
                if pool is not None and storage.delete_volume(pool, entry["name"]):
                    log.info("deleted volume %s on %s", entry["name"], _where(entry["uri"], entry.get("host")))

    def exit_reason(self, rec: GuestRecord) -> str:
        """From libvirt's log of the domain (``/var/log/libvirt/qemu/<name>.log``)."""
        path = LOG_DIR / f"{rec.extra['domain']}.log"
        if rec.extra.get("remote"):
            return (f"domain {rec.extra['domain']} stopped on {_where(rec.extra['uri'], rec.extra.get('host'))}; "
                    f"QEMU's log is {path} there")
        try:
            with open(path, errors="replace") as f:
                lines = [ln.strip() for ln in f.readlines()[-200:] if ln.strip()]
        except OSError:
            return f"no log from libvirt ({path} is not readable)"
        return _log_reason(lines) or "no message from QEMU"

    def qmp(self, rec: GuestRecord, command: str, args: dict[str, Any] | None = None) -> Any:
        """Run one QMP command through libvirt's monitor passthrough; return its ``return``.

        :raise MachineError: when the domain is gone or the command fails.
        """
        import libvirt_qemu

        request = json.dumps({"execute": command, **({"arguments": args} if args else {})})
        with connection(rec.extra["uri"], rec.extra.get("host")) as conn:
            dom = _lookup(conn, rec)
            if dom is None:
                raise MachineError(f"guest {rec.name}: domain {rec.extra['domain']} is not running "
                                   f"on {rec.extra['uri']}")
            reply = json.loads(libvirt_qemu.qemuMonitorCommand(dom, request, 0))
        if "error" in reply:
            err = reply["error"]
            raise MachineError(f"QMP {command} on domain {rec.extra['domain']} failed: "
                               f"{err.get('class')}: {err.get('desc')}")
        return reply.get("return")
