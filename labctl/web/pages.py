"""The pages of ``labctl serve``: small HTML shells that ``static/app.js`` fills with DOM calls.

``/`` sends a visitor where their token leads (the trainer to their class, a student to their
instance, the owner to the index); a link's token moves into an HttpOnly, SameSite=Strict cookie,
unless another site opened the link (then the page only offers it:
:func:`labctl.web.http.first_party`). ``/class/LAB`` and ``/lab/IDENT`` declare what they need
(:mod:`.authz`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from labctl.web.access import STUDENT, TRAINER, resolve
from labctl.web.authz import CLASS_VIEW, LAB_VIEW, Guarded, Policy, requires
from labctl.web.http import COOKIE, first_party, page, sign_in_page


class Pages(Guarded):
    """The HTML pages."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

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
        who = self.policy.who(request)
        if who is None:
            return PlainTextResponse("no access: open the link labctl serve printed for you\n", status_code=403)
        if who.kind == STUDENT:
            return RedirectResponse(f"/lab/{who.lab}@{who.student}", status_code=303)
        if who.kind == TRAINER:
            return RedirectResponse(f"/class/{who.lab}", status_code=303)
        return Response(page("labctl: labs on this host", "index", who=who.describe()), media_type="text/html")

    @requires(CLASS_VIEW, "lab", page=True)
    async def class_page(self, request: Request) -> Response:
        lab = request.path_params["lab"]
        who = self.policy.who(request)
        assert who is not None
        return Response(page(f"class of {lab}", "class", lab=lab, who=who.describe()), media_type="text/html")

    @requires(LAB_VIEW, "ident", page=True)
    async def lab_page(self, request: Request) -> Response:
        ident = request.path_params["ident"]
        who = self.policy.who(request)
        assert who is not None
        return Response(page(f"lab {ident}", "lab", lab=ident, who=who.describe(), role=who.kind),
                        media_type="text/html")
