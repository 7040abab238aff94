"""Registry of the emulated NIC models a lab may use."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

__all__ = [
    "NIC_ALIASES",
    "NIC_MODELS",
    "NicModel",
    "canonical_nic_model",
    "get_nic_model",
    "suggest_nic_model",
]


@dataclass(frozen=True)
class NicModel:
    """One emulated NIC: QEMU ``-device`` name and the guest drivers for it."""

    name: str
    qemu_device: str
    drivers: tuple[str, ...]
    multiqueue: bool = False
    native_xdp: bool = False  # its driver runs XDP programs itself (else only generic XDP, on the skb)


NIC_MODELS: dict[str, NicModel] = {
    m.name: m
    for m in (
        NicModel("rtl8139", "rtl8139", ("8139cp", "8139too")),
        NicModel("e1000", "e1000", ("e1000",)),
        NicModel("e1000e", "e1000e", ("e1000e",)),
        NicModel("virtio-net-pci", "virtio-net-pci", ("virtio_net",), multiqueue=True, native_xdp=True),
        NicModel("i82559er", "i82559er", ("e100",)),
        NicModel("pcnet", "pcnet", ("pcnet32",)),
        NicModel("ne2k_pci", "ne2k_pci", ("ne2k-pci",)),
        NicModel("vmxnet3", "vmxnet3", ("vmxnet3",)),
    )
}

NIC_ALIASES: dict[str, str] = {"virtio": "virtio-net-pci"}


def canonical_nic_model(name: str) -> str | None:
    """Canonical model name for ``name`` (an alias is resolved), or None if unknown."""
    name = NIC_ALIASES.get(name, name)
    return name if name in NIC_MODELS else None


def get_nic_model(name: str) -> NicModel:
    """The NicModel for ``name`` or an alias of it; raises KeyError if unknown."""
    canonical = canonical_nic_model(name)
    if canonical is None:
        raise KeyError(name)
    return NIC_MODELS[canonical]


def suggest_nic_model(name: str) -> str | None:
    """Closest known model name or alias to a misspelt ``name``, or None."""
    matches = difflib.get_close_matches(name, [*NIC_MODELS, *NIC_ALIASES], n=1)
    return matches[0] if matches else None
