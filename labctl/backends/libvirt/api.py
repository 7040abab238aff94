"""libvirt itself: the binding, connections (the one place libvirt's errors become labctl's),
domains' states, and running commands on a host (here, or over SSH for ``qemu+ssh://``).

Every :class:`libvirt.libvirtError` is mapped in :func:`connection`: failing
to connect is a :class:`HostError`, anything after that a :class:`MachineError`;
both name the host and its URI.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import labctl.backends.libvirt.host as hostfs
from labctl.backends.base import GuestPlan, GuestRecord
from labctl.backends.libvirt.binding import SETUP_HINT, binding
from labctl.backends.libvirt.host import QemuUser
from labctl.backends.libvirt.xml import (
    gdb_socket,
)
from labctl.errors import HostError, MachineError, ProcessError
from labctl.lab import HostPlace
from labctl.net import UdpAddr
from labctl.proc import run

log = logging.getLogger(__name__)

URI_ENV = "LABCTL_LIBVIRT_URI"
DEFAULT_URI = "qemu:///system"
REMOTE_HINT = ("check that 'virsh -c {uri} version' works from here: the host needs sshd, libvirtd, and "
               "virt-ssh-helper or nc; the URI's user, port and keyfile must log in without a password")
RELAY = "labctl.backends.libvirt.relay"
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
        raise HostError(f"could not {what} on {where(host.uri, host.name)}: {err or f'exit status {status}'}")


def host_io(host: HostPlace, argv: list[str], what: str, data: bytes = b"", timeout: float = 60.0) -> bytes:
    """Run ``argv`` on ``host`` with ``data`` on its standard input; its standard output.

    :raise HostError: when the host cannot be reached or the command fails.
    """
    hop = host.ssh_hop
    if hop is None:
        try:
            res = run(argv, timeout=timeout, input=data, check=False)
        except ProcessError as exc:
            status, out, err = 255, b"", exc.message
        else:
            status, out, err = res.returncode, res.stdout, res.stderr.decode(errors="replace").strip()
    else:
        from labctl.ssh import io_on_host

        status, out, err = io_on_host(hop, argv, data, timeout)
    if status != 0:
        raise HostError(f"could not {what} on {where(host.uri, host.name)}: {err or f'exit status {status}'}")
    return out


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


def message(exc: Exception) -> str:
    """libvirt's own message of an error, on one line."""
    text = exc.get_error_message() if hasattr(exc, "get_error_message") else None
    return " ".join(str(text or exc).split())


def where(uri: str, host: str | None) -> str:
    """``host h2 (qemu+ssh://...)``, or just the URI when the host has no name."""
    return f"host {host} ({uri})" if host else uri


@contextmanager
def connection(uri: str, host: str | None = None) -> Iterator[Any]:
    """An open ``virConnect`` to ``uri``: the boundary where libvirt errors become labctl's.

    ``host`` is the lab's name for that host, used in messages.

    :raise HostError: when libvirtd cannot be reached at ``uri``.
    :raise MachineError: for any libvirt error while connected.
    """
    lv = binding()
    try:
        conn = lv.open(uri)
    except lv.libvirtError as exc:
        remote = "+ssh" in uri.split(":", 1)[0]
        what = f"host {host} ({uri}) is unreachable" if host else f"cannot connect to libvirt at {uri}"
        raise HostError(f"{what}: {message(exc)}",
                        hint=REMOTE_HINT.format(uri=uri) if remote else SETUP_HINT) from exc
    try:
        yield conn
    except lv.libvirtError as exc:
        raise MachineError(f"libvirt ({where(uri, host)}): {message(exc)}") from exc
    finally:
        try:
            conn.close()
        except lv.libvirtError:
            pass


def lookup(conn: Any, rec_or_name: GuestRecord | str) -> Any | None:
    """The domain of a record (by UUID if known, else by name), or None if it is gone."""
    lv = binding()
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


def is_running(dom: Any) -> bool:
    """True while the domain's machine exists (running, paused, shutting down...)."""
    lv = binding()
    try:
        state = dom.state()[0]
    except lv.libvirtError as exc:
        if exc.get_error_code() == lv.VIR_ERR_NO_DOMAIN:
            return False
        raise
    return state not in (lv.VIR_DOMAIN_SHUTOFF, lv.VIR_DOMAIN_CRASHED, lv.VIR_DOMAIN_NOSTATE)


def console_path(xml: str) -> str | None:
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


def wait_gone(conn: Any, rec: GuestRecord, timeout: float) -> bool:
    """Wait up to ``timeout`` s for the domain to stop; True if it did."""
    deadline = time.monotonic() + timeout
    while True:
        dom = lookup(conn, rec)
        if dom is None or not is_running(dom):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def destroy(dom: Any) -> None:
    """Hard-stop a domain; one that is already gone is fine."""
    lv = binding()
    try:
        dom.destroy()
    except lv.libvirtError as exc:
        if exc.get_error_code() not in (lv.VIR_ERR_NO_DOMAIN, lv.VIR_ERR_OPERATION_INVALID):
            raise


def log_reason(lines: list[str]) -> str:
    """The telling part of a libvirt QEMU log: QEMU's last error of the last run, and why it stopped."""
    starts = [i for i, ln in enumerate(lines) if ": starting up" in ln]
    run = lines[starts[-1]:] if starts else lines
    errors = [ln for ln in run if "qemu-system" in ln and ": " in ln
              and not ln.startswith("LC_ALL") and "terminating on signal" not in ln]
    last = run[-1] if run else ""
    if errors and errors[-1] != last:
        return f"{errors[-1]} ({last})" if "shutting down" in last else errors[-1]
    return last


def is_ours(xml: str, run_dir: Path, console: Path) -> bool:
    """True when a domain's XML says it was started from ``run_dir`` (or logs to its console file)."""
    import xml.etree.ElementTree as ET

    desc = ET.fromstring(xml).findtext("description") or ""
    return desc == f"labctl run directory {run_dir}" or console_path(xml) == str(console)



def check_socket_paths(plan: GuestPlan) -> None:
    """Refuse a guest whose unix socket paths (gdbstub, lab links) do not fit in ``sun_path``.

    :raise MachineError: naming the longest one.
    """
    paths = [gdb_socket(plan)] + [str(a) for p in plan.ports.values() for a in (p.local, p.remote)
                                  if a is not None and not isinstance(a, UdpAddr)]
    long = hostfs.too_long(paths)
    if long:
        raise MachineError(f"guest {plan.guest.name}: the socket path {long[0]} is longer than "
                           f"{hostfs.SUN_PATH_MAX} bytes", hint="use a shorter lab or guest name")


