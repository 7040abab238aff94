"""The JSON of classes and lab instances, and their live events (server-sent), each route declaring
what it needs (:mod:`.authz`)::

    GET  /api/index                       the owner's labs and classes
    GET  /api/class/LAB                   the class view            (class.view)
    POST /api/class/LAB/allow-reset       {"allow": true|false}     (class.manage)
    GET  /api/lab/IDENT                   the instance view         (lab.view)
    GET  /api/lab/IDENT/topology.svg                                (lab.view)
    POST /api/lab/IDENT/checks            run its checks now        (lab.check)
    POST /api/lab/IDENT/reset/GUEST       reset one guest           (lab.reset)
    GET  /api/events?class=LAB|lab=IDENT  the view each time it changes; the token is authorized
                                          again before each event (a revoked one ends the stream)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from labctl.errors import LabctlError
from labctl.state import LabState, run_dir
from labctl.training import ClassRecord
from labctl.web.access import resolve
from labctl.web.authz import (
    CLASS_MANAGE,
    CLASS_VIEW,
    INDEX,
    LAB_CHECK,
    LAB_RESET,
    LAB_TOOLS,
    LAB_VIEW,
    Guarded,
    refuse,
    requires,
)
from labctl.web.http import event_stream, not_found, token_of
from labctl.web.room import ClassView, LabView, handout_text, topology_svg
from labctl.web.serverstate import OwnerView, ServeState, class_of

EVENT_PERIOD = 1.0
KEEPALIVE = 15.0


class LabApi(Guarded):
    """The JSON and events routes (see the module docstring)."""

    def __init__(self, serve: ServeState) -> None:
        self.serve, self.policy = serve, serve.policy

    @requires(INDEX)
    async def api_index(self, request: Request) -> Response:
        labs = await asyncio.to_thread(self.serve.room.labs)
        classes = await asyncio.to_thread(self.serve.room.classes)
        return JSONResponse({"labs": labs, "classes": classes})

    @requires(CLASS_VIEW, "lab")
    async def api_class(self, request: Request) -> Response:
        lab = request.path_params["lab"]
        try:
            return JSONResponse(await self.serve.view(f"class:{lab}", lambda: self.serve.room.class_view(lab)))
        except LabctlError as exc:
            return not_found(exc.message)

    @requires(CLASS_MANAGE, "lab", post=True)
    async def api_allow_reset(self, request: Request) -> Response:
        lab = request.path_params["lab"]
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, status_code=400)
        allow = body.get("allow") if isinstance(body, dict) else None
        if not isinstance(allow, bool):
            return JSONResponse({"error": "say {\"allow\": true} or {\"allow\": false}"}, status_code=400)
        self.serve.room.allow_reset[lab] = allow
        self.serve.forget()
        return JSONResponse({"class": lab, "allow_reset": allow})

    @requires(LAB_VIEW, "ident")
    async def api_lab(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        who = self.policy.who(request)
        serve = self.serve
        if self.policy.authorize(who, LAB_TOOLS, ident) is None:  # the view with the engineer's tools
            view = dict(await serve.view(f"owner:{ident}", lambda: serve.owner_view(ident)))
        else:
            view = dict(await serve.view(f"lab:{ident}", lambda: serve.lab_view(ident)))
        klass = class_of(ident)
        if klass:
            record = await asyncio.to_thread(ClassRecord.load, klass)
            view["handout"], view["handout_note"] = await asyncio.to_thread(handout_text, record,
                                                                            ident.partition("@")[2])
        view["class"] = klass
        return JSONResponse(view)

    @requires(LAB_VIEW, "ident")
    async def api_topology(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        try:
            svg = await self.serve.view(f"svg:{ident}", lambda: topology_svg(ident))
        except LabctlError as exc:
            return not_found(exc.message)
        return Response(svg, media_type="image/svg+xml")

    @requires(LAB_CHECK, "ident", post=True)
    async def api_checks(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        if not run_dir(ident).is_dir():
            return not_found(f"lab {ident} is not up")
        await asyncio.to_thread(self.serve.room.run_checks, ident, class_of(ident))
        self.serve.forget()
        return JSONResponse(self.serve.room.checks_view(ident))

    @requires(LAB_RESET, "ident", post=True)
    async def api_reset(self, request: Request) -> Response:
        ident, guest = request.path_params["ident"], request.path_params["guest"]
        try:
            state = await asyncio.to_thread(LabState.load, ident)
        except LabctlError as exc:
            return not_found(exc.message)
        if guest not in state.guests:
            return not_found(f"lab {ident} has no guest {guest!r}")
        self.serve.forget()
        try:
            async with self.serve.terminals.resetting(ident, guest, 4001, "the guest is being reset"):
                took = await asyncio.to_thread(self.serve.room.reset, ident, guest)
        except LabctlError as exc:
            return JSONResponse({"error": exc.message}, status_code=409)
        finally:
            self.serve.forget()
        return JSONResponse({"lab": ident, "guest": guest, "seconds": took.get(guest)})

    async def events(self, request: Request) -> Response:
        """The view of ``?class=LAB`` (class.view) or ``?lab=IDENT`` (lab.view) each time it changes."""
        token = token_of(request)
        klass, ident = request.query_params.get("class"), request.query_params.get("lab")
        action, instance = (CLASS_VIEW, klass) if klass is not None else (LAB_VIEW, ident or "")
        why = self.policy.authorize(resolve(token), action, instance)
        if why is not None:
            refused = await refuse(request, why)
            assert refused is not None
            return refused
        serve = self.serve
        fn: Callable[[], ClassView | OwnerView | LabView]
        if klass is not None:
            key, fn = f"class:{klass}", lambda: serve.room.class_view(klass)
        elif self.policy.authorize(resolve(token), LAB_TOOLS, instance) is None:  # the owner: the tools too
            key, fn = f"owner:{instance}", lambda: serve.owner_view(instance)
        else:
            key, fn = f"lab:{instance}", lambda: serve.lab_view(instance)

        last = ""

        async def poll() -> str | None:
            nonlocal last
            try:
                data = json.dumps(await serve.view(key, fn), sort_keys=True)
            except LabctlError as exc:
                data = json.dumps({"error": exc.message})
            if data == last:
                return None
            last = data
            return data

        return event_stream(request, lambda: self.policy.authorize(resolve(token), action, instance) is not None,
                            poll, EVENT_PERIOD, KEEPALIVE)
