"""What a lab's name may be (also its run directory's name): a leaf, so that the commands that only
read a lab's state (``status``, ``exec``) check a name without loading the lab-file package.
:mod:`labctl.lab.model` re-exports these.

Imports never: anything of labctl's
"""

from __future__ import annotations

import re

LAB_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
"""A lab's name: also its run directory's name, so nothing else may pass (no ``/``, ``.``, ``..``)."""

LAB_NAME_RULE = "use 1-32 of a-z, 0-9, '_', '-', starting with a letter or digit"

LAB_IDENT = re.compile(rf"{LAB_NAME.pattern}(?:@{LAB_NAME.pattern})?")
"""A lab that is up: its name, or ``NAME@INSTANCE`` for one of several copies of it (``up --instance``)."""

LAB_IDENT_RULE = f"a lab's name or NAME@INSTANCE; each part: {LAB_NAME_RULE}"
