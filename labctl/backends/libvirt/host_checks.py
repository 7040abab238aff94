"""What the libvirt backend needs of a host (``labctl doctor``), and what a host has free (a class's placement).

On this machine: the Python binding, libvirtd answering on ``$LABCTL_LIBVIRT_URI`` with libvirt 9.0
or newer, and whom it runs QEMU as (its unprivileged user, or root: a warning). For a lab file, the
same on every host it names, and labctl's own SSH login to each remote one (the guests' SSH goes
through it).
"""

from __future__ import annotations

import os
import pwd
import stat

from labctl.backends.base import HostCheck
from labctl.backends.libvirt.api import ROOT_FIX, ROOT_WHY, connection, host_facts, libvirt_uri, where
from labctl.backends.libvirt.binding import binding
from labctl.backends.libvirt.host import QemuUser
from labctl.errors import HostError, LabctlError
from labctl.lab import HostPlace, Lab, parse_uri, place_guests
from labctl.ssh import jump_client

MIN_LIBVIRT = (9, 0, 0)  # fw_cfg sysinfo (6.5), <cpu mode='maximum'> (7.1); tested on 9.0
KIB = 1024


def check_libvirt_python() -> HostCheck:
    try:
        import libvirt
    except ImportError:
        return HostCheck("libvirt-python", False, "missing: run scripts/libvirt-setup.sh")
    v = libvirt.getVersion()
    return HostCheck("libvirt-python", True, f"imports (libvirt library {v // 1000000}.{v // 1000 % 1000}.{v % 1000})")


def check_libvirtd(uri: str | None = None, host: str | None = None) -> HostCheck:
    """libvirtd answers on the URI, with a new enough libvirt."""
    uri = uri or libvirt_uri()
    label = f"host {host}: libvirtd ({uri})" if host else f"libvirtd ({uri})"
    try:
        with connection(uri, host) as conn:
            v = conn.getLibVersion()
            model = conn.getSecurityModel()[0] or "none"
    except LabctlError as exc:
        return HostCheck(label, False, f"{exc.message}; fix: {exc.hint}" if exc.hint else exc.message)
    version = (v // 1000000, v // 1000 % 1000, v % 1000)
    text = ".".join(map(str, version))
    if version < MIN_LIBVIRT:
        return HostCheck(label, False, f"libvirt {text} is older than 9.0; fix: upgrade libvirt on that host")
    return HostCheck(label, True, f"libvirt {text}, security driver {model}")


def kvm_access(user: QemuUser, path: str = "/dev/kvm") -> bool | None:
    """Whether ``user`` may open ``path`` read-write on this machine (None: no such device)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if user.uid == 0:
        return True
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == user.uid:
        return mode & 0o600 == 0o600
    try:  # as libvirt sets them: the label's group and the user's groups (getgrouplist)
        pw = pwd.getpwuid(user.uid)
        groups = {user.gid, *os.getgrouplist(pw.pw_name, pw.pw_gid)}
    except KeyError:
        groups = {user.gid}
    if st.st_gid in groups:
        return mode & 0o060 == 0o060
    return mode & 0o006 == 0o006


def check_qemu_user(uri: str | None = None, host: str | None = None) -> HostCheck:
    """Whom libvirt runs QEMU as on the host: its unprivileged user, or root (a warning)."""
    uri = uri or libvirt_uri()
    label = f"host {host}: QEMU's user" if host else f"QEMU's user ({uri})"
    try:
        with connection(uri, host) as conn:
            user = host_facts(conn, uri).user
    except LabctlError as exc:
        return HostCheck(label, False, f"{exc.message}; fix: {exc.hint}" if exc.hint else exc.message)
    local = not parse_uri(uri).remote
    who = user.describe(local)
    if user.is_root:
        return HostCheck(label, True, f"root ({who}): weaker, because {ROOT_WHY}; fix: {ROOT_FIX}", warn=True)
    detail = f"{who}, not root: guests' files and sockets are made for it, mode 0600/0700"
    if local and kvm_access(user) is False:
        detail += ("; it cannot open /dev/kvm, so libvirt guests run under TCG (scripts/libvirt-setup.sh "
                   "gives group kvm read-write on it, as udev does)")
    return HostCheck(label, True, detail)


def check_ssh_hop(host: str, uri: str) -> HostCheck:
    """labctl itself logs in to a remote host (guests' SSH goes through it), with the URI's account."""
    hop = parse_uri(uri).ssh_hop()
    assert hop is not None
    label = f"host {host}: ssh {hop.user}@{hop.host}:{hop.port}"
    try:
        jump_client(hop, timeout=15).close()
    except Exception as exc:  # noqa: BLE001 - paramiko/socket errors: reported, not raised
        return HostCheck(label, False, f"{type(exc).__name__}: {exc}; fix: the URI's user, port and keyfile "
                         "must log in without a password, with the host key known or no_verify=1")
    return HostCheck(label, True, "logs in (guests' SSH is tunnelled through it)")


def host_checks() -> list[HostCheck]:
    return [check_libvirt_python(), check_libvirtd(), check_qemu_user()]


def lab_checks(lab: Lab) -> list[HostCheck]:
    """One libvirtd check per host of a lab, and an SSH login check per remote host."""
    hosts = {h.name: h.uri for h in place_guests(lab, libvirt_uri()).values()}
    checks = []
    for name, uri in hosts.items():
        checks.append(check_libvirtd(uri, name))
        checks.append(check_qemu_user(uri, name))
        if "+ssh" in uri.split(":", 1)[0]:
            checks.append(check_ssh_hop(name, uri))
    return checks


def free_mib(host: HostPlace) -> int:
    """What ``host`` has free for new guests: libvirt's free, buffers and cached memory (MiB).

    :raise HostError: when the host cannot be reached.
    """
    with connection(host.uri, host.name) as conn:
        try:
            stats = conn.getMemoryStats(binding().VIR_NODE_MEMORY_STATS_ALL_CELLS, 0)
        except binding().libvirtError as exc:
            raise HostError(f"cannot read the free memory of {where(host.uri, host.name)}: {exc}") from exc
    return int(sum(stats.get(k, 0) for k in ("free", "buffers", "cached")) // KIB)
