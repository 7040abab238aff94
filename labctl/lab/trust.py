"""Whether a host path a lab file names may be used: like git's ``safe.directory``.

A lab file names kernel paths on this machine (``kernel: {tree: DIR}``,
``{image: FILE, modules: DIR, debug: FILE}``). Preparing a tree runs
``make -C DIR`` (the image's out-of-tree modules are built against it), and
modules are copied onto the guest's disk, so a path another user controls
would run that user's Makefile, or hand that user's files to the guest, as
whoever runs labctl (often root). Such a path is trusted only when:

* it, and every directory above it, is owned by the user running labctl
  (the effective uid) or by root;
* none of them is group- or other-writable, except a directory above it
  with the sticky bit (``/tmp``): there nobody but its owner can rename or
  remove the (trusted) entry beneath;
* no component is a symbolic link (the lab's paths are resolved first);
* a path that does not exist yet has its nearest existing directory
  writable by nobody else, sticky or not (no one else can create it).

Only the directory or file itself and the directories above it are looked
at, not what is inside (as git does). The user can trust a path anyway
(``--trust-dir DIR`` on the command line, or ``$LABCTL_TRUSTED_DIRS``,
colon-separated): DIR and everything under it.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = ["TRUST_ENV", "env_trusted", "owner_name", "unreadable_reason", "untrusted_reason"]

TRUST_ENV = "LABCTL_TRUSTED_DIRS"


def owner_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` when the uid has no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def env_trusted() -> tuple[Path, ...]:
    """The directories ``$LABCTL_TRUSTED_DIRS`` trusts (absolute ones only)."""
    return tuple(Path(p) for p in os.environ.get(TRUST_ENV, "").split(":") if p.startswith("/"))


def _covered(path: Path, trusted: Iterable[Path]) -> bool:
    for t in trusted:
        root = Path(os.path.realpath(t))
        if path == root or root in path.parents:
            return True
    return False


def untrusted_reason(path: Path, trusted: Iterable[Path] = (), uid: int | None = None) -> str | None:
    """Why ``path`` (absolute, resolved) must not be used as a lab file names it, or None.

    ``trusted``: directories the user trusts anyway (the path itself or one above it).
    ``uid``: whose it may be besides root (default: the effective uid).
    """
    me = os.geteuid() if uid is None else uid
    if _covered(path, trusted):
        return None
    if not path.is_absolute():
        return f"{path} is not an absolute path"
    parts = path.parts
    last_existing: tuple[Path, os.stat_result] | None = None
    for depth in range(1, len(parts) + 1):
        here = Path(*parts[:depth])
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            break
        except OSError as exc:
            return f"{here} cannot be checked ({exc.strerror or exc})"
        leaf = here == path
        if stat.S_ISLNK(st.st_mode):
            return f"{here} is a symbolic link (it changed while labctl checked it)"
        if st.st_uid not in (me, 0):
            you = "root (you)" if me == 0 else f"you ({owner_name(me)}) or root"
            return f"{'it' if leaf else here} is owned by {owner_name(st.st_uid)}, not by {you}"
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and (leaf or not sticky_dir):
            who = "group- and other-writable" if st.st_mode & 0o022 == 0o022 else \
                "group-writable" if st.st_mode & 0o020 else "other-writable"
            return f"{'it' if leaf else here} is {who} (mode {stat.S_IMODE(st.st_mode):04o})"
        last_existing = (here, st)
    else:
        return None
    # path (or a directory above it) does not exist: nobody else may be able to create it
    if last_existing is not None and last_existing[1].st_mode & 0o022:
        here, st = last_existing
        return (f"it does not exist, and {here} (mode {stat.S_IMODE(st.st_mode):04o}) lets other users "
                "create it")
    return None


def _may(st: os.stat_result, uid: int, gids: set[int], bits: int) -> bool:
    """Whether ``uid`` (in ``gids``) has every permission of ``bits`` (0o4 read, 0o1 search) on ``st``."""
    if st.st_uid == uid:
        return st.st_mode & (bits << 6) == bits << 6
    if st.st_gid in gids:
        return st.st_mode & (bits << 3) == bits << 3
    return st.st_mode & bits == bits


def unreadable_reason(path: Path, uid: int) -> str | None:
    """Why the user ``uid`` could not list directory ``path`` (absolute, resolved), or None: every
    directory above it must let them search it, and it must let them read and search it (as its
    owner, a member of its group, or anyone). Root reads everything."""
    if uid == 0:
        return None
    try:
        entry = pwd.getpwuid(uid)
        gids = set(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except KeyError:
        gids = set()
    parts = path.parts
    for depth in range(1, len(parts) + 1):
        here = Path(*parts[:depth])
        try:
            st = os.stat(here)
        except OSError as exc:
            return f"{here} cannot be checked ({exc.strerror or exc})"
        leaf = depth == len(parts)
        if not _may(st, uid, gids, 0o5 if leaf else 0o1):
            return f"{owner_name(uid)} cannot {'read' if leaf else 'reach'} {here}"
    return None
