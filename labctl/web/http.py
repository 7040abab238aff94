"""What every request and response of ``labctl serve`` shares: the security headers, where a
request's token is, the same-origin check, error responses, the page shell and server-sent events."""

from __future__ import annotations

import asyncio
import html
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, StreamingResponse

COOKIE = "labctl_token"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; "
       "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SecurityHeaders:
    """Every HTTP response gets the CSP (no outside origin), no-store, no referrer, no sniffing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                            (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store"),
                            (b"x-frame-options", b"DENY"), (b"cross-origin-opener-policy", b"same-origin"),
                            (b"cross-origin-resource-policy", b"same-origin")]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def token_of(conn: HTTPConnection) -> str | None:
    auth = conn.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return conn.cookies.get(COOKIE)


def same_origin(conn: HTTPConnection) -> bool:
    """False when the browser says the request comes from another origin."""
    origin = conn.headers.get("origin")
    if origin is None:
        return True
    scheme = "https" if conn.url.scheme in ("https", "wss") else "http"
    return origin == f"{scheme}://{conn.headers.get('host', '')}"


def first_party(conn: HTTPConnection) -> bool:
    """False when the browser says another site started the request: ``Sec-Fetch-Site`` other
    than ``none`` (a link typed, pasted, bookmarked or opened from another program) or
    ``same-origin`` (another port of this host is another origin), or, from a browser that does
    not send it, a ``Referer`` of another origin. True for clients that say nothing."""
    site = conn.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("none", "same-origin")
    referer = urllib.parse.urlsplit(conn.headers.get("referer", ""))
    if not referer.scheme:
        return True
    scheme = "https" if conn.url.scheme in ("https", "wss") else "http"
    return (referer.scheme, referer.netloc) == (scheme, conn.headers.get("host", ""))


def forbidden(why: str = "forbidden") -> JSONResponse:
    return JSONResponse({"error": why}, status_code=403)


def not_found(why: str) -> JSONResponse:
    return JSONResponse({"error": why}, status_code=404)


def sign_in_page(who: str, link: str) -> str:
    """What a link with a token shows when another site opened it (login CSRF): nobody is signed
    in; the link, followed from here, signs this browser in as ``who``."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>labctl: sign in?</title>
<link rel="stylesheet" href="/static/app.css"></head>
<body><main><p>This link signs this browser in as <b>{html.escape(who)}</b>. Another site opened it,
so labctl did not sign you in.</p><p>If it is your own link, <a href="{html.escape(link)}">follow it from
here</a>, or paste it into the address bar.</p></main></body></html>
"""


def page(title: str, kind: str, **data: str) -> str:
    attrs = " ".join(f'data-{k}="{html.escape(v)}"' for k, v in data.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/vendor/xterm.css"><link rel="stylesheet" href="/static/app.css">
<script src="/static/vendor/xterm.js" defer></script><script src="/static/vendor/addon-fit.js" defer></script>
<script src="/static/app.js" defer></script></head>
<body data-page="{html.escape(kind)}" {attrs}><header><h1 id="title">{html.escape(title)}</h1>
<span id="who"></span><span id="live" class="live">connecting…</span></header><main id="main"></main></body></html>
"""


def event_stream(request: Request, revoked: Callable[[], bool], poll: Callable[[], Awaitable[str | None]],
                 period: float, keepalive: float) -> StreamingResponse:
    """Server-sent events: every ``period`` seconds, ``poll``'s data when it has some (None: nothing
    new), else a keepalive comment once ``keepalive`` seconds have passed without data; until the
    client goes, or ``revoked()`` (asked before every poll) ends it with ``event: revoked``."""

    async def stream() -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        sent_at = time.monotonic()
        while not await request.is_disconnected():
            if revoked():
                yield "event: revoked\ndata: {}\n\n"
                return
            data = await poll()
            if data is not None:
                sent_at = time.monotonic()
                yield f"data: {data}\n\n"
            elif time.monotonic() - sent_at > keepalive:
                sent_at = time.monotonic()
                yield ": keepalive\n\n"
            await asyncio.sleep(period)

    return StreamingResponse(stream(), media_type="text/event-stream")
