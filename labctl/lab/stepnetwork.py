"""The records of a step's network kind (:mod:`labctl.steps.netstep`): the impairments in force and
the links it changed, and one record per NIC it captured. Its lab-file keys are ``impair`` and the
``{link: ..., state: ...}`` entries of ``run`` (:mod:`.netopts`)."""

from __future__ import annotations

from typing import TypedDict


class CaptureRecord(TypedDict, total=False):
    """One NIC captured during the step: its pcapng file and what it holds."""

    guest: str
    nic: str
    file: str | None
    calibrated: bool
    frames: int
    bytes: int
    first_us: int | None
    last_us: int | None
    warnings: list[str]
    nic_frames: int  # what its NIC sent and received over the window (labctl.trace.netfigures.capture_figures)
    missing: int  # frames the NIC counted that the capture lacks
    link_down: bool  # the step took the NIC's link down


class NetworkRecord(TypedDict):
    """Impairments in force during the step, and links it changed (``GUEST.NIC`` -> up/down)."""

    impair: dict[str, dict[str, str | int]]  # GUEST.NIC -> its impairment (labctl.lab.impair.Impairment.to_dict)
    links: dict[str, str]
