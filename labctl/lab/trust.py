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

:func:`named_path_reason` is the one rule for every host path a lab file names (a share, a
bpftrace ``file:``, a selftests' tree, a kernel's tree, image, modules, debug file and config):
the above, and for a lab file of another user (not root) only what that user owns and can read
(:func:`owner_reason`), so running it shows nothing its author could not see. A lab file from a
URL, a git repository or a pack names no host path at all (a git one: only files of its own
checkout); the loader refuses those before it reads them (:func:`remote_reason`). A file read
is read by :func:`read_capped`: a regular file, never through a link, and no further than its cap.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = ["TRUST_ENV", "env_trusted", "named_path_reason", "owner_name", "owner_reason", "read_capped",
           "remote_reason", "unreadable_reason", "untrusted_reason"]

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
    """Why the user ``uid`` could not read ``path`` (absolute, resolved), or None: every directory
    above it must let them search it, and it must let them read it, and search it when it is a
    directory (as its owner, a member of its group, or anyone). Root reads everything."""
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
        want = (0o5 if stat.S_ISDIR(st.st_mode) else 0o4) if leaf else 0o1
        if not _may(st, uid, gids, want):
            return f"{owner_name(uid)} cannot {'read' if leaf else 'reach'} {here}"
    return None


def owner_reason(path: Path, owner: int | None) -> str | None:
    """Why a lab file that ``owner`` owns may not name ``path`` (absolute, resolved), or None: a lab
    file of another user (not root, not the invoking user) names only what that user owns (not
    through a link) and can read. ``owner`` None: the invoking user's own choice."""
    if owner is None or owner in (os.geteuid(), 0):
        return None
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid != owner:
        return (f"it belongs to {owner_name(st.st_uid)}, and the lab file to {owner_name(owner)}: a lab file "
                "of another user names only what that user owns")
    why = unreadable_reason(path, owner)
    return f"the lab file's owner could not read it: {why}" if why else None


def remote_reason(path: Path, remote: str | None, root: Path | None = None) -> str | None:
    """Why a lab file from ``remote`` (a URL, a git repository, a pack; None: a file of this host)
    may not name ``path`` (absolute, resolved), or None: it names no path of this host, but a file
    of ``root`` (the git checkout it came with)."""
    if remote is None:
        return None
    if root is not None and path.is_relative_to(Path(os.path.realpath(root))):
        return None
    return f"a lab file from {remote} may not name a path of this host"


def named_path_reason(path: Path, trusted: Iterable[Path] = (), owner: int | None = None,
                      remote: str | None = None, root: Path | None = None) -> str | None:
    """The one rule for a host path a lab file names (see the module): why ``path`` (absolute,
    resolved) may not be used, or None. ``owner``: the uid owning the lab file; ``remote``: where a
    lab file not of this host came from, ``root`` its git checkout (:func:`remote_reason`)."""
    return remote_reason(path, remote, root) or owner_reason(path, owner) or untrusted_reason(path, trusted)


def read_capped(path: Path, cap: int) -> bytes:
    """At most ``cap + 1`` bytes of the regular file ``path``: opened without following a link in its
    last component and without blocking (a FIFO), checked to be a regular file before it is read,
    and never read past the cap (a caller seeing more than ``cap`` bytes refuses it).

    :raise OSError: when it cannot be opened or is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(0, "not a regular file")
        return f.read(cap + 1)
