"""What the routes of ``labctl serve`` share: the room (the live views), the terminals, the engineer's
tools, a short cache of views, and the access policy (:mod:`.authz`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from labctl.errors import LabctlError
from labctl.training import ClassRecord
from labctl.web.authz import Policy
from labctl.web.follows import Follows
from labctl.web.room import LabView, Room
from labctl.web.terminal import Terminals
from labctl.web.tools import Tools, ToolsView

VIEW_TTL = 0.8


class OwnerView(LabView):
    """The lab view with the engineer's tools."""

    tools: ToolsView


def class_of(ident: str) -> str:
    """The class lab ``ident`` is a student's instance of, or ''."""
    base, _, student = ident.partition("@")
    if not student:
        return ""
    try:
        record = ClassRecord.load(base)
    except LabctlError:
        return ""
    return base if student in record.students else ""


class ServeState:
    """The room, the terminals, the tools, the view cache and the policy, for every route."""

    def __init__(self) -> None:
        self.room = Room()
        self.terminals = Terminals()
        self.tools = Tools()
        self.follows = Follows()
        self.cache: dict[str, tuple[float, Any]] = {}
        self.policy = Policy(self.room.allow_reset, self.room.allow_follow)

    def forget(self) -> None:
        """After an action: every view is looked at afresh."""
        self.cache.clear()
        self.room.forget_views()

    async def view(self, key: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` in a worker thread, shared by the requests of the next ``VIEW_TTL`` seconds."""
        hit = self.cache.get(key)
        if hit and time.monotonic() - hit[0] < VIEW_TTL:
            return hit[1]
        value = await asyncio.to_thread(fn)
        self.cache[key] = (time.monotonic(), value)
        return value

    def lab_view(self, ident: str) -> LabView:
        return self.room.lab_view(ident, class_of(ident))

    def owner_view(self, ident: str) -> OwnerView:
        """The lab view with the engineer's tools: NICs (link, impairment, capture), saved captures."""
        return {**self.lab_view(ident), "tools": self.tools.view(ident)}
