"""``labctl doctor``: check the host for what each backend needs, start nothing."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from rich.table import Table

from labctl.cli.ui import out, print_json

MIN_LIBVIRT = (9, 0, 0)  # fw_cfg sysinfo (6.5), <cpu mode='maximum'> (7.1); tested on 9.0


@dataclass
class Check:
    """One host check: its name, whether it passed, and what was found (or what to do)."""

    name: str
    ok: bool
    detail: str


def _binary(name: str) -> Callable[[], Check]:
    def check() -> Check:
        path = shutil.which(name)
        return Check(name, path is not None, path or "missing: run setup.sh")
    return check


def check_kvm() -> Check:
    """KVM is optional: without a usable one guests run under TCG. Decided by the real probe boot."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Check("KVM", True, "no usable /dev/kvm: guests run under TCG (slower)")
    from labctl.accel import kvm_usable
    from labctl.image.recipe import load_recipe
    from labctl.image.store import ImageStore

    img = ImageStore().get("debian-12", load_recipe("debian-12").key())
    if img is None:
        return Check("KVM", True, "/dev/kvm is accessible; build the image to probe it (labctl image build)")
    usable, reason = kvm_usable(img.kernel)
    return Check("KVM", True, f"usable: {reason}" if usable else f"not usable ({reason}): guests run under TCG")


def check_image() -> Check:
    from labctl.image.recipe import load_recipe
    from labctl.image.store import ImageStore

    key = load_recipe("debian-12").key()
    img = ImageStore().get("debian-12", key)
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


def check_libvirtd() -> Check:
    """libvirtd answers on the URI, with a new enough libvirt."""
    from labctl.backends.libvirt import connection, libvirt_uri
    from labctl.errors import LabctlError

    uri = libvirt_uri()
    try:
        with connection(uri) as conn:
            v = conn.getLibVersion()
            model = conn.getSecurityModel()[0] or "none"
    except LabctlError as exc:
        return Check(f"libvirtd ({uri})", False, exc.message)
    version = (v // 1000000, v // 1000 % 1000, v % 1000)
    text = ".".join(map(str, version))
    if version < MIN_LIBVIRT:
        return Check(f"libvirtd ({uri})", False, f"libvirt {text} is older than 9.0")
    return Check(f"libvirtd ({uri})", True, f"libvirt {text}, security driver {model}")


CHECKS: dict[str, list[Callable[[], Check]]] = {
    "qemu": [_binary("qemu-system-x86_64"), _binary("qemu-img"), check_kvm, check_image],
    "libvirt": [check_libvirt_python, check_libvirtd],
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="check the host for what the backends need")
    p.add_argument("--backend", choices=sorted(CHECKS), help="check only this backend (default: all)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit status 0 when every check passed, 3 (a host problem) otherwise."""
    backends = [args.backend] if args.backend else list(CHECKS)
    results = [(b, c()) for b in backends for c in CHECKS[b]]
    if args.json:
        print_json([{"backend": b, "check": c.name, "ok": c.ok, "detail": c.detail} for b, c in results])
    else:
        table = Table("backend", "check", "ok", "detail")
        for b, c in results:
            table.add_row(b, c.name, "[green]yes[/]" if c.ok else "[red]no[/]", c.detail)
        out.print(table)
    return 0 if all(c.ok for _, c in results) else 3
