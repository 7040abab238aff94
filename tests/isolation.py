"""The suite's own cache and state, beside the user's and beside another run of the suite.

A test run never reads or writes the invoking user's labctl state (``/run/labctl`` for root)
or cache (``~/.cache/labctl``), and two runs side by side (two checkouts, a nested run) never
touch each other's labs or snapshots. :func:`isolate` points, before any test starts:

* ``LABCTL_CACHE_DIR`` at a cache of this run's own (``RUN/cache``), seeded from the suite's
  store (``$LABCTL_TEST_CACHE``, else ``~/.cache/labctl-test``), which is itself seeded from the
  user's cache: each complete built image, prepared kernel, download and selftest build is
  hard-linked in (a directory entry of the run's own over the same file: the run may remove or
  replace its entry, the store's and the user's stay; labctl never writes an image or a kernel
  file in place). So a machine pays the image and the default kernel once, in ``setup.sh``;
* ``LABCTL_STATE_DIR`` and the XDG directories at directories of this run.

What a run makes that a later run can use again (Debian kernels it prepared, packages it
downloaded, selftests it built, images) is linked back into the store at its end (:func:`finish`);
the rest (post-boot snapshots, kernels of trees and bisection steps, module builds) goes with
the run's directory. The suite's test kernel tree is built in the store
(``scripts/test-kernel.sh``, given ``$LABCTL_TEST_CACHE``).

pytest-xdist's workers share their controller's cache (a guest one worker booted starts warm in
the other) with a state directory each. A nested run (a test that runs pytest) is a run of its
own: its cache is seeded from the outer run's.
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
#: The outermost run's own directory, shared by its pytest-xdist workers (their locks).
SHARED_ENV = "LABCTL_TEST_SHARED"
XDG = ("XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")
#: Host facts labctl probes once and keeps in its cache (copied, not linked: small and rewritten).
HOST_FACTS = ("accel-probe.json", "host-tsc.json")
#: What a later run can use again: linked into a run's cache, and back into the store at its end.
KEPT = ("images", "kernels", "downloads", "kselftest", "oops", "decode_stacktrace")


@dataclass(frozen=True)
class Isolation:
    store: Path  # the suite's cache across runs
    cache: Path  # this run's cache
    run_dir: Path  # this run's state, cache and XDG directories; removed at its end
    owner: bool  # this process made run_dir (not a pytest-xdist worker of another's)


def _complete(directory: Path, top: str) -> bool:
    """An entry worth keeping: whole (images and kernels have their manifest last) and, for a
    kernel, one a later run asks for again (Debian's; a tree's build is never the same twice)."""
    if directory.name.startswith(".") or directory.is_symlink():
        return False
    if top not in ("images", "kernels"):
        return True
    if top == "images":
        return directory.is_dir() and (directory / "manifest.json").is_file()
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and (manifest.get("source") or {}).get("kind") == "debian"


def _link(src: Path, dst: Path) -> None:
    """``dst`` as hard links to ``src`` (a file or a tree), made beside it and renamed into place."""
    if dst.exists() or dst.is_symlink():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".seed-{dst.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    res = subprocess.run(["cp", "-al", str(src), str(tmp)], capture_output=True, text=True, timeout=600,
                         check=False)
    if res.returncode != 0:  # another file system: the run builds or prepares its own
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return
    with contextlib.suppress(OSError):
        tmp.rename(dst)
    shutil.rmtree(tmp, ignore_errors=True)


def seed(src: Path, dst: Path) -> None:
    """Link every complete image, Debian kernel, download and build of ``src`` into ``dst``."""
    for top in KEPT:
        entries = src.glob(f"{top}/*/*") if top == "images" else src.glob(f"{top}/*")
        for entry in sorted(entries):
            if _complete(entry, top):
                _link(entry, dst / entry.relative_to(src))
    for name in HOST_FACTS:
        with contextlib.suppress(OSError, ValueError):
            if (src / name).is_file() and not (dst / name).exists():
                json.loads((src / name).read_text())  # only a whole one
                dst.mkdir(parents=True, exist_ok=True)
                shutil.copy(src / name, dst / name)


def isolate(worker: bool = False) -> Isolation:
    """Point this process's (and so every child's) labctl directories at the run's own
    (``worker``: this is a pytest-xdist worker of a run that did).

    Also lets every child keep its compiled bytecode: with ``PYTHONDONTWRITEBYTECODE`` set (some
    shells and CI runners set it) each of the suite's thousand ``labctl`` commands would compile
    labctl anew, 0.2 s of CPU each.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if worker:
        # A worker: its controller's cache, a state directory of its own.
        run_dir = Path(tempfile.mkdtemp(prefix="labctl-tests-w-"))
        os.environ["LABCTL_STATE_DIR"] = str(run_dir / "state")
        return Isolation(Path(os.environ[SUITE_CACHE_ENV]), Path(os.environ["LABCTL_CACHE_DIR"]), run_dir, False)
    from labctl.paths import cache_dir

    user = cache_dir()  # with the environment this run was started in, before it changes below
    store = Path(os.environ.get(SUITE_CACHE_ENV) or Path.home() / ".cache" / "labctl-test")
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    if user.resolve() != store.resolve():
        seed(user, store)
    run_dir = Path(tempfile.mkdtemp(prefix="labctl-tests-"))
    cache = run_dir / "cache"
    cache.mkdir(mode=0o700)
    seed(store, cache)
    os.environ[SHARED_ENV] = str(run_dir)
    os.environ[SUITE_CACHE_ENV] = str(store)
    os.environ["LABCTL_CACHE_DIR"] = str(cache)
    os.environ["LABCTL_STATE_DIR"] = str(run_dir / "state")
    for var in XDG:
        os.environ[var] = str(run_dir / var.lower())
    os.environ.pop("XDG_RUNTIME_DIR", None)
    return Isolation(store, cache, run_dir, True)


def finish(iso: Isolation) -> None:
    """What a later run can use again into the store; then the run's directory goes."""
    if iso.owner:
        with contextlib.suppress(OSError):
            seed(iso.cache, iso.store)
    shutil.rmtree(iso.run_dir, ignore_errors=True)
