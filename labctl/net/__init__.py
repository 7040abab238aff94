"""Lab networks: how each network is wired (:mod:`.plan`), labctl's L2 switch
(:mod:`.switch`), free ports on 127.0.0.1 (:mod:`.ports`) and pictures of
the topology (:mod:`.graph`).

Must not import backends, the ``up`` stage, steps or the CLI.
"""
