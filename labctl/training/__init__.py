"""Training courses on top of ``up``: a class of per-student instances
(:mod:`.classroom`) with their handouts (:mod:`.handout`), grading checks run
in the guests (:mod:`.grading`, also ``labctl check`` and bisect's oracle),
reset to the post-boot state (:mod:`.reset`) and named checkpoints
(:mod:`.checkpoints`), guests moved off a squatted SSH port on restore
(:mod:`.sshport`), whether the host holds the guests asked for
(:mod:`.capacity`), which libvirt host each student's instance goes to
(:mod:`.placement`), and bringing every instance up, a spread class's hosts side
by side (:mod:`.roomup`).

Imports never: labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.bisect
"""
