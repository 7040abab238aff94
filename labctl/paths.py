"""Where labctl keeps things: caches, lab state, resources shipped with it.

Every directory labctl deletes from, writes into or trusts (its state, its
cache, a handout or output directory) is checked first by :func:`checked_dir`:
each component from ``/`` down, without following another user's links, must
belong to the invoking user or root and be writable by nobody else (a sticky
directory such as ``/tmp`` may be on the way). Files go to such a directory
through :func:`atomic_write` (``O_EXCL|O_NOFOLLOW`` under an unguessable
name, then renamed into place) and leave it through :func:`remove_tree`
(directory descriptors, never a link followed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol, overload

from labctl.errors import UnsafePath

_MAX_LINKS = 40


class _HasDir(Protocol):
    @property
    def dir(self) -> Path: ...


class InDir:
    """A read-only attribute of a record of one directory (a guest's, a kernel's, a snapshot's):
    the file ``name`` in the record's ``dir``. ``console = InDir("console.log")`` in the class body
    reads as the property ``return self.dir / "console.log"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> InDir: ...
    @overload
    def __get__(self, obj: _HasDir, owner: type | None = None) -> Path: ...
    def __get__(self, obj: _HasDir | None, owner: type | None = None) -> Path | InDir:
        return self if obj is None else obj.dir / self.name

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"{self.attr}: the file {self.name!r} of the record's directory cannot be set")


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _check_component(path: str, st: os.stat_result, final: bool, shared_ok: bool) -> None:
    """:raise UnsafePath: when directory ``path`` (``st``, from lstat) may be changed by another user."""
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory")
    if not _trusted_owner(st.st_uid):
        raise UnsafePath(f"refusing to use {path}: it belongs to {_user(st.st_uid)}, not to you or root",
                         hint="use a directory of your own")
    if st.st_mode & 0o022:
        sticky = bool(st.st_mode & stat.S_ISVTX)
        if not sticky or (final and not shared_ok):
            raise UnsafePath(f"refusing to use {path}: it is writable by other users "
                             f"(mode {stat.S_IMODE(st.st_mode):04o})",
                             hint=f"chmod go-w {path}, or use a directory of your own")


def checked_dir(path: str | os.PathLike[str], *, create: bool = False, shared_ok: bool = False,
                missing_ok: bool = False, mode: int = 0o700) -> Path:
    """The real path of directory ``path``, once every component from ``/`` down is safe to trust.

    Each component is looked at with ``lstat`` (no link followed blindly): it must
    be a directory owned by the invoking user or root and not writable by group or
    others, except a sticky one (``/tmp``) on the way. A symbolic link is followed
    only when it belongs to the user or root (it sits in a directory already
    checked), and its target is checked the same way. ``path`` itself may be a
    sticky shared directory only with ``shared_ok`` (a file written there by
    :func:`atomic_write` cannot be replaced by another user).

    ``create`` makes missing components (0755, the last ``mode``); ``missing_ok``
    returns as soon as a component is missing (what is left will be the user's own).

    :raise UnsafePath: when a component fails. :raise OSError: when it cannot be
        looked at or created (FileNotFoundError unless ``create`` or ``missing_ok``).
    """
    todo = [c for c in reversed(os.path.abspath(os.fspath(path)).split("/")) if c not in ("", ".")]
    cur = "/"
    _check_component("/", os.lstat("/"), not todo, shared_ok)
    links = 0
    while todo:
        name = todo.pop()
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        final = not todo
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if missing_ok and not create:
                return Path(nxt, *reversed(todo))
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(nxt, mode if final else 0o755)
            st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            if not _trusted_owner(st.st_uid):
                raise UnsafePath(f"refusing to follow {nxt}: it is a symbolic link of {_user(st.st_uid)}'s",
                                 hint="use a directory of your own")
            links += 1
            if links > _MAX_LINKS:
                raise UnsafePath(f"refusing to use {path}: too many symbolic links")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
            continue
        _check_component(nxt, st, final, shared_ok)
        cur = nxt
    return Path(cur)


def cache_dir() -> Path:
    """The user's labctl cache (images, downloads): $LABCTL_CACHE_DIR, else
    $XDG_CACHE_HOME/labctl when that directory is the user's own, else ~/.cache/labctl.

    :raise UnsafePath: when the directory (as far as it exists) is not safe to trust.
    """
    env = os.environ.get("LABCTL_CACHE_DIR")
    if env:
        chosen = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg and _owned_private(xdg) else Path.home() / ".cache"
        chosen = base / "labctl"
    checked_dir(chosen, missing_ok=True)
    return chosen


def _owned_private(path: str) -> bool:
    """True when ``path`` is a safe directory owned by the invoking user (a runtime or cache
    directory an environment variable names: ``su`` passes on the caller's)."""
    try:
        real = checked_dir(path)
        return real.lstat().st_uid == os.geteuid()
    except (UnsafePath, OSError):
        return False


def state_dir() -> Path:
    """Where per-lab run directories live.

    $LABCTL_STATE_DIR, else /run/labctl for root, else $XDG_RUNTIME_DIR/labctl
    when that directory is the user's own and nobody else's to write (``su``
    keeps the caller's), else ~/.local/state/labctl. Kept short: unix socket
    paths inside it must stay under 108 bytes.

    :raise UnsafePath: when the directory (as far as it exists) is not safe to trust.
    """
    env = os.environ.get("LABCTL_STATE_DIR")
    if env:
        chosen = Path(env)
    elif os.geteuid() == 0:
        chosen = Path("/run/labctl")
    else:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        if xdg and _owned_private(xdg):
            chosen = Path(xdg) / "labctl"
        else:
            chosen = Path.home() / ".local" / "state" / "labctl"
    checked_dir(chosen, missing_ok=True)
    return chosen


def resource_dir(name: str) -> Path:
    """A top-level resource folder shipped with labctl (``images``, ``guest``).

    In a source checkout (or editable install) it is the repository's folder;
    in a wheel it is packaged under ``labctl/_data``.
    """
    package = Path(__file__).resolve().parent  # resolved here, not at import: 2.5 ms of every command
    for candidate in (package.parent / name, package / "_data" / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"labctl resource folder '{name}' is missing from this installation")


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it mode 0700; every component is checked
    (:func:`checked_dir`) and ``path`` itself must be the invoking user's.

    :raise UnsafePath: when a component is another user's, writable by others, or
        ``path`` is a link of another user's.
    """
    real = checked_dir(path, create=True)
    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafePath(f"refusing to use {path}: it belongs to {_user(st.st_uid)}",
                             hint="use a directory of your own")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def _open_dir(path: Path, shared_ok: bool) -> int:
    """A descriptor of directory ``path`` once :func:`checked_dir` accepts it (opened without following a link)."""
    real = checked_dir(path, shared_ok=shared_ok)
    return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _temp_in(dir_fd: int, name: str) -> str:
    """A new empty file (mode 0600) under an unguessable name in ``dir_fd``, created with
    ``O_EXCL|O_NOFOLLOW`` (what ``mkstemp`` does, relative to a directory descriptor)."""
    for _ in range(100):
        tmp = f".{name[:100]}.{os.urandom(8).hex()}{TEMP_SUFFIX}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name}")


TEMP_SUFFIX = ".tmp"


def is_temp_of(name: str, target: str) -> bool:
    """True when ``name`` is one of :func:`atomic_file`'s temporary names for a file named ``target``."""
    return name.startswith(f".{target[:100]}.") and name.endswith(TEMP_SUFFIX)


@contextlib.contextmanager
def atomic_file(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A binary file to fill in the block; on success it replaces ``path`` at once (``mode``, less the umask).

    The directory is checked (:func:`checked_dir`; a sticky one like ``/tmp`` is
    fine) and opened without following a link; the data goes to a new file made
    there with ``O_EXCL|O_NOFOLLOW`` under an unguessable name (as ``mkstemp``),
    with ``mode``, then renamed over ``path`` (a link at ``path`` is replaced,
    never followed). On failure the temporary file is removed and ``path`` untouched.

    :raise UnsafePath: when the directory is not safe to write into. :raise OSError: when it cannot be written.
    """
    path = Path(path)
    dir_fd = _open_dir(path.parent, shared_ok=True)
    tmp = None
    try:
        tmp = _temp_in(dir_fd, path.name)
        fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode & ~_umask())
            yield f
        os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        os.close(dir_fd)


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half of it
    (through :func:`atomic_file`: a checked directory, ``O_EXCL|O_NOFOLLOW``, then a rename).

    :raise UnsafePath: when the directory is not safe to write into. :raise OSError: when it cannot be written.
    """
    with atomic_file(path, mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def create_new(path: Path, mode: int = 0o644, *, replace: bool = True) -> int:
    """A descriptor for writing a new regular file at ``path`` (a stream, like ``capture -w``):
    the directory is checked as for :func:`atomic_write` and the file created with
    ``O_EXCL|O_NOFOLLOW``; with ``replace`` an existing regular file of the user's
    own is removed first, anything else there (a link, another user's file) refused.

    :raise UnsafePath: for an unsafe directory or an existing file that is not the
        user's own regular file. :raise OSError: when it cannot be created.
    """
    path = Path(path)
    dir_fd = _open_dir(path.parent, shared_ok=True)
    try:
        if replace:
            try:
                st = os.lstat(path.name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file of yours"
                    raise UnsafePath(f"refusing to write {path}: it exists and is {kind}",
                                     hint="remove it, or choose another file")
                os.unlink(path.name, dir_fd=dir_fd)
        return os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def remove_tree(parent: Path, name: str, *, owner_only: bool = True) -> bool:
    """Remove directory ``name`` under ``parent`` and everything in it, without following any link.

    ``parent`` is checked (:func:`checked_dir`) and opened without following a link;
    ``name`` must be a real directory in it (not a link) of the invoking user's
    (with ``owner_only``); the walk goes by directory descriptors (``shutil.rmtree``
    with ``dir_fd``), so a link inside is removed, never followed. Returns False
    when there was nothing to remove.

    :raise UnsafePath: when ``parent`` is not safe or ``name`` is not such a directory.
    """
    if not name or "/" in name or name in (".", ".."):
        raise UnsafePath(f"refusing to remove {name!r} under {parent}: not a plain name")
    try:
        dir_fd = _open_dir(parent, shared_ok=False)
    except FileNotFoundError:
        return False
    try:
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise UnsafePath(f"refusing to remove {Path(parent, name)}: it is {kind}")
        if owner_only and st.st_uid != os.geteuid():
            raise UnsafePath(f"refusing to remove {Path(parent, name)}: it belongs to {_user(st.st_uid)}")
        import shutil  # here: shutil (with bz2 and lzma) is 2 ms of every command that removes nothing

        shutil.rmtree(name, ignore_errors=True, dir_fd=dir_fd)
        return True
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def alone(lock_file: Path, busy: Exception) -> Iterator[None]:
    """:func:`exclusive` without waiting: raise ``busy`` when another process holds the lock
    (a BlockingIOError from inside the block is the block's own and passes through)."""
    held = False
    try:
        with exclusive(lock_file, wait=False):
            held = True
            yield
    except BlockingIOError as exc:
        if held:
            raise
        raise busy from exc


@contextlib.contextmanager
def build_into(final: Path, mode: int = 0o700, *, store: Path | None = None) -> Iterator[Path]:
    """A new, empty work directory beside ``final`` for the block, which fills it; when the
    block ends normally the work directory replaces ``final`` whole (readers see the old one or
    the new one, never half of it); otherwise it is removed and ``final`` stays as it was.

    The work directory's name (``.new-NAME-PID``) is the caller's process's own; hold a lock
    when several processes may build the same ``final``. ``store``: the directory ``final``
    must be inside (checked before anything is removed or made; see :func:`check_within`).

    :raise UnsafePath: when ``final`` is not inside ``store``.
    """
    import shutil

    if store is not None:
        check_within(final, store)
    work = final.with_name(f".new-{final.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work.parent, exist_ok=True)
    os.mkdir(work, mode)
    try:
        yield work
        shutil.rmtree(final, ignore_errors=True)
        work.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_within(path: Path, store: Path) -> None:
    """``path`` names an entry strictly inside the directory ``store``: a plain last component (no
    ``..`` anywhere), in a directory that is ``store`` or inside it once both are resolved (no
    link out of it on the way).

    :raise UnsafePath: when it does not.
    """
    real = Path(os.path.realpath(store))
    parent = Path(os.path.realpath(path.parent))
    if ".." in path.parts or path.name in ("", ".") or not parent.is_relative_to(real):
        raise UnsafePath(f"{path} is outside labctl's store {store}; nothing written or removed")


@contextlib.contextmanager
def exclusive(lock_file: Path, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (made 0600, never through a link, with its
    directory) for the block: another labctl doing the same work waits, then usually finds it
    done; with ``wait=False`` it does not wait.

    :raise BlockingIOError: with ``wait=False``, when another process holds it.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        yield
    finally:
        os.close(fd)
