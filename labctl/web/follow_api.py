"""The routes of following packets from a page (``lab.follow``, :mod:`.authz`; what they do is
:mod:`.follows`')::

    GET  /api/lab/IDENT/packets           {"running", "ready": its probes are on, "filter", "error",
                                           "packets": the last ones, newest last}
    POST /api/lab/IDENT/follow            {"filter": "icmp"}: follow that on every guest of the instance
    POST /api/lab/IDENT/follow/stop
    POST /api/class/LAB/allow-follow      {"allow": true|false}: the class's students may follow (class.manage)
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from labctl.errors import LabctlError
from labctl.web.authz import CLASS_MANAGE, LAB_FOLLOW, Guarded, requires
from labctl.web.serverstate import ServeState
from labctl.web.tool_api import failed, json_object


class FollowApi(Guarded):
    """See the module docstring."""

    def __init__(self, serve: ServeState) -> None:
        self.serve, self.policy = serve, serve.policy

    @requires(LAB_FOLLOW, "ident")
    async def api_packets(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        return JSONResponse(await asyncio.to_thread(self.serve.follows.view, ident))

    @requires(LAB_FOLLOW, "ident", post=True)
    async def api_follow_start(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        body = await json_object(request)
        if body is None:
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
        try:
            return JSONResponse(await asyncio.to_thread(self.serve.follows.start, ident, body.get("filter", "")))
        except LabctlError as exc:
            return failed(exc)

    @requires(LAB_FOLLOW, "ident", post=True)
    async def api_follow_stop(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        try:
            return JSONResponse(await asyncio.to_thread(self.serve.follows.stop, ident))
        except LabctlError as exc:
            return failed(exc)

    @requires(CLASS_MANAGE, "lab", post=True)
    async def api_allow_follow(self, request: Request) -> Response:
        lab = request.path_params["lab"]
        body = await json_object(request)
        allow = body.get("allow") if body is not None else None
        if not isinstance(allow, bool):
            return JSONResponse({"error": "say {\"allow\": true} or {\"allow\": false}"}, status_code=400)
        self.serve.room.allow_follow[lab] = allow
        self.serve.forget()
        return JSONResponse({"class": lab, "allow_follow": allow})
