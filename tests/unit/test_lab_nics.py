"""Tests for labctl.lab.nics: the NIC model registry."""

from __future__ import annotations

import dataclasses

import pytest

from labctl.lab.nics import (
    NIC_MODELS,
    NicModel,
    canonical_nic_model,
    get_nic_model,
    suggest_nic_model,
)


def test_registry_contents() -> None:
    assert NIC_MODELS["rtl8139"] == NicModel("rtl8139", "rtl8139", ("8139cp", "8139too"), False)
    assert NIC_MODELS["virtio-net-pci"].drivers == ("virtio_net",)
    assert NIC_MODELS["virtio-net-pci"].multiqueue
    expected = {
        "e1000": ("e1000",), "e1000e": ("e1000e",), "i82559er": ("e100",),
        "pcnet": ("pcnet32",), "ne2k_pci": ("ne2k-pci",), "vmxnet3": ("vmxnet3",),
    }
    for name, drivers in expected.items():
        assert NIC_MODELS[name].drivers == drivers
        assert not NIC_MODELS[name].multiqueue
    assert all(name == model.name for name, model in NIC_MODELS.items())


def test_models_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        NIC_MODELS["e1000"].multiqueue = True  # type: ignore[misc]


def test_alias_resolves_to_canonical_name() -> None:
    assert canonical_nic_model("virtio") == "virtio-net-pci"
    assert canonical_nic_model("e1000") == "e1000"
    assert canonical_nic_model("tulip") is None
    assert get_nic_model("virtio") is NIC_MODELS["virtio-net-pci"]
    with pytest.raises(KeyError):
        get_nic_model("tulip")


def test_suggestions() -> None:
    assert suggest_nic_model("rtl8193") == "rtl8139"
    assert suggest_nic_model("e1000f") in ("e1000", "e1000e")
    assert suggest_nic_model("tulip") is None
