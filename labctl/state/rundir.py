"""Where a lab's run directory is, checked before anything in it is trusted: the labs root (this user's,
writable by nobody else) and a lab name that names one directory in it. A leaf (the standard library,
labctl's paths and errors): ``exec`` finds its guest's kept connection from here before it loads the
rest of labctl (:mod:`labctl.cli.quick`).
"""

from __future__ import annotations

from pathlib import Path

from labctl.errors import UsageError
from labctl.names import LAB_IDENT, LAB_IDENT_RULE
from labctl.paths import checked_dir, state_dir

STATE = "state.json"


def labs_root() -> Path:
    """``<state dir>/labs``, once it (as far as it exists) is safe to trust.

    :raise UnsafePath: when it, or a directory above it, is another user's or writable by others.
    """
    root = state_dir() / "labs"
    checked_dir(root, missing_ok=True)
    return root


def check_lab_name(lab: str) -> str:
    """``lab`` when it is a valid lab name (the lab file rule): it names a directory under the labs root.

    :raise UsageError: for anything else (``/tmp``, ``..``, ``.``, ``a/b``...), exit status 2.
    """
    if not isinstance(lab, str) or not LAB_IDENT.fullmatch(lab):
        raise UsageError(f"invalid lab name {lab!r} ({LAB_IDENT_RULE})", hint="see 'labctl status' for the labs that are up")
    return lab


def run_dir(lab: str) -> Path:
    """The run directory of lab ``lab`` (the name is checked first).

    :raise UsageError: for an invalid lab name.
    """
    return labs_root() / check_lab_name(lab)
