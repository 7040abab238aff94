"""Lab files: loading, validation and the resolved lab model.

Typical use::

    from labctl.lab import load_lab
    lab = load_lab("labs/three-nics.yaml")   # raises LabFileError
    for guest in lab.guests.values():
        for nic in guest.nics: ...
"""

from labctl.lab.addresses import default_mac
from labctl.lab.load import load_lab, load_lab_text
from labctl.lab.model import MGMT_NIC, MGMT_SUBNET, Guest, Lab, Network, Nic
from labctl.lab.nics import NIC_ALIASES, NIC_MODELS, NicModel, canonical_nic_model, get_nic_model

__all__ = [
    "Guest",
    "Lab",
    "MGMT_NIC",
    "MGMT_SUBNET",
    "NIC_ALIASES",
    "NIC_MODELS",
    "Network",
    "Nic",
    "NicModel",
    "canonical_nic_model",
    "default_mac",
    "get_nic_model",
    "load_lab",
    "load_lab_text",
]
