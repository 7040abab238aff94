"""The libvirt backend: each guest is a transient libvirt domain.

The domain (``labctl-<lab>-<guest>``, XML from
:mod:`labctl.backends.libvirt_xml`) runs the same machine as the qemu
backend, on the libvirt URI in ``$LABCTL_LIBVIRT_URI`` (default
``qemu:///system``). Transient domains vanish when they stop, so ``down``
leaves nothing behind in ``virsh list --all``.

Every :class:`libvirt.libvirtError` is mapped to a labctl error in one place,
:func:`connection`: failing to connect is a :class:`HostError`, anything
after that a :class:`MachineError`; both name the URI.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from labctl.backends.base import GuestPlan, GuestRecord
from labctl.backends.libvirt_xml import domain_name, domain_xml
from labctl.errors import HostError, MachineError
from labctl.proc import pid_cmdline

URI_ENV = "LABCTL_LIBVIRT_URI"
DEFAULT_URI = "qemu:///system"
SETUP_HINT = "run scripts/libvirt-setup.sh as root (installs libvirt, starts libvirtd, installs libvirt-python)"
RUN_DIR = Path("/run/libvirt/qemu")  # qemu:///system's pidfiles
LOG_DIR = Path("/var/log/libvirt/qemu")  # qemu:///system's per-domain QEMU logs


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


@contextmanager
def connection(uri: str) -> Iterator[Any]:
    """An open ``virConnect`` to ``uri``: the boundary where libvirt errors become labctl's.

    :raise HostError: when libvirtd cannot be reached at ``uri``.
    :raise MachineError: for any libvirt error while connected.
    """
    lv = _libvirt()
    try:
        conn = lv.open(uri)
    except lv.libvirtError as exc:
        raise HostError(f"cannot connect to libvirt at {uri}: {_message(exc)}", hint=SETUP_HINT) from exc
    try:
        yield conn
    except lv.libvirtError as exc:
        raise MachineError(f"libvirt ({uri}): {_message(exc)}") from exc
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


class LibvirtBackend:
    """Runs guests as transient libvirt domains."""

    name = "libvirt"

    def command(self, plan: GuestPlan) -> list[str]:
        """The domain XML, one line per element."""
        return domain_xml(plan).splitlines()

    def start(self, plan: GuestPlan) -> GuestRecord:
        uri = libvirt_uri()
        name = domain_name(plan.lab, plan.guest.name)
        with connection(uri) as conn:
            xml = domain_xml(plan, _security_models(conn))
            (plan.dir / "domain.xml").write_text(xml)
            self._clear_stale(conn, uri, name, plan)
            try:
                dom = conn.createXML(xml, 0)
            except _libvirt().libvirtError as exc:
                raise MachineError(f"libvirt ({uri}) could not start guest {plan.guest.name} "
                                   f"as domain {name}: {_message(exc)}") from exc
            uuid = dom.UUIDString()
        pid = qemu_pid(name)
        argv = pid_cmdline(pid) if pid else []
        return GuestRecord(name=plan.guest.name, backend=self.name, pid=pid, dir=str(plan.dir),
                           console=str(plan.console), qmp="", ssh_port=plan.ssh_port, accel=plan.accel,
                           argv=argv or xml.splitlines(), gdb_port=plan.gdb_port,
                           extra={"uri": uri, "domain": name, "uuid": uuid})

    @staticmethod
    def _clear_stale(conn: Any, uri: str, name: str, plan: GuestPlan) -> None:
        """Destroy a leftover domain of this very guest; refuse one that belongs elsewhere.

        :raise MachineError: when a domain of that name runs from another run directory.
        """
        dom = _lookup(conn, name)
        if dom is None:
            return
        if _console_path(dom.XMLDesc(0)) != str(plan.console):
            raise MachineError(f"libvirt ({uri}) already has a domain named {name}, "
                               "run from another labctl state directory",
                               hint=f"take it down there, or: virsh -c {uri} destroy {name}")
        _destroy(dom)

    def alive(self, rec: GuestRecord) -> bool:
        with connection(rec.extra["uri"]) as conn:
            dom = _lookup(conn, rec)
            return dom is not None and _is_running(dom)

    def stop(self, rec: GuestRecord, timeout: float) -> None:
        """ACPI power button, wait up to ``timeout`` s, then destroy."""
        lv = _libvirt()
        with connection(rec.extra["uri"]) as conn:
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
        with connection(rec.extra["uri"]) as conn:
            dom = _lookup(conn, rec)
            if dom is not None:
                _destroy(dom)
                _wait_gone(conn, rec, 5.0)

    def exit_reason(self, rec: GuestRecord) -> str:
        """From libvirt's log of the domain (``/var/log/libvirt/qemu/<name>.log``)."""
        path = LOG_DIR / f"{rec.extra['domain']}.log"
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
        with connection(rec.extra["uri"]) as conn:
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
