"""The engineer's tools on a lab page, the owner's token only (``lab.tools``, :mod:`.authz`; a class's
tokens get 403)::

    GET  /api/lab/IDENT/console/GUEST     server-sent events: the console's tail, then what it adds
    POST /api/lab/IDENT/captures          {"guest": G, "nic": N}: start capturing that NIC
    POST /api/lab/IDENT/captures/ID/stop  stop it; saved as pcapng in the lab's run directory
    GET  /api/lab/IDENT/captures/ID.pcapng  the saved capture, as an attachment
    POST /api/lab/IDENT/impair            {"guest": G, "nic": N, "impair": {"delay": "20ms"}|null}
    POST /api/lab/IDENT/link              {"guest": G, "nic": N, "up": true|false}

What each does is :mod:`.tools`'; here are the routes and their answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from labctl.errors import LabctlError, LabStateError, UsageError
from labctl.state import LabState
from labctl.web.access import resolve
from labctl.web.authz import LAB_TOOLS, Guarded, requires
from labctl.web.http import event_stream, not_found, token_of
from labctl.web.serverstate import ServeState
from labctl.web.tools import ConsoleTail

CONSOLE_PERIOD = 0.5
KEEPALIVE = 15.0
DOWNLOAD_CHUNK = 256 * 1024


def failed(exc: LabctlError) -> JSONResponse:
    status = 400 if isinstance(exc, UsageError) else 404 if isinstance(exc, LabStateError) else 409
    return JSONResponse({"error": exc.message}, status_code=status)


async def json_object(request: Request) -> dict[str, object] | None:
    """The request's body when it is a JSON object (the user's: every value is checked where it is used)."""
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class ToolApi(Guarded):
    """The routes of the engineer's tools (see the module docstring)."""

    def __init__(self, serve: ServeState) -> None:
        self.serve, self.policy = serve, serve.policy

    async def _act(self, fn: Callable[[], Any]) -> Any:
        try:
            return await asyncio.to_thread(fn)
        finally:
            self.serve.forget()

    @requires(LAB_TOOLS, "ident")
    async def api_console(self, request: Request) -> Response:
        ident, guest = request.path_params["ident"], request.path_params["guest"]
        token = token_of(request)
        try:
            state = await asyncio.to_thread(LabState.load, ident)
        except LabctlError as exc:
            return failed(exc)
        rec = state.guests.get(guest)
        if rec is None:
            return not_found(f"lab {ident} has no guest {guest!r}")
        tail = ConsoleTail(Path(rec.console))

        failed_read = ""

        async def poll() -> str | None:
            nonlocal failed_read
            try:
                restarted, text = await asyncio.to_thread(tail.read)
                failed_read = ""
            except OSError as exc:
                if failed_read:
                    return None
                failed_read = f"cannot read the console: {exc.strerror or exc}"
                return json.dumps({"error": failed_read})
            return json.dumps({"restart": restarted, "text": text}) if text or restarted else None

        return event_stream(request, lambda: self.policy.authorize(resolve(token), LAB_TOOLS, ident) is not None,
                            poll, CONSOLE_PERIOD, KEEPALIVE)

    async def _post(self, request: Request, act: Callable[[str, dict[str, object]], Any],
                    answer: Callable[[Any, dict[str, object]], Any]) -> Response:
        """An action on the lab: ``act(ident, body)`` in a thread, then ``answer(result, body)`` as JSON;
        a body that is not a JSON object is 400."""
        ident = request.path_params["ident"]
        body = await json_object(request)
        if body is None:
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
        try:
            result = await self._act(lambda: act(ident, body))
        except LabctlError as exc:
            return failed(exc)
        return JSONResponse(answer(result, body))

    @requires(LAB_TOOLS, "ident", post=True)
    async def api_capture_start(self, request: Request) -> Response:
        tools = self.serve.tools
        return await self._post(request, lambda ident, b: tools.start_capture(ident, b.get("guest"), b.get("nic")),
                                lambda result, _b: result)

    @requires(LAB_TOOLS, "ident", post=True)
    async def api_capture_stop(self, request: Request) -> Response:
        ident, cid = request.path_params["ident"], request.path_params["cid"]
        try:
            return JSONResponse(await self._act(lambda: self.serve.tools.stop_capture(ident, cid)))
        except LabctlError as exc:
            return failed(exc)
        except OSError as exc:
            return JSONResponse({"error": f"cannot save the capture: {exc.strerror or exc}"}, status_code=500)

    @requires(LAB_TOOLS, "ident")
    async def api_capture_file(self, request: Request) -> Response:
        ident, cid = request.path_params["ident"], request.path_params["cid"]
        try:
            path, meta = await asyncio.to_thread(self.serve.tools.capture_file, ident, cid)
            fd = await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except LabctlError as exc:
            return not_found(exc.message)
        except OSError as exc:
            return not_found(f"cannot read the capture: {exc.strerror or exc}")
        f = os.fdopen(fd, "rb")
        size = os.fstat(fd).st_size
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(float(meta.get("started", 0))))
        name = re.sub(r"[^A-Za-z0-9@._-]", "_", f"{ident}-{meta.get('label', 'capture')}-{stamp}.pcapng")

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while data := await asyncio.to_thread(f.read, DOWNLOAD_CHUNK):
                    yield data
            finally:
                f.close()

        return StreamingResponse(chunks(), media_type="application/x-pcapng",
                                 headers={"content-disposition": f'attachment; filename="{name}"',
                                          "content-length": str(size)})

    @requires(LAB_TOOLS, "ident", post=True)
    async def api_impair(self, request: Request) -> Response:
        tools = self.serve.tools
        return await self._post(
            request, lambda ident, b: tools.impair(ident, b.get("guest"), b.get("nic"), b.get("impair")),
            lambda imp, _b: {"impair": imp.to_dict() if imp else {}, "text": imp.describe() if imp else "none"})

    @requires(LAB_TOOLS, "ident", post=True)
    async def api_link(self, request: Request) -> Response:
        tools = self.serve.tools
        return await self._post(request, lambda ident, b: tools.link(ident, b.get("guest"), b.get("nic"), b.get("up")),
                                lambda _result, b: {"link": "up" if b.get("up") else "down"})
