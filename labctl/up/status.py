"""The live status of each guest of a lab that is up: :mod:`labctl.state.gueststatus`'s (``status`` reads
it without this package), re-exported for the class and the web."""

from __future__ import annotations

from labctl.state import GuestStatus as GuestStatus  # noqa: PLC0414
from labctl.state import guest_statuses as guest_statuses  # noqa: PLC0414
