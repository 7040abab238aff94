"""A guest's terminal in the page: ``WS /ws/term/IDENT/GUEST?mode=rw|ro`` (``lab.view``, from the
page's own origin, :mod:`.authz`), binary frames both ways, text frames from the page for its size
(``{"resize": [cols, rows]}``); the SSH channel behind it is :mod:`.terminal`'s, shared by every
page of that guest. A token revoked meanwhile loses its terminals (:meth:`labctl.web.app.Server.watch`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from labctl.errors import LabctlError
from labctl.state import LabState
from labctl.web.authz import LAB_VIEW, Guarded, requires
from labctl.web.http import token_of
from labctl.web.serverstate import ServeState
from labctl.web.terminal import clamp_size

MAX_INPUT = 64 * 1024


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class TerminalRoute(Guarded):
    """The terminal websocket (see the module docstring)."""

    def __init__(self, serve: ServeState) -> None:
        self.serve, self.policy = serve, serve.policy

    @requires(LAB_VIEW, "ident", post=True)
    async def terminal(self, ws: WebSocket) -> None:
        ident, guest = ws.path_params["ident"], ws.path_params["guest"]
        token = token_of(ws)
        assert token is not None  # authorized: a principal's token
        writable = ws.query_params.get("mode", "rw") != "ro"
        size = clamp_size(_int(ws.query_params.get("cols")), _int(ws.query_params.get("rows"))) or (80, 24)
        try:
            state = await asyncio.to_thread(LabState.load, ident)
            ep = state.endpoint(guest)
        except LabctlError:
            await ws.close(code=4404)
            return
        await ws.accept()
        try:
            hub = await self.serve.terminals.attach(ident, guest, ep, *size)
        except LabctlError as exc:
            await ws.send_text(json.dumps({"error": exc.message}))
            await ws.close(code=4502)
            return
        sub = hub.subscribe(writable, token)
        await ws.send_text(json.dumps({"mode": "rw" if writable else "ro"}))

        async def pump_out() -> None:
            while True:
                data = await sub.queue.get()
                if data is None:
                    with contextlib.suppress(Exception):
                        await ws.close(code=sub.close_code, reason=sub.close_reason)
                    return
                await ws.send_bytes(data)

        out_task = asyncio.create_task(pump_out())
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect" or out_task.done():
                    break
                if msg.get("bytes") is not None:
                    data = msg["bytes"][:MAX_INPUT]
                    if hub.write(sub, data) and (b"\r" in data or b"\n" in data):
                        self.serve.room.typed(ident)
                elif msg.get("text") is not None:
                    self._control(hub, sub, msg["text"])
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            hub.unsubscribe(sub)
            out_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await out_task

    @staticmethod
    def _control(hub: Any, sub: Any, text: str) -> None:
        try:
            msg = json.loads(text)
        except ValueError:
            return
        if isinstance(msg, dict) and isinstance(msg.get("resize"), list) and len(msg["resize"]) == 2:
            size = clamp_size(*msg["resize"])
            if size:
                hub.resize(sub, *size)
