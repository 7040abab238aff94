"""The suite's own cache and state, beside the user's.

A test run never reads or writes the invoking user's labctl state (``/run/labctl`` for root)
or cache (``~/.cache/labctl``): :func:`isolate` points ``LABCTL_CACHE_DIR`` at the suite's
own cache (``$LABCTL_TEST_CACHE``, else ``~/.cache/labctl-test``), ``LABCTL_STATE_DIR`` and
the XDG directories at directories of this run, before any test starts. Every labctl a test
starts inherits them (``Cli`` gives each test a state directory of its own on top).

The suite's cache is seeded from the user's: each complete built image and prepared kernel,
and each downloaded package, is hard-linked in (a directory entry of the suite's own over the
same file: the suite may remove or replace its entry, the user's stays; labctl never writes
an image or a kernel file in place). So a machine pays the image and the default kernel once,
in ``setup.sh``. What the suite makes itself (the test kernel tree, post-boot snapshots,
kernels of bisection steps, downloads of other Debian kernels) stays in its cache; a user's
``labctl up``, ``prune`` or ``down`` during a run and the run's own clean-up never meet.

A nested run (a test that runs pytest) and each pytest-xdist worker find the variables already
set and keep them, with a state directory of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUITE_CACHE_ENV = "LABCTL_TEST_CACHE"
#: Set in the environment of an isolated run (and so of every nested one): the user's cache it was seeded from.
USER_CACHE_ENV = "LABCTL_TEST_USER_CACHE"
#: The outermost run's own directory, shared by its pytest-xdist workers (their locks).
SHARED_ENV = "LABCTL_TEST_SHARED"
XDG = ("XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")
#: Host facts labctl probes once and keeps in its cache (copied, not linked: small and rewritten).
HOST_FACTS = ("accel-probe.json", "host-tsc.json")


@dataclass(frozen=True)
class Isolation:
    user_cache: Path
    suite_cache: Path
    run_dir: Path  # this run's state and XDG directories; removed at its end


def _complete(directory: Path) -> bool:
    return (directory / "manifest.json").is_file() and not directory.name.startswith(".")


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` as a tree of hard links to ``src``'s files, made beside it and renamed into place."""
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".seed-{dst.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    res = subprocess.run(["cp", "-al", str(src), str(tmp)], capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0:  # another file system: the suite builds or prepares its own
        shutil.rmtree(tmp, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        tmp.rename(dst)
    shutil.rmtree(tmp, ignore_errors=True)


def seed(user: Path, suite: Path) -> None:
    """Link the user's complete images, prepared kernels and downloads into the suite's cache."""
    for image in sorted(user.glob("images/*/*")):
        if image.is_dir() and _complete(image):
            _link_tree(image, suite / "images" / image.parent.name / image.name)
    for kernel in sorted(user.glob("kernels/*")):
        if kernel.is_dir() and not kernel.is_symlink() and _complete(kernel):
            _link_tree(kernel, suite / "kernels" / kernel.name)
    downloads = suite / "downloads"
    for f in sorted(user.glob("downloads/*")):
        if f.is_file() and not f.is_symlink() and not f.name.startswith(".") and not (downloads / f.name).exists():
            downloads.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                os.link(f, downloads / f.name)
    for name in HOST_FACTS:
        with contextlib.suppress(OSError):
            if (user / name).is_file() and not (suite / name).exists():
                json.loads((user / name).read_text())  # only a whole one
                shutil.copy(user / name, suite / name)


def isolate() -> Isolation:
    """Point this process's (and so every child's) labctl directories at the suite's own.

    Also lets every child keep its compiled bytecode: with ``PYTHONDONTWRITEBYTECODE`` set (some
    shells and CI runners set it) each of the suite's thousand ``labctl`` commands would compile
    labctl anew, 0.2 s of CPU each.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if os.environ.get(USER_CACHE_ENV):  # a nested run: the outer run isolated it already
        run_dir = Path(tempfile.mkdtemp(prefix="labctl-tests-"))
        os.environ["LABCTL_STATE_DIR"] = str(run_dir / "state")
        return Isolation(Path(os.environ[USER_CACHE_ENV]), Path(os.environ["LABCTL_CACHE_DIR"]), run_dir)
    from labctl.paths import cache_dir

    user = cache_dir()  # with the user's own environment, before it changes below
    suite = Path(os.environ.get(SUITE_CACHE_ENV) or Path.home() / ".cache" / "labctl-test")
    suite.mkdir(parents=True, exist_ok=True, mode=0o700)
    if suite.resolve() != user.resolve():
        seed(user, suite)
    run_dir = Path(tempfile.mkdtemp(prefix="labctl-tests-"))
    os.environ[SHARED_ENV] = str(run_dir)
    os.environ[USER_CACHE_ENV] = str(user)
    os.environ["LABCTL_CACHE_DIR"] = str(suite)
    os.environ["LABCTL_STATE_DIR"] = str(run_dir / "state")
    for var in XDG:
        os.environ[var] = str(run_dir / var.lower())
    os.environ.pop("XDG_RUNTIME_DIR", None)
    return Isolation(user, suite, run_dir)


def finish(iso: Isolation) -> None:
    shutil.rmtree(iso.run_dir, ignore_errors=True)
