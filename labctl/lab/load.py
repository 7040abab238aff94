"""Loading lab files: read, parse, validate, resolve.

Both entry points return a fully resolved :class:`~labctl.lab.model.Lab` or
raise one :class:`~labctl.errors.LabFileError` listing every problem found,
sorted by line.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from labctl.errors import LabFileError, Problem
from labctl.lab.model import Lab
from labctl.lab.trust import env_trusted
from labctl.lab.validate import build_lab
from labctl.lab.yamlpos import parse_yaml

__all__ = ["MAX_BYTES", "load_lab", "load_lab_text"]

MAX_BYTES = 1 << 20
"""The largest lab file labctl reads (the bundled ones are a few KiB)."""


def load_lab(path: str | Path, trusted: Iterable[str | Path] = (), *, remote: str | None = None,
             remote_root: Path | None = None) -> Lab:
    """Load the lab file at ``path``.

    ``trusted``: directories the user trusts (``--trust-dir``; ``$LABCTL_TRUSTED_DIRS`` too)
    although another user could change them: a kernel path the lab names under one
    of them is used (see :mod:`labctl.lab.trust`).

    Problems name the file as given (``str(path)``).  Raises LabFileError
    (all problems, by line) if the file is missing, unreadable, not a
    regular file, over :data:`MAX_BYTES`, not UTF-8, not valid YAML or not a
    valid lab.  ``Lab.sha256`` is the digest of the
    file's bytes.
    """
    source = str(path)
    try:
        data, owner = _read_limited(Path(path))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise LabFileError([Problem(source, 1, "", f"cannot read lab file: {reason}")]) from None
    except ValueError as exc:
        raise LabFileError([Problem(source, 1, "", str(exc))]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        message = f"lab file is not valid UTF-8 (byte 0x{data[exc.start]:02x})"
        raise LabFileError([Problem(source, line, "", message)]) from None
    return _load(text, source, hashlib.sha256(data).hexdigest(), trusted, owner, remote, remote_root)


def _read_limited(path: Path) -> tuple[bytes, int]:
    """The bytes of a lab file (a regular file of at most MAX_BYTES) and the uid that owns it.

    Opened without blocking (a FIFO would hang) and checked before reading.

    :raise ValueError: for a FIFO, a device, a directory or a file too large.
    :raise OSError: when it cannot be read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("cannot read lab file: not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"lab file is larger than {MAX_BYTES // 1024} KiB")
    return data, st.st_uid


def load_lab_text(text: str, filename: str, trusted: Iterable[str | Path] = (), *, remote: str | None = None) -> Lab:
    """Load a lab from ``text``; ``filename`` is used in problems and as ``Lab.source``.
    ``remote``: the URL or pack it came from (it then names no host path, refused before read).

    Raises LabFileError (all problems, by line) if it is not a valid lab.
    ``Lab.sha256`` is the digest of the UTF-8 encoded text.
    """
    return _load(text, filename, hashlib.sha256(text.encode("utf-8")).hexdigest(), trusted, remote=remote)


def _load(text: str, source: str, sha256: str, trusted: Iterable[str | Path] = (), owner: int | None = None,
          remote: str | None = None, remote_root: Path | None = None) -> Lab:
    """Parse and validate ``text`` (of a file ``owner`` owns); raise LabFileError with every problem, by line."""
    data, problems = parse_yaml(text, source)
    if problems and data is None:
        raise LabFileError(sorted(problems, key=lambda p: p.line))
    trust = (*(Path(t).absolute() for t in trusted), *env_trusted())
    lab, more = build_lab(data, source=source, text=text, sha256=sha256, trusted=trust, owner=owner,
                           remote=remote, remote_root=remote_root)
    # A value YAML could not construct (bad tag) reads as null: don't report it twice.
    reported = {(p.line, p.path) for p in problems if p.path}
    more = [p for p in more if (p.line, p.path) not in reported]
    problems = sorted(problems + more, key=lambda p: p.line)
    if problems or lab is None:
        raise LabFileError(problems)
    return lab
