"""The class and the lab in a browser (``labctl serve``): access tokens and who may do what
(:mod:`.access`), the live view of labs and classes the pages show (:mod:`.room`), terminals
bridging a websocket to an SSH channel (:mod:`.terminal`), the ASGI application with its pages
(:mod:`.app`, assets in ``static/``; headers, tokens and the page shell in :mod:`.http`) and
the server around it (:mod:`.server`).

Acts on labs and classes that are up through the library (state, training, up's status); starts
no lab and takes none down.

Imports never: labctl.cli, labctl.pipeline, labctl.bisect, labctl.steps, labctl.bundle, labctl.report
"""
