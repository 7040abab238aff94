"""The guest kernel: which kernel a guest boots, preparing it, checking it.

A lab runs on the image's Debian kernel, another Debian ABI or flavour, or
a kernel the user built. Owns everything labctl knows about that kernel:

* :mod:`.prepare` -- a kernel prepared once, keyed by its content: boot
  file, modules disk, its share of the initramfs, debug info, config
  (:mod:`.vmlinux`, :mod:`.modules`; the cpio writer is the image's, :mod:`labctl.image.cpio`);
  out-of-tree modules built against a tree (:mod:`.modbuild`);
* :mod:`.cached` -- prepared kernels in the cache;
* :mod:`.kconfig` -- reading a kernel's configuration;
* :mod:`.offsets` -- struct member offsets from its debug info, for probes (drgn, cached);
* :mod:`.requirements` -- what a lab needs from it: preflight before any
  QEMU starts, and the config fragment a kernel developer merges;
* :mod:`.guest_kernels` -- the kernels of one lab (which one each guest boots), end to end.

Must not import the ``up`` stage, backends, steps, bundles, reports or the CLI.

Imports never: labctl.up, labctl.backends, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.state, labctl.live, labctl.training
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.kernel.cached import Kernel, KernelStore, kernels_root
    from labctl.kernel.guest_kernels import all_prepared, default_kernel
    from labctl.kernel.guest_kernels import check as check_guest_kernels
    from labctl.kernel.guest_kernels import options as kernel_options
    from labctl.kernel.guest_kernels import preflight as preflight_kernels
    from labctl.kernel.guest_kernels import prepare as prepare_guest_kernels
    from labctl.kernel.guest_kernels import refuse as refuse_kernels
    from labctl.kernel.guest_kernels import specs as kernel_specs
    from labctl.kernel.guest_kernels import warning_lines as kernel_warning_lines
    from labctl.kernel.offsets import enum_names, struct_offsets
    from labctl.kernel.prepare import add_source, content_key, debian_packages, debian_version
    from labctl.kernel.prepare import initrd as kernel_initrd
    from labctl.kernel.prepare import prepare as prepare_kernel
    from labctl.kernel.requirements import config_fragment
else:  # each name loaded at its first use (labctl.lazyface)
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())


__all__ = [
    "Kernel", "KernelStore", "add_source", "all_prepared", "check_guest_kernels", "config_fragment", "content_key",
    "debian_packages", "debian_version", "default_kernel", "enum_names", "kernel_initrd", "kernel_options",
    "kernel_specs", "kernel_warning_lines", "kernels_root", "preflight_kernels", "prepare_guest_kernels",
    "prepare_kernel", "refuse_kernels", "struct_offsets",
]
