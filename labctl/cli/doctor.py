"""``labctl doctor``: check the host for what each backend needs, start nothing."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from labctl.backends.libvirt.host import QemuUser
from labctl.cli.ui import out, print_json
from labctl.lab.model import DEFAULT_IMAGE

MIN_LIBVIRT = (9, 0, 0)  # fw_cfg sysinfo (6.5), <cpu mode='maximum'> (7.1); tested on 9.0


@dataclass
class Check:
    """One host check: its name, whether it passed, and what was found (or what to do).

    ``warn``: it works, but less safely than it could (shown, exit status unchanged).
    """

    name: str
    ok: bool
    detail: str
    warn: bool = False


def _binary(name: str) -> Callable[[], Check]:
    def check() -> Check:
        path = shutil.which(name)
        return Check(name, path is not None, path or "missing: run setup.sh")
    return check


def check_kvm() -> Check:
    """KVM is optional: without a usable one guests run under TCG. Decided by the real probe boot."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Check("KVM", True, "no usable /dev/kvm: guests run under TCG (slower)")
    from labctl.image.recipe import load_recipe
    from labctl.image.store import ImageStore
    from labctl.up.accel import kvm_usable

    img = ImageStore().get(DEFAULT_IMAGE, load_recipe(DEFAULT_IMAGE).key())
    if img is None:
        return Check("KVM", True, "/dev/kvm is accessible; build the image to probe it (labctl image build)")
    from labctl.errors import LabctlError
    from labctl.kernel.lab import default_kernel

    try:
        kernel = default_kernel(img, load_recipe(DEFAULT_IMAGE))
    except LabctlError as exc:
        return Check("KVM", True, f"/dev/kvm is accessible; the image's kernel is not ready to probe it ({exc.message})")
    usable, reason = kvm_usable(kernel.boot)
    return Check("KVM", True, f"usable: {reason}" if usable else f"not usable ({reason}): guests run under TCG")


def check_image() -> Check:
    from labctl.image.recipe import load_recipe
    from labctl.image.store import ImageStore

    key = load_recipe(DEFAULT_IMAGE).key()
    img = ImageStore().get(DEFAULT_IMAGE, key)
    if img is None:
        return Check("image debian-12", False, "not built (or its recipe changed): run labctl image build")
    return Check("image debian-12", True, f"{key} in {img.dir}")


def check_libvirt_python() -> Check:
    try:
        import libvirt
    except ImportError:
        return Check("libvirt-python", False, "missing: run scripts/libvirt-setup.sh")
    v = libvirt.getVersion()
    return Check("libvirt-python", True, f"imports (libvirt library {v // 1000000}.{v // 1000 % 1000}.{v % 1000})")


def check_libvirtd(uri: str | None = None, host: str | None = None) -> Check:
    """libvirtd answers on the URI, with a new enough libvirt."""
    from labctl.backends.libvirt.api import connection, libvirt_uri
    from labctl.errors import LabctlError

    uri = uri or libvirt_uri()
    label = f"host {host}: libvirtd ({uri})" if host else f"libvirtd ({uri})"
    try:
        with connection(uri, host) as conn:
            v = conn.getLibVersion()
            model = conn.getSecurityModel()[0] or "none"
    except LabctlError as exc:
        return Check(label, False, f"{exc.message}; fix: {exc.hint}" if exc.hint else exc.message)
    version = (v // 1000000, v // 1000 % 1000, v % 1000)
    text = ".".join(map(str, version))
    if version < MIN_LIBVIRT:
        return Check(label, False, f"libvirt {text} is older than 9.0; fix: upgrade libvirt on that host")
    return Check(label, True, f"libvirt {text}, security driver {model}")


def kvm_access(user: QemuUser, path: str = "/dev/kvm") -> bool | None:
    """Whether ``user`` may open ``path`` read-write on this machine (None: no such device)."""
    import pwd
    import stat

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


def check_qemu_user(uri: str | None = None, host: str | None = None) -> Check:
    """Whom libvirt runs QEMU as on the host: its unprivileged user, or root (a warning)."""
    from labctl.backends.libvirt.api import ROOT_FIX, ROOT_WHY, connection, host_facts, libvirt_uri
    from labctl.errors import LabctlError
    from labctl.lab.uri import parse_uri

    uri = uri or libvirt_uri()
    label = f"host {host}: QEMU's user" if host else f"QEMU's user ({uri})"
    try:
        with connection(uri, host) as conn:
            user = host_facts(conn, uri).user
    except LabctlError as exc:
        return Check(label, False, f"{exc.message}; fix: {exc.hint}" if exc.hint else exc.message)
    local = not parse_uri(uri).remote
    who = user.describe(local)
    if user.is_root:
        return Check(label, True, f"root ({who}): weaker, because {ROOT_WHY}; fix: {ROOT_FIX}", warn=True)
    detail = f"{who}, not root: guests' files and sockets are made for it, mode 0600/0700"
    if local and kvm_access(user) is False:
        detail += ("; it cannot open /dev/kvm, so libvirt guests run under TCG (scripts/libvirt-setup.sh "
                   "gives group kvm read-write on it, as udev does)")
    return Check(label, True, detail)


def check_ssh_hop(host: str, uri: str) -> Check:
    """labctl itself logs in to a remote host (guests' SSH goes through it), with the URI's account."""
    from labctl.lab.uri import parse_uri
    from labctl.ssh import jump_client

    hop = parse_uri(uri).ssh_hop()
    assert hop is not None
    label = f"host {host}: ssh {hop.user}@{hop.host}:{hop.port}"
    try:
        jump_client(hop, timeout=15).close()
    except Exception as exc:  # noqa: BLE001 - paramiko/socket errors: reported, not raised
        return Check(label, False, f"{type(exc).__name__}: {exc}; fix: the URI's user, port and keyfile "
                     "must log in without a password, with the host key known or no_verify=1")
    return Check(label, True, "logs in (guests' SSH is tunnelled through it)")


def lab_host_checks(path: str) -> list[Check]:
    """One libvirtd check per host of a lab file, and an SSH login check per remote host."""
    from labctl.backends.libvirt.api import libvirt_uri
    from labctl.lab import load_lab
    from labctl.lab.hosts import place_guests

    lab = load_lab(path)
    hosts = {h.name: h.uri for h in place_guests(lab, libvirt_uri()).values()}
    checks = []
    for name, uri in hosts.items():
        checks.append(check_libvirtd(uri, name))
        checks.append(check_qemu_user(uri, name))
        if "+ssh" in uri.split(":", 1)[0]:
            checks.append(check_ssh_hop(name, uri))
    return checks


CHECKS: dict[str, list[Callable[[], Check]]] = {
    "qemu": [_binary("qemu-system-x86_64"), _binary("qemu-img"), check_kvm, check_image],
    "libvirt": [check_libvirt_python, check_libvirtd, check_qemu_user],
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="check the host for what the backends need")
    p.add_argument("lab", nargs="?", metavar="LAB_FILE",
                   help="also check every libvirt host this lab file names (reachable, SSH login)")
    p.add_argument("--backend", choices=sorted(CHECKS), help="check only this backend (default: all)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit status 0 when every check passed (warnings included), 3 (a host problem) otherwise."""
    backends = [args.backend] if args.backend else list(CHECKS)
    results = [(b, c()) for b in backends for c in CHECKS[b]]
    if args.lab:
        results += [("libvirt", c) for c in lab_host_checks(args.lab)]
    if args.json:
        print_json([{"backend": b, "check": c.name, "ok": c.ok, "warning": c.warn, "detail": c.detail}
                    for b, c in results])
    else:
        table = Table("backend", "check", "ok", "detail")
        for b, c in results:
            ok = (Text("no", style="red") if not c.ok else Text("warn", style="yellow") if c.warn
                  else Text("yes", style="green"))
            table.add_row(b, c.name, ok, c.detail)
        out.print(table)
    return 0 if all(c.ok for _, c in results) else 3
