"""The worktree labctl builds each candidate commit in, and the per-commit build cache.

``<work>/wt`` is a ``git worktree`` of the user's repository (detached: no branch of the
user's moves, their checkout and files are never touched). It is seeded once with a copy of
the user's tree *with its build objects and their times*, then moved to each commit with
``git checkout``, which rewrites only the files that differ: ``make`` then rebuilds only what
those commits changed. The tree's ``.config`` is copied in and ``make olddefconfig`` run at
every commit. The build runs with git hidden from the kernel's ``setlocalversion``, so the
release does not change from one commit to the next (which would relink every module).

``<work>/builds.json`` maps ``commit:config-hash`` to the prepared kernel's directory in
labctl's kernel store, so a commit built once (by an earlier or an interrupted bisection) is
never built again while that kernel is prepared. An entry naming anything but a real
directory of that store is ignored.

``<work>`` must be the user's (or root's) and writable by nobody else (:func:`checked_work`),
checked before labctl reads ``wt.ready`` or ``builds.json`` there or deletes ``wt``: another
user's "prepared kernel" is never booted, their Makefile never run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from labctl.bisect.search import git
from labctl.errors import LabctlError
from labctl.kernel import kernels_root
from labctl.paths import alone, atomic_write, cache_dir, checked_dir
from labctl.proc import run, run_lines

WORKTREE = "wt"
READY = "wt.ready"  # written once the worktree's copy is complete (a copy stopped half-way is made again)
BUILDS = "builds.json"
LOCK = "lock"
LOG_TAIL = 40
FAILED = "failed: "  # a build cache entry for a commit that does not build
COPY_TIMEOUT = 3600.0  # the first copy of the user's tree and its build objects
OBJTOOL_TIMEOUT = 1800.0
BUILD_TIMEOUT = 6 * 3600.0  # one make: a commit that touches a common header rebuilds most of the kernel
# kbuild's line when objtool is linked again: every object of the kernel depends on objtool's time
# (scripts/Makefile.build, gen_objtooldep), so the build that follows recompiles them all
_OBJTOOL_LINK = re.compile(r"^\s*LINK\s+\S*tools/objtool/objtool\s*$")
OBJTOOL_NOTE = ("objtool was rebuilt (its sources or headers differ from the build's): every object of the kernel "
                "depends on it, so this build recompiles nearly all of them (minutes, not seconds)")


def objtool_relinked(line: str) -> bool:
    """``line`` of make's output says objtool was linked again (a full kernel build follows)."""
    return bool(_OBJTOOL_LINK.match(line))


def checked_work(work: Path) -> Path:
    """``work`` (made when missing, 0700) once every component is the user's or root's and
    writable by nobody else (:func:`labctl.paths.checked_dir`); its real path.

    :raise UnsafePath: naming the component at fault.
    """
    return checked_dir(work, create=True)


def default_work(tree: Path) -> Path:
    """Where the worktree and build cache of ``tree``'s bisections live (kept between them)."""
    digest = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "bisect" / digest


@contextlib.contextmanager
def locked(work: Path) -> Iterator[None]:
    """One bisection at a time in a worktree.

    :raise LabctlError: when another holds it.
    """
    with alone(work / LOCK, LabctlError(f"another labctl bisect is using {work}",
                                        hint="wait for it, or give this one another --work DIR")):
        yield


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    seconds: float
    reason: str = ""  # why it failed: the first error line of make
    log: str = ""  # the tail of make's output


def hash_bytes(config: bytes) -> str:
    return hashlib.sha256(config).hexdigest()[:16]


def config_hash(tree: Path) -> str:
    return hash_bytes((tree / ".config").read_bytes())


class Worktree:
    """The bisection's worktree of ``tree`` in ``work``."""

    def __init__(self, tree: Path, work: Path) -> None:
        self.tree = tree.resolve()
        self.work = work
        self.path = work / WORKTREE

    def ready(self) -> bool:
        return (self.work / READY).is_file() and (self.path / ".git").is_file()

    def ensure(self, rev: str, say: Callable[[str], None] = lambda _: None) -> None:
        """Make the worktree (first use: a copy of the tree with its objects), at ``rev``."""
        if self.ready():
            return
        (self.work / READY).unlink(missing_ok=True)
        if self.path.exists():
            shutil.rmtree(self.path)
        with contextlib.suppress(LabctlError):
            git(self.tree, "worktree", "prune")
        say(f"making the worktree {self.path} (a copy of {self.tree} with its build objects; once)")
        t0 = time.monotonic()
        git(self.tree, "worktree", "add", "--detach", "--no-checkout", str(self.path), rev)
        # the user's files and build objects with their times to the nanosecond (make compares them)
        names = [str(self.tree / n) for n in os.listdir(self.tree) if n != ".git"]
        res = run(["cp", "-a", "--reflink=auto", "--", *names, str(self.path)], COPY_TIMEOUT, check=False)
        if res.returncode != 0:
            raise LabctlError(f"copying {self.tree} into {self.path} failed: "
                              f"{res.stderr.decode(errors='replace').strip()[-300:]}")
        git(self.path, "read-tree", rev)
        run(["git", "-C", str(self.path), "update-index", "-q", "--refresh"], 600, check=False)
        git(self.path, "checkout", "-q", "-f", "--detach", rev)
        self._objtool()
        atomic_write(self.work / READY, f"{self.tree}\n")
        say(f"worktree ready in {time.monotonic() - t0:.0f} s")

    def _objtool(self) -> None:
        """objtool's build records absolute paths, so in the copy it would be rebuilt, and with it
        every object of the kernel (each depends on objtool's time). Rebuild it here once and give
        everything of it the time the tree's objtool had: the copy's objects stay up to date."""
        ref = self.tree / "tools" / "objtool" / "objtool"
        if not ref.is_file():
            return
        try:
            res = run(["make", "-C", str(self.path), "tools/objtool"], OBJTOOL_TIMEOUT, env=self._env(), check=False)
        except LabctlError:
            return  # the first build rebuilds everything then; slow, not wrong
        if res.returncode != 0:
            return  # the first build rebuilds everything then; slow, not wrong
        st = ref.stat()
        for root, _dirs, files in os.walk(self.path / "tools" / "objtool"):
            for f in files:
                with contextlib.suppress(OSError):
                    os.utime(os.path.join(root, f), ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)

    def _env(self) -> dict[str, str]:
        # git hidden from scripts/setlocalversion: the release stays the tree's at every commit
        return {**os.environ, "GIT_DIR": str(self.work / "no-git"), "GIT_CEILING_DIRECTORIES": str(self.work)}

    def checkout(self, rev: str) -> None:
        git(self.path, "checkout", "-q", "-f", "--detach", rev)

    def revert(self, rev: str) -> str:
        """``git revert --no-commit REV`` on what is checked out: "" when it applied, else git's words (and the
        worktree back as it was)."""
        res = run(["git", "-C", str(self.path), "revert", "--no-commit", rev], 600, check=False)
        if res.returncode == 0:
            return ""
        words = " ".join((res.stderr or res.stdout).decode(errors="replace").split())
        with contextlib.suppress(LabctlError):
            git(self.path, "revert", "--abort")
        with contextlib.suppress(LabctlError):
            git(self.path, "checkout", "-q", "-f", "--detach", "HEAD")
        return words[:300] or f"git revert exited {res.returncode}"

    def _put_config(self, config: bytes | None) -> None:
        """The worktree's ``.config``: ``config``, else the tree's; written only when it differs (its time
        is make's: an unchanged one rebuilds nothing)."""
        dst = self.path / ".config"
        if config is None:
            cfg = self.tree / ".config"
            if not dst.is_file() or dst.read_bytes() != cfg.read_bytes():
                shutil.copy2(cfg, dst)
        elif not dst.is_file() or dst.read_bytes() != config:
            atomic_write(dst, config)

    def olddefconfig(self, config: bytes) -> bytes:
        """``config`` as ``make olddefconfig`` leaves it at the commit checked out (what a build of it gets).

        :raise LabctlError: when olddefconfig fails (its last words).
        """
        self._put_config(config)
        res = run(["make", "-C", str(self.path), "olddefconfig"], OBJTOOL_TIMEOUT, env=self._env(), check=False)
        if res.returncode != 0:
            words = (res.stderr or res.stdout).decode(errors="replace").strip()[-300:]
            raise LabctlError(f"make olddefconfig failed in {self.path}: {words}")
        return (self.path / ".config").read_bytes()

    def build(self, jobs: int, on_line: Callable[[str], None] = lambda _: None,
              config: bytes | None = None) -> BuildResult:
        """``olddefconfig`` with ``config`` (default: the tree's ``.config``), then ``make vmlinux modules``."""
        t0 = time.monotonic()
        self._put_config(config)
        env = self._env()
        lines: list[str] = []

        def line(text: str) -> None:
            lines.append(text)
            if len(lines) > 4000:
                del lines[:2000]
            on_line(text)

        for target in (["olddefconfig"], [f"-j{jobs}", "vmlinux", "modules"]):
            # make and its compilers in a session of their own, stopped as one group on Ctrl-C (labctl.proc)
            try:
                rc = run_lines(["make", "-C", str(self.path), *target], line, BUILD_TIMEOUT, env=env)
            except LabctlError as exc:  # timed out
                return BuildResult(False, time.monotonic() - t0, exc.message[:300], "\n".join(lines[-LOG_TAIL:]))
            if rc != 0:
                errors = [ln for ln in lines if ": error:" in ln or "Error " in ln]
                reason = (errors[0] if errors else f"make {' '.join(target)} exited {rc}").strip()
                return BuildResult(False, time.monotonic() - t0, reason[:300], "\n".join(lines[-LOG_TAIL:]))
        return BuildResult(True, time.monotonic() - t0, "", "\n".join(lines[-LOG_TAIL:]))


class BuildCache:
    """commit (and .config) -> the prepared kernel's directory."""

    def __init__(self, work: Path) -> None:
        self.path = work / BUILDS

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def get(self, commit: str, cfg: str) -> Path | None:
        """The kernel built for ``commit``: a real directory (no link) of labctl's kernel store
        with a manifest, else None."""
        d = self._read().get(f"{commit}:{cfg}")
        if not d or d.startswith(FAILED):
            return None
        root = kernels_root()
        path = root / Path(d).name
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if os.path.realpath(d) != os.path.realpath(path) or not stat.S_ISDIR(st.st_mode) \
                or st.st_uid not in (os.geteuid(), 0):
            return None
        return path if (path / "manifest.json").is_file() else None

    def failure(self, commit: str, cfg: str) -> str | None:
        """Why the commit did not build, when it was tried before."""
        d = self._read().get(f"{commit}:{cfg}")
        return d[len(FAILED):] if d and d.startswith(FAILED) else None

    def put_failure(self, commit: str, cfg: str, reason: str) -> None:
        data = self._read()
        data[f"{commit}:{cfg}"] = FAILED + reason
        atomic_write(self.path, json.dumps(data, indent=1) + "\n")

    def put(self, commit: str, cfg: str, kernel_dir: Path) -> None:
        data = self._read()
        data[f"{commit}:{cfg}"] = str(kernel_dir)
        atomic_write(self.path, json.dumps(data, indent=1) + "\n")
