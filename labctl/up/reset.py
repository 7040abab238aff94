"""``labctl reset``: guests of a lab that is up put back to their post-boot state, the others
left running (qemu backend; a guest without a snapshot is booted again)."""

from __future__ import annotations

from collections.abc import Sequence


def reset(lab: str, guests: Sequence[str] | None = None) -> dict[str, float]:
    """Reset ``guests`` (all when None) of the lab ``lab`` (NAME or NAME@INSTANCE); seconds each took.

    :raise LabStateError: when the lab is not up. :raise UsageError: for an unknown guest.
    """
    raise NotImplementedError
