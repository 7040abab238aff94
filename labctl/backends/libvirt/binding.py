"""The libvirt Python binding, imported on first use (the qemu backend never needs it)."""

from __future__ import annotations

from typing import Any

from labctl.errors import HostError

SETUP_HINT = "run scripts/libvirt-setup.sh as root (installs libvirt, starts libvirtd, installs libvirt-python)"


def binding() -> Any:
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
