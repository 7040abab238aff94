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

The engineer's tools (the owner's token only; a class's tokens get 403)::

    GET  /api/lab/IDENT/console/GUEST     server-sent events: the console's tail, then what it adds
    POST /api/lab/IDENT/captures          {"guest": G, "nic": N}: start capturing that NIC
    POST /api/lab/IDENT/captures/ID/stop  stop it; saved as pcapng in the lab's run directory
    GET  /api/lab/IDENT/captures/ID.pcapng  the saved capture, as an attachment
    POST /api/lab/IDENT/impair            {"guest": G, "nic": N, "impair": {"delay": "20ms"}|null}
    POST /api/lab/IDENT/link              {"guest": G, "nic": N, "up": true|false}
    WS   /ws/term/IDENT/GUEST?mode=rw|ro  the guest's terminal (binary frames both ways;
                                          text frames from the page: {"resize": [cols, rows]})

A token arrives once in the URL (``?t=...``), is put in an HttpOnly, SameSite=Strict cookie
and the page reloads without it, unless another site opened the link (then the page only
offers it: :func:`labctl.web.http.first_party`); raw clients send ``Authorization: Bearer TOKEN``. Every
request resolves its token again (:func:`labctl.web.access.resolve`) and checks the instance it
names against it: anything else is 403. Requests that change something, and websockets, must
come from the page's own origin when the browser says where they come from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from labctl.errors import LabctlError, LabStateError, UsageError
from labctl.lab import LAB_IDENT
from labctl.state import LabState, run_dir
from labctl.training import ClassRecord
from labctl.web.access import OWNER, STUDENT, TRAINER, Principal, resolve
from labctl.web.http import (
    COOKIE,
    ASGIApp,
    SecurityHeaders,
    first_party,
    forbidden,
    not_found,
    page,
    same_origin,
    sign_in_page,
    token_of,
)
from labctl.web.room import Room, handout_text, topology_svg
from labctl.web.terminal import Terminals, clamp_size
from labctl.web.tools import ConsoleTail, Tools

log = logging.getLogger(__name__)

EVENT_PERIOD = 1.0
KEEPALIVE = 15.0
WATCH_PERIOD = 1.0
VIEW_TTL = 0.8
MAX_INPUT = 64 * 1024
CONSOLE_PERIOD = 0.5
DOWNLOAD_CHUNK = 256 * 1024

def static_dir() -> Path:
    return Path(str(resources.files("labctl.web") / "static"))


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


class Server:
    """The application's state: the room, the terminals, the view cache."""

    def __init__(self) -> None:
        self.room = Room()
        self.terminals = Terminals()
        self.tools = Tools()
        self.cache: dict[str, tuple[float, Any]] = {}
        self.watcher: asyncio.Task[None] | None = None

    # -- who -----------------------------------------------------------------------------------

    def who(self, conn: HTTPConnection) -> Principal | None:
        return resolve(token_of(conn))

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

    def lab_view(self, ident: str) -> dict[str, Any]:
        return self.room.lab_view(ident, class_of(ident))

    def owner_view(self, ident: str) -> dict[str, Any]:
        """The lab view with the engineer's tools: NICs (link, impairment, capture), saved captures."""
        return {**self.lab_view(ident), "tools": self.tools.view(ident)}

    # -- pages ---------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        token = request.query_params.get("t")
        if token is not None:
            who = resolve(token)
            if who is None:
                return PlainTextResponse("this link's token is unknown or revoked\n", status_code=403)
            if not first_party(request):  # login CSRF: another site would sign this browser in as who
                return Response(sign_in_page(who.describe(), f"/?t={token}"), media_type="text/html")
            resp = RedirectResponse(request.url.path, status_code=303)
            resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
            return resp
        who = self.who(request)
        if who is None:
            return PlainTextResponse("no access: open the link labctl serve printed for you\n", status_code=403)
        if who.kind == STUDENT:
            return RedirectResponse(f"/lab/{who.lab}@{who.student}", status_code=303)
        if who.kind == TRAINER:
            return RedirectResponse(f"/class/{who.lab}", status_code=303)
        return Response(page("labctl: labs on this host", "index", who=who.describe()), media_type="text/html")

    async def class_page(self, request: Request) -> Response:
        lab = request.path_params["lab"]
        who = self.who(request)
        if who is None or who.kind not in (TRAINER, OWNER) or (who.kind == TRAINER and who.lab != lab):
            return PlainTextResponse("forbidden\n", status_code=403)
        return Response(page(f"class of {lab}", "class", lab=lab, who=who.describe()), media_type="text/html")

    async def lab_page(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        who = self.who(request)
        if who is None or not who.may_reach(ident):
            return PlainTextResponse("forbidden\n", status_code=403)
        return Response(page(f"lab {ident}", "lab", lab=ident, who=who.describe(), role=who.kind),
                        media_type="text/html")

    # -- JSON ----------------------------------------------------------------------------------

    def _reach(self, request: HTTPConnection, ident: str) -> Principal | None:
        who = self.who(request)
        return who if who is not None and who.may_reach(ident) else None

    async def api_index(self, request: Request) -> Response:
        who = self.who(request)
        if who is None or who.kind != OWNER:
            return forbidden()
        labs = await asyncio.to_thread(self.room.labs)
        classes = await asyncio.to_thread(self.room.classes)
        return JSONResponse({"labs": labs, "classes": classes})

    async def api_class(self, request: Request) -> Response:
        lab = request.path_params["lab"]
        who = self.who(request)
        if who is None or not (who.kind == OWNER or (who.kind == TRAINER and who.lab == lab)):
            return forbidden()
        try:
            return JSONResponse(await self.view(f"class:{lab}", lambda: self.room.class_view(lab)))
        except LabctlError as exc:
            return not_found(exc.message)

    async def api_allow_reset(self, request: Request) -> Response:
        lab = request.path_params["lab"]
        who = self.who(request)
        if who is None or not same_origin(request) or not (who.kind == OWNER or (who.kind == TRAINER and who.lab == lab)):
            return forbidden()
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, status_code=400)
        allow = body.get("allow") if isinstance(body, dict) else None
        if not isinstance(allow, bool):
            return JSONResponse({"error": "say {\"allow\": true} or {\"allow\": false}"}, status_code=400)
        self.room.allow_reset[lab] = allow
        self.forget()
        return JSONResponse({"class": lab, "allow_reset": allow})

    async def api_lab(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        who = self._reach(request, ident)
        if who is None:
            return forbidden()
        if who.kind == OWNER:
            view = dict(await self.view(f"owner:{ident}", lambda: self.owner_view(ident)))
        else:
            view = dict(await self.view(f"lab:{ident}", lambda: self.lab_view(ident)))
        klass = class_of(ident)
        if klass:
            record = await asyncio.to_thread(ClassRecord.load, klass)
            view["handout"], view["handout_note"] = await asyncio.to_thread(handout_text, record,
                                                                            ident.partition("@")[2])
        view["class"] = klass
        return JSONResponse(view)

    async def api_topology(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        if self._reach(request, ident) is None:
            return forbidden()
        try:
            svg = await self.view(f"svg:{ident}", lambda: topology_svg(ident))
        except LabctlError as exc:
            return not_found(exc.message)
        return Response(svg, media_type="image/svg+xml")

    async def api_checks(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        if self._reach(request, ident) is None or not same_origin(request):
            return forbidden()
        if not run_dir(ident).is_dir():
            return not_found(f"lab {ident} is not up")
        await asyncio.to_thread(self.room.run_checks, ident, class_of(ident))
        self.forget()
        return JSONResponse(self.room.checks_view(ident))

    async def api_reset(self, request: Request) -> Response:
        ident, guest = request.path_params["ident"], request.path_params["guest"]
        who = self._reach(request, ident)
        if who is None or not same_origin(request):
            return forbidden()
        if who.kind == STUDENT and not self.room.allow_reset.get(who.lab, False):
            return forbidden("your trainer has not allowed resets")
        try:
            state = await asyncio.to_thread(LabState.load, ident)
        except LabctlError as exc:
            return not_found(exc.message)
        if guest not in state.guests:
            return not_found(f"lab {ident} has no guest {guest!r}")
        self.forget()
        self.terminals.close_where(lambda i, g: i == ident and g == guest, 4001, "the guest is being reset")
        try:
            took = await asyncio.to_thread(self.room.reset, ident, guest)
        except LabctlError as exc:
            return JSONResponse({"error": exc.message}, status_code=409)
        finally:
            self.forget()
        return JSONResponse({"lab": ident, "guest": guest, "seconds": took.get(guest)})

    async def events(self, request: Request) -> Response:
        token = token_of(request)
        who = resolve(token)
        klass, ident = request.query_params.get("class"), request.query_params.get("lab")
        if who is None:
            return forbidden()
        if klass is not None:
            if not who.may_see_class(klass):
                return forbidden()
            key, fn = f"class:{klass}", lambda: self.room.class_view(klass)
            allowed: Callable[[Principal], bool] = lambda w: w.may_see_class(klass)
        elif ident is not None and who.may_reach(ident):
            key, fn = f"lab:{ident}", lambda: self.lab_view(ident)
            if who.kind == OWNER:
                key, fn = f"owner:{ident}", lambda: self.owner_view(ident)
            allowed = lambda w: w.may_reach(ident)
        else:
            return forbidden()

        async def stream() -> AsyncIterator[str]:
            last, sent_at = "", time.monotonic()
            yield "retry: 2000\n\n"
            while not await request.is_disconnected():
                now_who = resolve(token)
                if now_who is None or not allowed(now_who):
                    yield "event: revoked\ndata: {}\n\n"
                    return
                try:
                    data = json.dumps(await self.view(key, fn), sort_keys=True)
                except LabctlError as exc:
                    data = json.dumps({"error": exc.message})
                if data != last:
                    last, sent_at = data, time.monotonic()
                    yield f"data: {data}\n\n"
                elif time.monotonic() - sent_at > KEEPALIVE:
                    sent_at = time.monotonic()
                    yield ": keepalive\n\n"
                await asyncio.sleep(EVENT_PERIOD)

        return StreamingResponse(stream(), media_type="text/event-stream")

    # -- the engineer's tools (owner only) -----------------------------------------------------

    def _owner(self, request: HTTPConnection, ident: str, post: bool = True) -> bool:
        who = self.who(request)
        return (who is not None and who.kind == OWNER and who.may_reach(ident)
                and (not post or same_origin(request)))

    @staticmethod
    async def _body(request: Request) -> dict[str, Any] | None:
        try:
            body = await request.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    @staticmethod
    def _failed(exc: LabctlError) -> JSONResponse:
        status = 400 if isinstance(exc, UsageError) else 404 if isinstance(exc, LabStateError) else 409
        return JSONResponse({"error": exc.message}, status_code=status)

    async def _act(self, fn: Callable[[], Any]) -> Any:
        try:
            return await asyncio.to_thread(fn)
        finally:
            self.forget()

    async def api_console(self, request: Request) -> Response:
        ident, guest = request.path_params["ident"], request.path_params["guest"]
        token = token_of(request)
        if not self._owner(request, ident, post=False):
            return forbidden()
        try:
            state = await asyncio.to_thread(LabState.load, ident)
        except LabctlError as exc:
            return self._failed(exc)
        rec = state.guests.get(guest)
        if rec is None:
            return not_found(f"lab {ident} has no guest {guest!r}")
        tail = ConsoleTail(Path(rec.console))

        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            sent_at, failed = time.monotonic(), ""
            while not await request.is_disconnected():
                now_who = resolve(token)
                if now_who is None or now_who.kind != OWNER:
                    yield "event: revoked\ndata: {}\n\n"
                    return
                try:
                    restarted, text = await asyncio.to_thread(tail.read)
                    failed = ""
                except OSError as exc:
                    if not failed:
                        failed = f"cannot read the console: {exc.strerror or exc}"
                        yield f"data: {json.dumps({'error': failed})}\n\n"
                    restarted, text = False, ""
                if text or restarted:
                    sent_at = time.monotonic()
                    yield f"data: {json.dumps({'restart': restarted, 'text': text})}\n\n"
                elif time.monotonic() - sent_at > KEEPALIVE:
                    sent_at = time.monotonic()
                    yield ": keepalive\n\n"
                await asyncio.sleep(CONSOLE_PERIOD)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def _owner_post(self, request: Request, act: Callable[[str, dict[str, Any]], Any],
                          answer: Callable[[Any, dict[str, Any]], Any]) -> Response:
        """An engineer's action on their lab (owner token only): ``act(ident, body)`` in a thread,
        then ``answer(result, body)`` as JSON; a body that is not a JSON object is 400."""
        ident = request.path_params["ident"]
        if not self._owner(request, ident):
            return forbidden()
        body = await self._body(request)
        if body is None:
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
        try:
            result = await self._act(lambda: act(ident, body))
        except LabctlError as exc:
            return self._failed(exc)
        return JSONResponse(answer(result, body))

    async def api_capture_start(self, request: Request) -> Response:
        return await self._owner_post(
            request, lambda ident, b: self.tools.start_capture(ident, b.get("guest"), b.get("nic")),
            lambda result, _b: result)

    async def api_capture_stop(self, request: Request) -> Response:
        ident, cid = request.path_params["ident"], request.path_params["cid"]
        if not self._owner(request, ident):
            return forbidden()
        try:
            return JSONResponse(await self._act(lambda: self.tools.stop_capture(ident, cid)))
        except LabctlError as exc:
            return self._failed(exc)
        except OSError as exc:
            return JSONResponse({"error": f"cannot save the capture: {exc.strerror or exc}"}, status_code=500)

    async def api_capture_file(self, request: Request) -> Response:
        ident, cid = request.path_params["ident"], request.path_params["cid"]
        if not self._owner(request, ident, post=False):
            return forbidden()
        try:
            path, meta = await asyncio.to_thread(self.tools.capture_file, ident, cid)
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

    async def api_impair(self, request: Request) -> Response:
        return await self._owner_post(
            request, lambda ident, b: self.tools.impair(ident, b.get("guest"), b.get("nic"), b.get("impair")),
            lambda imp, _b: {"impair": imp.to_dict() if imp else {}, "text": imp.describe() if imp else "none"})

    async def api_link(self, request: Request) -> Response:
        return await self._owner_post(
            request, lambda ident, b: self.tools.link(ident, b.get("guest"), b.get("nic"), b.get("up")),
            lambda _result, b: {"link": "up" if b.get("up") else "down"})

    # -- terminals -----------------------------------------------------------------------------

    async def terminal(self, ws: WebSocket) -> None:
        ident, guest = ws.path_params["ident"], ws.path_params["guest"]
        token = token_of(ws)
        who = resolve(token)
        if who is None or token is None or not who.may_reach(ident) or not same_origin(ws):
            await ws.close(code=4403)  # before accept: the client sees HTTP 403
            return
        mode = ws.query_params.get("mode", "rw")
        writable = mode != "ro"
        size = clamp_size(_int(ws.query_params.get("cols")), _int(ws.query_params.get("rows"))) or (80, 24)
        try:
            state = await asyncio.to_thread(LabState.load, ident)
            ep = state.endpoint(guest)
        except LabctlError:
            await ws.close(code=4404)
            return
        await ws.accept()
        try:
            hub = await self.terminals.attach(ident, guest, ep, *size)
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
                        self.room.typed(ident)
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

    # -- the watcher ---------------------------------------------------------------------------

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
                who = whos.get(sub.token)
                if who is None or not who.may_reach(hub.ident):
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


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def valid_ident(ident: str) -> bool:
    return bool(LAB_IDENT.fullmatch(ident))


def build_app(server: Server | None = None) -> ASGIApp:
    """The application, wrapped in the security headers."""
    s = server or Server()
    routes = [
        Route("/", s.index),
        Route("/class/{lab}", s.class_page),
        Route("/lab/{ident}", s.lab_page),
        Route("/api/index", s.api_index),
        Route("/api/class/{lab}", s.api_class),
        Route("/api/class/{lab}/allow-reset", s.api_allow_reset, methods=["POST"]),
        Route("/api/lab/{ident}", s.api_lab),
        Route("/api/lab/{ident}/topology.svg", s.api_topology),
        Route("/api/lab/{ident}/checks", s.api_checks, methods=["POST"]),
        Route("/api/lab/{ident}/reset/{guest}", s.api_reset, methods=["POST"]),
        Route("/api/lab/{ident}/console/{guest}", s.api_console),
        Route("/api/lab/{ident}/captures", s.api_capture_start, methods=["POST"]),
        Route("/api/lab/{ident}/captures/{cid}/stop", s.api_capture_stop, methods=["POST"]),
        Route("/api/lab/{ident}/captures/{cid}.pcapng", s.api_capture_file),
        Route("/api/lab/{ident}/impair", s.api_impair, methods=["POST"]),
        Route("/api/lab/{ident}/link", s.api_link, methods=["POST"]),
        Route("/api/events", s.events),
        WebSocketRoute("/ws/term/{ident}/{guest}", s.terminal),
        Mount("/static", StaticFiles(directory=static_dir()), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=s.lifespan)
    return SecurityHeaders(app)
