"""The class and the lab in a browser (``labctl serve``): access tokens (:mod:`.access`) and who may
do what, one ``authorize(principal, action, instance)`` each route declares (:mod:`.authz`); the
live view of labs and classes the pages show (:mod:`.room`) with a class's progress over time
(:mod:`.progress`), the engineer's tools on a lab page (console, captures, impairments:
:mod:`.tools`), terminals bridging a websocket to an SSH channel (:mod:`.terminal`); the ASGI
application (:mod:`.app`, assets in ``static/``; headers, tokens and the page shell in :mod:`.http`)
with its routes grouped by what they serve: the pages (:mod:`.pages`), the JSON and events of
classes and labs (:mod:`.lab_api`), the engineer's tools (:mod:`.tool_api`), packets followed from a page
(:mod:`.follows`, its routes :mod:`.follow_api`), the terminal
(:mod:`.term_route`), what they share (:mod:`.serverstate`); and the server around it
(:mod:`.server`).

Acts on labs and classes that are up through the library (state, training, up's status); starts
no lab and takes none down.

Imports never: labctl.cli, labctl.pipeline, labctl.bisect, labctl.steps, labctl.bundle, labctl.report
"""

from __future__ import annotations

from labctl.web.access import revoke
from labctl.web.server import DEFAULT_PORT, own_certificate, parse_listen, self_signed
from labctl.web.server import bind as bind_socket
from labctl.web.server import links as serve_links
from labctl.web.server import run as run_server

__all__ = [
    "DEFAULT_PORT",
    "bind_socket",
    "own_certificate",
    "parse_listen",
    "revoke",
    "run_server",
    "self_signed",
    "serve_links",
]
