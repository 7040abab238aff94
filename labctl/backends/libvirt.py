"""The libvirt backend: each guest is a transient libvirt domain.

The domain (``labctl-<lab>-<guest>``, XML from
:mod:`labctl.backends.libvirt_xml`) runs the same machine as the qemu
backend, on the libvirt URI in ``$LABCTL_LIBVIRT_URI`` (default
``qemu:///system``). Transient domains vanish when they stop, so ``down``
leaves nothing behind in ``virsh list --all``.

A guest may run on another host (``qemu+ssh://``, see :mod:`labctl.hosts`):
its image is uploaded to that host's storage pool and its disk and fw_cfg
files are volumes there (:mod:`labctl.backends.libvirt_storage`), its
console is copied home by a relay process
(:mod:`labctl.backends.libvirt_console`), and SSH reaches it through the
host's own sshd. Everything created on a host is written to the guest's
ownership journal (:mod:`labctl.owned`) first, and :meth:`LibvirtBackend.cleanup`
removes exactly that.

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
from pathlib import Path
from typing import Any

from labctl import owned
from labctl.backends import libvirt_storage as storage
from labctl.backends.base import GuestPlan, GuestRecord
from labctl.backends.libvirt_xml import FW_CFG_NAMES, DomainFiles, domain_name, domain_xml
from labctl.errors import HostError, LabctlError, MachineError
from labctl.hosts import HostPlace, host_place
from labctl.lab.uri import SshHop
from labctl.proc import pid_alive, pid_cmdline, spawn

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
# A remote guest's private directory on its host (the gdbstub's socket): 0700,
# made over SSH, journaled, removed by cleanup.
REMOTE_RUN_DIR = "/var/lib/libvirt/labctl-run"


def remote_gdb_socket(lab: str, guest: str) -> str:
    """Where a remote guest's gdbstub listens on its host: a socket in the guest's 0700 directory."""
    return f"{REMOTE_RUN_DIR}/{domain_name(lab, guest)}/gdb.sock"


def host_command(hop: SshHop, argv: list[str], what: str, timeout: float = 30.0) -> None:
    """Run ``argv`` on a remote host through its SSH login (as its URI logs in).

    :raise HostError: when the host cannot be reached or the command fails.
    """
    from labctl.ssh import run_on_host

    status, err = run_on_host(hop, argv, timeout)
    if status != 0:
        raise HostError(f"could not {what}: {err or f'exit status {status}'}")


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


def _security_models(conn: Any) -> list[str]:
    """libvirtd's primary security driver (``none``, ``apparmor``, ``selinux``).

    Not ``getCapabilities()``: that re-validates every QEMU binary's probed
    capabilities on each call, which is slow and has hung libvirtd here.
    """
    model = conn.getSecurityModel()[0]
    return [model] if model else []


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


class LibvirtBackend:
    """Runs guests as transient libvirt domains, on this machine or on remote hosts."""

    name = "libvirt"

    def __init__(self) -> None:
        self._images: dict[str, storage.RemoteImage] = {}  # host URI -> image volumes there

    def command(self, plan: GuestPlan) -> list[str]:
        """The domain XML, one line per element."""
        return domain_xml(plan, files=self._files_preview(plan)).splitlines()

    @staticmethod
    def _host(plan: GuestPlan) -> HostPlace:
        return plan.host or host_place("local", libvirt_uri())

    def _files_preview(self, plan: GuestPlan) -> DomainFiles | None:
        """The volume paths a remote guest will use (the pool's directory), for printing."""
        if not self._host(plan).remote:
            return None
        vol = f"{storage.POOL_DIR}/{domain_name(plan.lab, plan.guest.name)}"
        img = self._images.get(self._host(plan).uri)
        return DomainFiles(img.kernel if img else f"{storage.POOL_DIR}/{plan.image.name}-vmlinux-...",
                           img.initrd if img else f"{storage.POOL_DIR}/{plan.image.name}-initrd.img-...",
                           f"{vol}-disk.qcow2", {n: f"{vol}-{n.rsplit('/', 1)[1]}" for n in FW_CFG_NAMES}, None,
                           remote_gdb_socket(plan.lab, plan.guest.name))

    def prepare(self, plans: list[GuestPlan]) -> list[str]:
        """Connect to every host once (an unreachable one is named) and upload the image
        to each remote host's pool when it is not there yet.

        :raise HostError: when a host is unreachable.
        :raise ImageError: when an upload does not verify.
        """
        notes: list[str] = []
        hosts = {self._host(p).uri: (self._host(p), p.image) for p in plans}
        for uri, (host, image) in hosts.items():
            with connection(uri, host.name) as conn:
                conn.getLibVersion()
                if host.remote and uri not in self._images:
                    img = storage.ensure_image(conn, image)
                    self._images[uri] = img
                    notes += [f"uploaded {vol} to pool {storage.POOL} on host {host.name} in {secs:.1f} s "
                              "(read back, sha256 matches the image manifest)" for vol, secs in img.uploaded]
        return notes

    def start(self, plan: GuestPlan) -> GuestRecord:
        host = self._host(plan)
        name = domain_name(plan.lab, plan.guest.name)
        with connection(host.uri, host.name) as conn:
            self._clear_stale(conn, host.uri, name, plan)
            if host.remote:
                return self._start_remote(conn, plan, host, name)
            xml = domain_xml(plan, _security_models(conn))
            (plan.dir / "domain.xml").write_text(xml)
            dom = self._create(conn, plan, host, name, xml, 0)
            uuid = dom.UUIDString()
        pid = qemu_pid(name)
        argv = pid_cmdline(pid) if pid else []
        return GuestRecord(name=plan.guest.name, backend=self.name, pid=pid, dir=str(plan.dir),
                           console=str(plan.console), qmp="", ssh_port=plan.ssh_port, accel=plan.accel,
                           argv=argv or xml.splitlines(), gdb=str(plan.gdb_socket),
                           extra={"uri": host.uri, "host": host.name, "domain": name, "uuid": uuid})

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

    def _start_remote(self, conn: Any, plan: GuestPlan, host: HostPlace, name: str) -> GuestRecord:
        """Volumes in the host's pool, the domain started paused, the console relay attached, resume."""
        lv = _libvirt()
        img = self._images.get(host.uri) or storage.ensure_image(conn, plan.image)
        self._images[host.uri] = img
        pool = storage.ensure_pool(conn)
        files = self._volumes(conn, pool, plan, host, name, img)
        xml = domain_xml(plan, _security_models(conn), files)
        (plan.dir / "domain.xml").write_text(xml)
        dom = self._create(conn, plan, host, name, xml, lv.VIR_DOMAIN_START_PAUSED)
        uuid = dom.UUIDString()
        relay = self._attach_console(plan, host, uuid)
        dom.resume()
        hop = host.ssh_hop
        return GuestRecord(name=plan.guest.name, backend=self.name, pid=0, dir=str(plan.dir),
                           console=str(plan.console), qmp="", ssh_port=plan.ssh_port, accel=plan.accel,
                           argv=xml.splitlines(), gdb=files.gdb_socket,
                           extra={"uri": host.uri, "host": host.name, "domain": name, "uuid": uuid,
                                  "remote": True, "relay_pid": relay,
                                  "ssh_via": hop.to_dict() if hop else None,
                                  "volumes": [files.disk, *files.fw_cfg.values()]})

    def _volumes(self, conn: Any, pool: Any, plan: GuestPlan, host: HostPlace, name: str,
                 img: storage.RemoteImage) -> DomainFiles:
        """The guest's overlay and fw_cfg volumes, each journaled before it is created."""
        def make(vol: str, create: Any) -> str:
            owned.record(plan.dir, {"backend": self.name, "kind": "volume", "uri": host.uri,
                                    "host": host.name, "pool": storage.POOL, "name": vol})
            storage.delete_volume(pool, vol)  # a leftover of this very guest (its domain is gone)
            return str(create(vol).path())

        disk = make(f"{name}-disk.qcow2",
                    lambda v: storage.create_overlay(pool, v, img.rootfs, img.rootfs_size))
        local = dict(zip(FW_CFG_NAMES, (plan.config, plan.authorized_keys, plan.host_key), strict=True))
        fw_cfg = {entry: make(f"{name}-{entry.rsplit('/', 1)[1]}",
                              lambda v, p=path: storage.upload_bytes(conn, pool, v, p.read_bytes()))
                  for entry, path in local.items()}
        gdb = remote_gdb_socket(plan.lab, plan.guest.name)
        self._remote_dir(plan, host, str(Path(gdb).parent))
        return DomainFiles(img.kernel, img.initrd, disk, fw_cfg, None, gdb)

    def _remote_dir(self, plan: GuestPlan, host: HostPlace, path: str) -> None:
        """The guest's 0700 directory on its host (journaled first, emptied if left over).

        :raise HostError: when the host's SSH login fails.
        """
        hop = host.ssh_hop
        assert hop is not None
        owned.record(plan.dir, {"backend": self.name, "kind": "remote-dir", "uri": host.uri,
                                "host": host.name, "path": path})
        host_command(hop, ["sh", "-c", 'rm -rf -- "$1" && mkdir -p -m 0700 -- "$1"', "sh", path],
                     f"make the guest's directory {path} on host {host.name}")

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
        """Destroy the journal's domains, stop its relays, delete its volumes (newest first).

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
        if kind == "remote-dir":
            path = str(entry.get("path", ""))
            if path.startswith(REMOTE_RUN_DIR + "/") and "/.." not in path:  # never anything else
                host = host_place(str(entry.get("host") or "remote"), str(entry["uri"]))
                if host.ssh_hop is not None:
                    host_command(host.ssh_hop, ["rm", "-rf", "--", path],
                                 f"remove the guest's directory {path} on host {host.name}")
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
