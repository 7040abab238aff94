"""The live status of each guest of a lab that is up: :mod:`labctl.state.status`'s (``status`` reads
it without this package), re-exported for the class and the web."""

from __future__ import annotations

from labctl.state.status import GuestStatus as GuestStatus  # noqa: PLC0414
from labctl.state.status import guest_statuses as guest_statuses  # noqa: PLC0414
