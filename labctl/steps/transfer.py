"""``labctl cp``: files and directories between the host and a guest of a lab that is up.

Both directions are a tar stream over the lab's SSH session:

* **guest → host**: the guest runs ``tar -cf -`` on the path; the stream goes through
  :func:`labctl.steps.copyback.extract` (regular files and directories only, no absolute
  names, no ``..``, no links, devices or FIFOs, ``O_EXCL|O_NOFOLLOW``, a budget that counts 512
  bytes for every entry besides its data, so it bounds entries as well as bytes) into a
  new private staging directory next to the destination, in a directory that
  :func:`labctl.paths.checked_dir` accepts (the caller's or root's, writable by nobody
  else: not ``/tmp`` itself). Only the path asked for is then renamed into place; whatever
  else the stream held is removed with the staging directory. An existing destination is
  never overwritten. A stream much longer than the budget allows (:func:`stream_limit`)
  fails the copy, with nothing placed.
* **host → guest**: Python's ``tarfile`` writes the stream here, into ``tar -x`` in the guest.
  Nothing is followed out of SRC: a symbolic link inside it is sent as a link (its target
  text, never what it points to); devices, FIFOs and sockets are skipped. SRC itself may be
  a link (the user named it). The whole of SRC must fit the budget (its entries counted the
  same way) before anything is sent.

Guest names (``GUEST:PATH``) say the direction: exactly one of SRC and DEST has one.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import stat
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from labctl import paths
from labctl.endpoint import Remote
from labctl.errors import GuestError, HostError, LabctlError, UsageError
from labctl.steps.copyback import HEADER, extract, safe_parts

USAGE = "labctl cp LAB[@INSTANCE] GUEST:PATH DEST  |  labctl cp LAB[@INSTANCE] SRC GUEST:PATH"
DEFAULT_MAX_SIZE = 4 << 30
DEFAULT_TIMEOUT = 3600.0
PROBE_TIMEOUT = 30.0
_GUEST_SPEC = re.compile(r"([a-z][a-z0-9-]{0,30}):(.*)", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)

Progress = Callable[[int], None]


@dataclass(frozen=True)
class Plan:
    """What to copy: ``remote`` on ``guest``, ``local`` on the host, and which way."""

    guest: str
    remote: str
    local: str
    to_guest: bool


@dataclass
class Copied:
    """What a copy did: the files and bytes that arrived, and what was left out (path, reason)."""

    target: str = ""
    files: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "files": self.files, "bytes": self.bytes,
                "skipped": [{"path": p, "reason": r} for p, r in self.skipped]}


def guest_spec(word: str) -> tuple[str, str] | None:
    """``(guest, path)`` when ``word`` is ``GUEST:PATH`` (a guest name, then a colon), else None.

    A host path with a colon in its first component is written ``./a:b``.
    """
    m = _GUEST_SPEC.fullmatch(word)
    return (m.group(1), m.group(2)) if m else None


def plan(src: str, dest: str) -> Plan:
    """The copy SRC → DEST means: exactly one of them is ``GUEST:PATH``.

    :raise UsageError: when neither or both name a guest, or a path is empty or has control characters.
    """
    s, d = guest_spec(src), guest_spec(dest)
    if s and d:
        raise UsageError("both SRC and DEST name a guest: copy between a guest and the host", hint=USAGE)
    if not s and not d:
        raise UsageError("neither SRC nor DEST names a guest (GUEST:PATH)",
                         hint=f"{USAGE} (a host path with a colon: ./a:b)")
    guest, remote = s or d  # type: ignore[misc]
    local = dest if s else src
    for what, value in (("guest path", remote), ("host path", local)):
        if not value:
            raise UsageError(f"empty {what}", hint=USAGE)
        if _CONTROL.search(value):
            raise UsageError(f"the {what} {value!r} has control characters", hint=USAGE)
    return Plan(guest, remote, local, to_guest=d is not None)


def parse_size(text: str) -> int:
    """Bytes from ``4G``, ``512M``, ``100k``, ``1.5GiB`` or a plain number (binary units).

    :raise UsageError: for anything else, or zero.
    """
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--max-size {text!r}: give a size such as 512M or 4G")
    value = float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2).lower() or " ")))
    if value < 1:
        raise UsageError(f"--max-size {text!r}: give a positive size")
    return int(value)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # not reached


def _name(path: str) -> str:
    """The last component of a path (trailing slashes ignored), or '' for ``/``, ``.``, ``..``."""
    base = posixpath.basename(path.rstrip("/"))
    return "" if base in (".", "..") else base


# --------------------------------------------------------------------------- guest → host

def _probe_remote(session: Remote, remote: str) -> tuple[bool, str]:
    """(is a directory, real path) of ``remote`` in the guest (links resolved, relative to root's home).

    :raise UsageError: when it does not exist. :raise GuestError: when the guest cannot tell.
    """
    q = shlex.quote(remote)
    res = session.run(f'p=$(readlink -e -- {q}) || exit 3; if [ -d "$p" ]; then echo d; else echo f; fi; '
                      f'printf %s "$p"', timeout=PROBE_TIMEOUT)
    if res.status == 3:
        raise UsageError(f"{session.ep.guest}:{remote}: no such file or directory in the guest")
    kind, sep, real = res.stdout.decode(errors="surrogateescape").partition("\n")
    if res.status != 0 or not sep or kind not in ("d", "f") or not real.startswith("/"):
        raise GuestError(f"guest {session.ep.guest} could not say what {remote!r} is "
                         f"(status {res.status}): {res.stderr.decode(errors='replace').strip()[-500:]}")
    return kind == "d", real


def _host_target(local: str, remote: str, real: str) -> tuple[Path, str]:
    """(checked parent directory, name) of where the copy of ``remote`` goes on the host:
    into ``local`` when it is a directory, else ``local`` itself.

    :raise UsageError: when the parent is missing or the target exists. :raise UnsafePath: when
        the parent is not safe to write into (another user's, or writable by others).
    """
    if os.path.isdir(local):
        parent, name = paths.checked_dir(local), _name(remote) or _name(real)
    else:
        where = os.path.dirname(os.path.abspath(local))
        if not os.path.isdir(where):
            raise UsageError(f"{local}: no such directory {where}")
        parent, name = paths.checked_dir(where), _name(local)
    if not name or safe_parts(name) != (name,):
        raise UsageError(f"cannot name the copy of {remote!r} on the host: give DEST as a new path")
    target = parent / name
    if os.path.lexists(target):
        raise UsageError(f"{target} exists: labctl cp never overwrites on the host",
                         hint="remove it, or give a new DEST")
    return parent, name


def stream_limit(budget: int) -> int:
    """The most bytes of tar stream read from a guest for a file budget of ``budget``: the
    files, and as much again plus 64 MiB for headers, padding and skipped entries."""
    return 2 * budget + (64 << 20)


class _Counted:
    """A binary stream that reports how much has been read through it, and stops at ``limit``
    (a guest that sends without end fails the copy instead of keeping labctl reading)."""

    def __init__(self, f: IO[bytes], progress: Progress | None, limit: int | None = None) -> None:
        self.f, self.progress, self.count, self.limit = f, progress, 0, limit

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.count += len(data)
        if self.limit is not None and self.count > self.limit:
            raise GuestError(f"the guest sent more than {human(self.limit)} for a copy budget of "
                             f"{human((self.limit - (64 << 20)) // 2)}: nothing was copied",
                             hint="raise --max-size, or copy a smaller part")
        if self.progress is not None and data:
            self.progress(len(data))
        return data


def _walk_counts(root: Path) -> tuple[int, int]:
    """(regular files, bytes) under ``root`` (or ``root`` itself), following no link."""
    st = os.lstat(root)
    if stat.S_ISREG(st.st_mode):
        return 1, st.st_size
    files = size = 0
    for d, _dirs, names in os.walk(root, followlinks=False):
        for n in names:
            s = os.lstat(os.path.join(d, n))
            if stat.S_ISREG(s.st_mode):
                files, size = files + 1, size + s.st_size
    return files, size


def from_guest(session: Remote, remote: str, local: str, budget: int = DEFAULT_MAX_SIZE,
               timeout: float = DEFAULT_TIMEOUT, progress: Progress | None = None) -> Copied:
    """Copy ``remote`` (a file or directory of the guest) to ``local`` on the host, by the rules above.

    :raise UsageError: for a missing path or an existing target. :raise UnsafePath: for an unsafe
        destination directory. :raise GuestError: when the guest fails to send it.
    """
    _is_dir, real = _probe_remote(session, remote)
    if real == "/":
        raise UsageError("refusing to copy the guest's whole root file system", hint="copy a directory below /")
    parent, name = _host_target(local, remote, real)
    top = posixpath.basename(real)
    # GNU tar's status 1 is "some files changed as they were read": the copy stands.
    command = (f"cd -- {shlex.quote(posixpath.dirname(real))} && "
               f"{{ tar -cf - -- {shlex.quote(top)}; s=$?; [ $s -eq 1 ] && s=0; exit $s; }}")
    staging = Path(tempfile.mkdtemp(prefix=".labctl-cp-", dir=parent))
    copied = Copied(target=str(parent / name))
    try:
        try:
            with session.stream(command, timeout=timeout) as f:
                counted = _Counted(f, progress, stream_limit(budget))
                got = extract(counted, staging, budget)  # type: ignore[arg-type]
                while counted.read(1 << 16):  # what follows the archive's end, up to the limit
                    pass
        except tarfile.TarError as exc:
            raise GuestError(f"guest {session.ep.guest} did not send a tar stream: {exc}") from exc
        except OSError as exc:
            raise HostError(f"cannot write into {parent}: {exc.strerror or exc}") from exc
        for item in got.skipped:
            what, _sep, why = item.rpartition(": ")
            copied.skipped.append((what.strip("'\"") or item, why or "skipped"))
        for entry in sorted(os.listdir(staging)):
            if entry != top:
                copied.skipped.append((entry, "not under the path asked for (removed)"))
        src = staging / top
        try:
            st = os.lstat(src)
        except FileNotFoundError:
            copied.target = ""
            if not copied.skipped:
                copied.skipped.append((top, "the guest sent nothing"))
            return copied
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):  # never made by extract
            raise GuestError(f"guest {session.ep.guest} sent {top!r} as something other than a file or directory")
        if os.path.lexists(parent / name):
            raise UsageError(f"{parent / name} appeared while copying: nothing replaced it")
        os.rename(src, parent / name)
        copied.files, copied.bytes = _walk_counts(parent / name)
        return copied
    finally:
        paths.remove_tree(parent, staging.name)


# --------------------------------------------------------------------------- host → guest

@dataclass
class _Entry:
    path: str  # on the host
    arcname: str  # in the stream


def _walk_local(src: str, arcname: str, copied: Copied) -> tuple[list[_Entry], int]:
    """Everything under ``src`` that goes into the stream (directories, regular files, links
    as links), and the bytes of its regular files; what cannot go is noted in ``copied``.

    :raise UsageError: when ``src`` does not exist or is not a file or directory.
    """
    try:
        st = os.stat(src)  # SRC itself may be a link: the user named it
    except OSError as exc:
        raise UsageError(f"{src}: {exc.strerror or exc}") from exc
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise UsageError(f"{src} is neither a file nor a directory")
    entries = [_Entry(src, arcname)]
    total = st.st_size if stat.S_ISREG(st.st_mode) else 0
    if stat.S_ISREG(st.st_mode):
        return entries, total
    stack = [(src, arcname)]
    while stack:
        d, a = stack.pop()
        try:
            names = sorted(os.listdir(d))
        except OSError as exc:
            copied.skipped.append((a, f"cannot be listed: {exc.strerror or exc}"))
            continue
        for n in names:
            p, an = os.path.join(d, n), f"{a}/{n}"
            try:
                s = os.lstat(p)
            except OSError as exc:
                copied.skipped.append((an, exc.strerror or str(exc)))
                continue
            if _CONTROL.search(n):
                copied.skipped.append((an, "a name with control characters"))
            elif stat.S_ISDIR(s.st_mode):
                entries.append(_Entry(p, an))
                stack.append((p, an))
            elif stat.S_ISREG(s.st_mode):
                entries.append(_Entry(p, an))
                total += s.st_size
            elif stat.S_ISLNK(s.st_mode):
                entries.append(_Entry(p, an))
            else:
                kind = ("a FIFO" if stat.S_ISFIFO(s.st_mode) else "a socket" if stat.S_ISSOCK(s.st_mode)
                        else "a device file")
                copied.skipped.append((an, kind))
    return entries, total


def _probe_guest_dest(session: Remote, remote: str) -> str:
    """``d`` (a directory), ``f`` (exists, not a directory), ``p`` (missing, its parent a
    directory) or ``n`` (no such parent) for ``remote`` in the guest."""
    q = shlex.quote(remote)
    parent = shlex.quote(posixpath.dirname(remote.rstrip("/")) or ("/" if remote.startswith("/") else "."))
    res = session.run(f"if [ -d {q} ]; then echo d; elif [ -e {q} ] || [ -L {q} ]; then echo f; "
                      f"elif [ -d {parent} ]; then echo p; else echo n; fi", timeout=PROBE_TIMEOUT)
    kind = res.stdout.decode(errors="replace").strip()
    if res.status != 0 or kind not in ("d", "f", "p", "n"):
        raise GuestError(f"guest {session.ep.guest} could not say what {remote!r} is (status {res.status})")
    return kind


class _Sent:
    """A writable stream that reports how much has been written through it."""

    def __init__(self, f: IO[bytes], progress: Progress | None) -> None:
        self.f, self.progress = f, progress

    def write(self, data: bytes) -> int:
        n = self.f.write(data)
        if self.progress is not None and data:
            self.progress(len(data))
        return n if n is not None else len(data)


def local_size(src: str) -> int:
    """The bytes of regular files ``to_guest`` would send from ``src`` (for a progress display)."""
    return _walk_local(src, "x", Copied())[1]


def to_guest(session: Remote, local: str, remote: str, budget: int = DEFAULT_MAX_SIZE,
             timeout: float = DEFAULT_TIMEOUT, progress: Progress | None = None) -> Copied:
    """Copy ``local`` (a file or directory of the host) to ``remote`` in the guest: into it when
    it is a directory, else as it (its parent must exist).

    :raise UsageError: for a missing SRC or guest directory, or SRC over ``budget``.
    :raise GuestError: when the guest fails to take it in.
    """
    kind = _probe_guest_dest(session, remote)
    name = _name(local) or _name(os.path.realpath(local))
    copied = Copied()
    entries, total = _walk_local(local, name or "x", copied)
    src_is_dir = os.path.isdir(local)
    if kind == "d":
        dest_dir, arcname = remote, name
    elif kind == "f" and src_is_dir:
        raise UsageError(f"{session.ep.guest}:{remote} exists and is not a directory")
    elif kind in ("f", "p"):
        dest_dir = posixpath.dirname(remote.rstrip("/")) or ("/" if remote.startswith("/") else ".")
        arcname = _name(remote)
    else:
        raise UsageError(f"{session.ep.guest}:{remote}: no such directory in the guest "
                         f"({posixpath.dirname(remote.rstrip('/'))})")
    if not arcname:
        raise UsageError(f"cannot name the copy of {local!r} in the guest: give GUEST:PATH as a new path")
    if total + HEADER * len(entries) > budget:
        raise UsageError(f"{local} holds {human(total)} in {len(entries)} entries, over the copy budget of "
                         f"{human(budget)} (512 bytes an entry besides its data)", hint="raise it with --max-size")
    old = entries[0].arcname
    for e in entries:
        e.arcname = arcname + e.arcname[len(old):]
    copied.target = posixpath.join(dest_dir, arcname)
    command = f"tar -x --no-same-owner --no-overwrite-dir -C {shlex.quote(dest_dir)} -f -"
    with session.feed(command, timeout=timeout) as w:
        sent = cast("IO[bytes]", _Sent(w, progress))
        with tarfile.open(fileobj=sent, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for i, e in enumerate(entries):
                _add(tar, e, copied, follow=i == 0)
    return copied


def _add(tar: tarfile.TarFile, e: _Entry, copied: Copied, follow: bool) -> None:
    """One entry into the stream: a directory or a link as itself, a regular file with its bytes,
    opened without following a link (and re-checked: it must still be the file that was listed)."""
    if follow:  # SRC itself: what it names, link or not
        info = tar.gettarinfo(os.path.realpath(e.path), arcname=e.arcname)
    else:
        info = tar.gettarinfo(e.path, arcname=e.arcname)
    info.uname = info.gname = ""
    info.uid = info.gid = 0
    if not info.isreg() or info.islnk():
        tar.addfile(info)
        if info.isreg() or info.islnk():
            copied.files += 1
        return
    path = os.path.realpath(e.path) if follow else e.path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        copied.skipped.append((e.arcname, f"cannot be read: {exc.strerror or exc}"))
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            copied.skipped.append((e.arcname, "no longer a regular file"))
            return
        try:
            tar.addfile(info, f)
        except OSError as exc:  # shorter than when it was listed: the stream cannot go on
            raise LabctlError(f"{path} changed while it was copied ({exc}); the guest may hold part of it",
                              hint="copy it again") from exc
    copied.files += 1
    copied.bytes += info.size
