"""Backends turn a guest plan into a running machine, behind one small interface
(:class:`~labctl.backends.base.Backend`): ``qemu`` (labctl starts QEMU itself,
:mod:`.qemu`) and ``libvirt`` (transient domains on any libvirt URI, several
hosts, :mod:`.libvirt`).

Owns: the guest plan and record (:mod:`.base`), the QEMU command line and
domain XML (pure functions), QMP (:mod:`.monitor`, the one client), and the
ownership journal of what backends create on hosts (:mod:`.owned`). Must
not import the ``up`` stage, steps, bundles, reports or the CLI.

Imports never: labctl.up, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.state, labctl.live, labctl.training
"""

from __future__ import annotations

from labctl.backends.base import Backend, GuestPlan, GuestRecord
from labctl.errors import UsageError

__all__ = ["Backend", "GuestPlan", "GuestRecord", "get_backend"]

BACKENDS = ("qemu", "libvirt")


def get_backend(name: str) -> Backend:
    """The backend called ``name``.

    :raise UsageError: for an unknown or unavailable backend.
    """
    if name == "qemu":
        from labctl.backends.qemu.qemu_backend import QemuBackend

        return QemuBackend()
    if name == "libvirt":
        from labctl.backends.libvirt.libvirt_backend import LibvirtBackend

        return LibvirtBackend()
    raise UsageError(f"backend '{name}' is not available in this version",
                     hint="use --backend qemu or --backend libvirt")
