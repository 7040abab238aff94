"""Lab files, the pipeline's first stage: a YAML file with line numbers
(:mod:`.yamlpos`, :mod:`.load`) checked section by section (:mod:`.checker`,
:mod:`.validate`, :mod:`.addresses`, :mod:`.steps`, :mod:`.uri`) into the
resolved model (:mod:`.model`, :mod:`.nics`), and where each guest runs
(:mod:`.hosts`).

Owns every rule of the lab file and every problem's line. Pure: reads the
file and nothing else, starts nothing; must not import any other stage.

Imports never: labctl.image, labctl.kernel, labctl.up, labctl.backends, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.net, labctl.trace, labctl.debug, labctl.pipeline, labctl.state, labctl.live, labctl.training

Typical use::

    from labctl.lab import load_lab
    lab = load_lab("labs/quickstart.yaml")   # raises LabFileError with every problem, by line
    for guest in lab.guests.values():
        for nic in guest.nics: ...
"""

from labctl.lab.addresses import default_mac
from labctl.lab.load import load_lab, load_lab_text
from labctl.lab.model import MGMT_NIC, MGMT_SUBNET, Guest, Lab, Network, Nic
from labctl.lab.nics import NIC_ALIASES, NIC_MODELS, NicModel, canonical_nic_model, get_nic_model

__all__ = [
    "MGMT_NIC",
    "MGMT_SUBNET",
    "NIC_ALIASES",
    "NIC_MODELS",
    "Guest",
    "Lab",
    "Network",
    "Nic",
    "NicModel",
    "canonical_nic_model",
    "default_mac",
    "get_nic_model",
    "load_lab",
    "load_lab_text",
]
