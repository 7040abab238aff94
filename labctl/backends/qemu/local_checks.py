"""What the qemu backend needs on this machine (``labctl doctor``): QEMU and qemu-img, whether KVM is
usable (the real probe boot of the image's default kernel, :mod:`labctl.backends.accel`), and the
default image built. What they read (the image store, the kernels) is loaded when a check runs:
the backend's module imports this one, and ``down`` or ``exec`` runs none of them."""

from __future__ import annotations

import os
import shutil

from labctl.backends.base import HostCheck
from labctl.errors import LabctlError


def check_binary(name: str) -> HostCheck:
    path = shutil.which(name)
    return HostCheck(name, path is not None, path or "missing: run setup.sh")


def check_kvm() -> HostCheck:
    """KVM is optional: without a usable one guests run under TCG. Decided by the real probe boot."""
    from labctl.backends.accel import kvm_usable
    from labctl.image import ImageStore, load_recipe
    from labctl.kernel import default_kernel
    from labctl.lab import DEFAULT_IMAGE

    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return HostCheck("KVM", True, "no usable /dev/kvm: guests run under TCG (slower)")
    img = ImageStore().get(DEFAULT_IMAGE, load_recipe(DEFAULT_IMAGE).key())
    if img is None:
        return HostCheck("KVM", True, "/dev/kvm is accessible; build the image to probe it (labctl image build)")
    try:
        kernel = default_kernel(img, load_recipe(DEFAULT_IMAGE))
    except LabctlError as exc:
        return HostCheck("KVM", True, f"/dev/kvm is accessible; the image's kernel is not ready to probe it "
                                      f"({exc.message})")
    usable, reason = kvm_usable(kernel.boot)
    return HostCheck("KVM", True, f"usable: {reason}" if usable else f"not usable ({reason}): guests run under TCG")


def check_image() -> HostCheck:
    from labctl.image import ImageStore, load_recipe
    from labctl.lab import DEFAULT_IMAGE

    key = load_recipe(DEFAULT_IMAGE).key()
    img = ImageStore().get(DEFAULT_IMAGE, key)
    if img is None:
        return HostCheck(f"image {DEFAULT_IMAGE}", False, "not built (or its recipe changed): run labctl image build")
    return HostCheck(f"image {DEFAULT_IMAGE}", True, f"{key} in {img.dir}")


def host_checks() -> list[HostCheck]:
    return [check_binary("qemu-system-x86_64"), check_binary("qemu-img"), check_kvm(), check_image()]
