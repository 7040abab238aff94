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

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.training.checkpoints import delete as delete_checkpoint
    from labctl.training.checkpoints import list_all as list_checkpoints
    from labctl.training.checkpoints import restore as restore_checkpoint
    from labctl.training.checkpoints import save as save_checkpoint
    from labctl.training.classroom import (
        DOWN,
        UP,
        ClassRecord,
        check_student,
        class_names,
        classes_root,
        find_class,
        for_students,
        is_up,
        read_roster,
        refuse_up_instances,
        student_status,
    )
    from labctl.training.handout import README, check_alias_prefix, check_handout_dirs, ssh_config
    from labctl.training.placement import place
    from labctl.training.roomup import Arrival, RoomEvents, bring_up
else:  # each name loaded at its first use (labctl.lazyface): reset and checkpoint load no paramiko
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())

# Loaded now: the function has its module's name, and a lazy name loses to the submodule that
# importing labctl.training.reset sets on the package (reset found the module, not the function).
from labctl.training.reset import reset

__all__ = [
    "DOWN", "README", "UP", "Arrival", "ClassRecord", "RoomEvents", "bring_up", "check_alias_prefix",
    "check_handout_dirs", "check_student", "class_names", "classes_root", "delete_checkpoint", "find_class",
    "for_students", "is_up", "list_checkpoints", "place", "read_roster", "refuse_up_instances", "reset",
    "restore_checkpoint", "save_checkpoint", "ssh_config", "student_status",
]
