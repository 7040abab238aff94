"""The guest kernel: what it is, preparing it, checking it.

A lab runs on the image's Debian kernel or on a kernel the user built. This
package owns everything labctl knows about that kernel. Its parts:

* :mod:`labctl.kernel.kconfig` -- reading a kernel's configuration (a
  ``.config`` or the one embedded with ``CONFIG_IKCONFIG``), deciding before
  any QEMU starts whether a lab can run on it (:func:`preflight`), and the
  config fragment a kernel developer merges so that the lab works
  (:func:`config_fragment`).
"""

from labctl.kernel.kconfig import (
    KConfig,
    Preflight,
    Requirement,
    config_fragment,
    extract_ikconfig,
    lab_requirements,
    parse_config,
    preflight,
)

__all__ = [
    "KConfig",
    "Preflight",
    "Requirement",
    "config_fragment",
    "extract_ikconfig",
    "lab_requirements",
    "parse_config",
    "preflight",
]
