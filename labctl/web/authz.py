"""Who may do what in ``labctl serve``: one :meth:`Policy.authorize` (principal, action, instance),
and :func:`requires`, which a route declares its action with (as Starlette's ``requires`` declares a
scope) so that no handler spells a refusal out.

=================  ==================================================  ============================
action             what                                                 who
=================  ==================================================  ============================
``index``          the owner's index of labs and classes                the owner
``class.view``     a class's page, view and events                      the owner, the class's trainer
``class.manage``   a class's settings (students may reset)              the owner, the class's trainer
``lab.view``       an instance's page, view, topology, events, terminal whoever reaches it (below)
``lab.check``      run an instance's checks                             whoever reaches it
``lab.reset``      reset a guest of an instance                         whoever reaches it; a student
                                                                        only when the trainer allows
``lab.tools``      the engineer's tools (console, captures, links...)   the owner
``lab.follow``     follow packets on an instance, see the last ones     whoever reaches it; a student
                                                                        only when the trainer allows
=================  ==================================================  ============================

Who reaches an instance is the principal's (:meth:`labctl.web.access.Principal.may_reach`): a
student their own, the trainer the class's students' as the roster names them now, the owner
every lab. A request that changes something (``post``) must also come from the page's own origin
when the browser says where it comes from. Every request resolves its token again; a live stream
asks :meth:`Policy.authorize` again each time it sends (a revoked token ends it).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, Response
from starlette.websockets import WebSocket

from labctl.web.access import OWNER, STUDENT, Principal, resolve
from labctl.web.http import forbidden, same_origin, token_of

INDEX, CLASS_VIEW, CLASS_MANAGE = "index", "class.view", "class.manage"
LAB_VIEW, LAB_CHECK, LAB_RESET, LAB_TOOLS = "lab.view", "lab.check", "lab.reset", "lab.tools"
LAB_FOLLOW = "lab.follow"
CLASS_ACTIONS = (CLASS_VIEW, CLASS_MANAGE)
ACTIONS = (INDEX, *CLASS_ACTIONS, LAB_VIEW, LAB_CHECK, LAB_RESET, LAB_TOOLS, LAB_FOLLOW)
FORBIDDEN = "forbidden"
NO_RESETS = "your trainer has not allowed resets"
NO_FOLLOW = "your trainer has not allowed following packets"


class Policy:
    """The rules of the table above; ``allow_reset`` and ``allow_follow`` are each class's choices
    (``class.manage``)."""

    def __init__(self, allow_reset: Mapping[str, bool], allow_follow: Mapping[str, bool] | None = None) -> None:
        self.allow_reset = allow_reset
        self.allow_follow: Mapping[str, bool] = allow_follow if allow_follow is not None else {}

    def authorize(self, who: Principal | None, action: str, instance: str = "") -> str | None:
        """None when ``who`` may do ``action`` on ``instance`` (a class's lab for the ``class``
        actions, a lab instance ``LAB[@STUDENT]`` for the ``lab`` ones); else why not."""
        if who is None or action not in ACTIONS:
            return FORBIDDEN
        if action == INDEX:
            return None if who.kind == OWNER else FORBIDDEN
        if action in CLASS_ACTIONS:
            return None if who.may_see_class(instance) else FORBIDDEN
        if not who.may_reach(instance):
            return FORBIDDEN
        if action == LAB_TOOLS:
            return None if who.kind == OWNER else FORBIDDEN
        if action == LAB_RESET and who.kind == STUDENT and not self.allow_reset.get(who.lab, False):
            return NO_RESETS
        if action == LAB_FOLLOW and who.kind == STUDENT and not self.allow_follow.get(who.lab, False):
            return NO_FOLLOW
        return None

    def who(self, conn: HTTPConnection) -> Principal | None:
        return resolve(token_of(conn))

    def check(self, conn: HTTPConnection, action: str, instance: str = "", post: bool = False) -> str | None:
        """:meth:`authorize` for the token ``conn`` carries; a ``post`` from another origin is refused too."""
        if post and not same_origin(conn):
            return FORBIDDEN
        return self.authorize(self.who(conn), action, instance)


Handler = Callable[..., Awaitable[Any]]


class Guarded:
    """What a group of routes has: the policy its routes are checked against."""

    policy: Policy


def requires(action: str, param: str = "", *, post: bool = False, page: bool = False
             ) -> Callable[[Handler], Handler]:
    """Declare a route's need: ``action`` on the instance its path parameter ``param`` names (none:
    ``index``); ``post``: it changes something (same origin only). A refused HTTP request gets 403
    (plain text for a ``page``, else JSON with the reason), a refused websocket is closed 4403
    before it is accepted (the client sees HTTP 403)."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def guarded(self: Guarded, conn: Any, *args: Any, **kwargs: Any) -> Any:
            instance = conn.path_params.get(param, "") if param else ""
            why = self.policy.check(conn, action, instance, post)
            if why is not None:
                return await refuse(conn, why, page)
            return await handler(self, conn, *args, **kwargs)

        guarded.requires = (action, param, post)  # type: ignore[attr-defined]
        return guarded

    return wrap


async def refuse(conn: Any, why: str, page: bool = False) -> Response | None:
    """The refusal of ``conn``: a websocket closed 4403, a page's plain 403, an API's JSON 403."""
    if isinstance(conn, WebSocket):
        await conn.close(code=4403)  # before accept: the client sees HTTP 403
        return None
    if page:
        return PlainTextResponse(f"{why}\n", status_code=403)
    return forbidden(why)
