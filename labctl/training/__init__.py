"""Training courses on top of ``up``: a class of per-student instances
(:mod:`.classroom`) with their handouts (:mod:`.handout`), reset to the
post-boot state (:mod:`.reset`) and named checkpoints (:mod:`.checkpoints`),
guests moved off a squatted SSH port on restore (:mod:`.sshport`), which
libvirt host each student's instance goes to (:mod:`.placement`), and bringing
every instance up, a spread class's hosts side by side (:mod:`.roomup`).
Grading checks are :mod:`labctl.grading`'s, the host's capacity
:mod:`labctl.up.capacity`'s: their users are not only courses.

Imports never: labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.bisect
"""
