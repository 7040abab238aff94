"""Where labctl keeps things: caches, lab state, resources shipped with it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def cache_dir() -> Path:
    """The user's labctl cache (images, downloads): $LABCTL_CACHE_DIR or XDG."""
    env = os.environ.get("LABCTL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "labctl"


def state_dir() -> Path:
    """Where per-lab run directories live.

    $LABCTL_STATE_DIR, else $XDG_RUNTIME_DIR/labctl, else /run/labctl for
    root, else ~/.local/state/labctl. Kept short: unix socket paths inside
    it must stay under 108 bytes.
    """
    env = os.environ.get("LABCTL_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "labctl"
    if os.geteuid() == 0:
        return Path("/run/labctl")
    return Path.home() / ".local" / "state" / "labctl"


def resource_dir(name: str) -> Path:
    """A top-level resource folder shipped with labctl (``images``, ``guest``).

    In a source checkout (or editable install) it is the repository's folder;
    in a wheel it is packaged under ``labctl/_data``.
    """
    for candidate in (_PACKAGE_DIR.parent / name, _PACKAGE_DIR / "_data" / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"labctl resource folder '{name}' is missing from this installation")


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it mode 0700."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half of it.

    The temporary file (``.NAME.PID.tmp`` beside it) is removed on failure.

    :raise OSError: when it cannot be written.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (made 0600, with its directory) for the block:
    another labctl doing the same work waits, then usually finds it done."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
