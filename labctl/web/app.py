"""The ASGI application of ``labctl serve`` (Starlette): pages, their JSON and live events, terminals.

Pages (each a small HTML shell; ``static/app.js`` builds the content with DOM calls, guest text
always as text, never as markup)::

    /                       where the token leads: the trainer's class, the student's lab, the owner's labs
    /class/LAB              the trainer's page: a row per student, a cell per guest
    /lab/IDENT              a lab instance: handout, topology, terminals, checks, reset

JSON and events::

    GET  /api/class/LAB                   the class view          (trainer, owner)
    POST /api/class/LAB/allow-reset       {"allow": true|false}   (trainer, owner)
    GET  /api/lab/IDENT                   the instance view       (its student, trainer, owner)
    GET  /api/lab/IDENT/topology.svg
    POST /api/lab/IDENT/checks            run its checks now
    POST /api/lab/IDENT/reset/GUEST       reset one guest (a student only when the trainer allows)
    GET  /api/events?class=LAB|lab=IDENT  server-sent events: the view each time it changes

The engineer's tools (the owner's token only; a class's tokens get 403): a guest's console as
server-sent events, captures, impairments and links, under ``/api/lab/IDENT/``; their routes are
listed in :mod:`.tool_api`.

Following packets (the owner, a class's trainer, a student when the trainer allows)::

    GET  /api/lab/IDENT/packets           the last packets followed on the instance, and the follow running
    POST /api/lab/IDENT/follow            {"filter": "icmp"}: follow that on every guest (one at a time)
    POST /api/lab/IDENT/follow/stop
    POST /api/class/LAB/allow-follow      {"allow": true|false}   (trainer, owner)

    WS   /ws/term/IDENT/GUEST?mode=rw|ro  the guest's terminal (binary frames both ways;
                                          text frames from the page: {"resize": [cols, rows]})

A token arrives once in the URL (``?t=...``), is put in an HttpOnly, SameSite=Strict cookie
and the page reloads without it, unless another site opened the link (then the page only
offers it: :func:`labctl.web.http.first_party`); raw clients send ``Authorization: Bearer TOKEN``. Every
request resolves its token again (:func:`labctl.web.access.resolve`), and every route declares
what it needs (:func:`labctl.web.authz.requires`: one ``authorize(principal, action, instance)``):
anything else is 403. Requests that change something, and websockets, must come from the page's
own origin when the browser says where they come from.

The routes are grouped by what they serve: the pages (:mod:`.pages`), the JSON and events of
classes and labs (:mod:`.lab_api`), the engineer's tools (:mod:`.tool_api`), the terminal
(:mod:`.term_route`); what they share is :mod:`.serverstate`. :class:`Server` is the application's
life: the shared state, and the watcher that closes what a revoked token or a lab taken down
leaves open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from labctl.lab import LAB_IDENT
from labctl.state import run_dir
from labctl.web.access import resolve
from labctl.web.authz import LAB_VIEW
from labctl.web.follow_api import FollowApi
from labctl.web.http import ASGIApp, SecurityHeaders
from labctl.web.lab_api import LabApi
from labctl.web.pages import Pages
from labctl.web.serverstate import ServeState, class_of
from labctl.web.term_route import TerminalRoute
from labctl.web.tool_api import ToolApi

log = logging.getLogger(__name__)

WATCH_PERIOD = 1.0

__all__ = ["Server", "build_app", "class_of", "static_dir", "valid_ident"]


def static_dir() -> Path:
    return Path(str(resources.files("labctl.web") / "static"))


class Server(ServeState):
    """The application's state (:class:`~labctl.web.serverstate.ServeState`) and its watcher."""

    def __init__(self) -> None:
        super().__init__()
        self.watcher: asyncio.Task[None] | None = None

    async def watch(self) -> None:
        """Every second: pages whose token was revoked (``class down``) lose their terminals, terminals
        of a lab that went down are closed, idle ones swept."""
        while True:
            await asyncio.sleep(WATCH_PERIOD)
            try:
                await self._watch_once()
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive a bad moment
                log.debug("terminal watcher: %s", exc)

    async def _watch_once(self) -> None:
        hubs = list(self.terminals.hubs.values())
        tokens = {sub.token for hub in hubs for sub in hub.subscribers}
        whos = {t: await asyncio.to_thread(resolve, t) for t in tokens}
        for hub in hubs:
            if hub.closed:
                continue
            if not await asyncio.to_thread(run_dir(hub.ident).is_dir):
                hub.close(4410, "the lab is down")
                continue
            for sub in list(hub.subscribers):
                if self.policy.authorize(whos.get(sub.token), LAB_VIEW, hub.ident) is not None:
                    hub.unsubscribe(sub)
                    sub.end(4403, "access revoked")
        self.terminals.sweep()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.watcher = asyncio.create_task(self.watch())
        try:
            yield
        finally:
            self.watcher.cancel()
            self.terminals.close_all()
            await asyncio.to_thread(self.tools.stop_all)
            await asyncio.to_thread(self.follows.stop_all)


def valid_ident(ident: str) -> bool:
    return bool(LAB_IDENT.fullmatch(ident))


def build_app(server: Server | None = None) -> ASGIApp:
    """The application, wrapped in the security headers."""
    s = server or Server()
    pages, api, tools, term, follow = Pages(s.policy), LabApi(s), ToolApi(s), TerminalRoute(s), FollowApi(s)
    routes = [
        Route("/", pages.index),
        Route("/class/{lab}", pages.class_page),
        Route("/lab/{ident}", pages.lab_page),
        Route("/api/index", api.api_index),
        Route("/api/class/{lab}", api.api_class),
        Route("/api/class/{lab}/allow-reset", api.api_allow_reset, methods=["POST"]),
        Route("/api/class/{lab}/allow-follow", follow.api_allow_follow, methods=["POST"]),
        Route("/api/lab/{ident}", api.api_lab),
        Route("/api/lab/{ident}/topology.svg", api.api_topology),
        Route("/api/lab/{ident}/checks", api.api_checks, methods=["POST"]),
        Route("/api/lab/{ident}/reset/{guest}", api.api_reset, methods=["POST"]),
        Route("/api/lab/{ident}/console/{guest}", tools.api_console),
        Route("/api/lab/{ident}/captures", tools.api_capture_start, methods=["POST"]),
        Route("/api/lab/{ident}/captures/{cid}/stop", tools.api_capture_stop, methods=["POST"]),
        Route("/api/lab/{ident}/captures/{cid}.pcapng", tools.api_capture_file),
        Route("/api/lab/{ident}/impair", tools.api_impair, methods=["POST"]),
        Route("/api/lab/{ident}/link", tools.api_link, methods=["POST"]),
        Route("/api/lab/{ident}/packets", follow.api_packets),
        Route("/api/lab/{ident}/follow", follow.api_follow_start, methods=["POST"]),
        Route("/api/lab/{ident}/follow/stop", follow.api_follow_stop, methods=["POST"]),
        Route("/api/events", api.events),
        WebSocketRoute("/ws/term/{ident}/{guest}", term.terminal),
        Mount("/static", StaticFiles(directory=static_dir()), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=s.lifespan)
    return SecurityHeaders(app)
