"""The search over a git history, as ``git bisect`` does it, from the verdicts in the state.

The candidates are the commits reachable from the newest *new* (bad) commit and from none of
the *old* (good) ones (``git rev-list NEW --not OLD...``). The next commit to try is git's own
midpoint (``git rev-list --bisect-all``: the best split first), the first one not skipped. When
the new end is the only candidate left it is the first new commit; when every other candidate
was skipped, the answer is "one of these".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labctl.errors import LabctlError, UsageError
from labctl.proc import run


def git(repo: Path | str, *args: str, timeout: float = 600) -> str:
    """``git -C repo ARGS``'s output.

    :raise LabctlError: when git fails (its message).
    """
    try:
        res = run(["git", "-C", str(repo), *args], timeout, check=False)
    except LabctlError as exc:  # not installed, or timed out
        raise LabctlError(f"git {' '.join(args)}: {exc.message}") from exc
    if res.returncode != 0:
        raise LabctlError(f"git {' '.join(args)} in {repo}: "
                          f"{(res.stderr or res.stdout).decode(errors='replace').strip()[-500:]}")
    return res.stdout.decode(errors="replace")


def resolve(repo: Path, rev: str) -> str:
    """The full sha of commit ``rev``.

    :raise UsageError: when ``repo`` is not a git repository or ``rev`` names no commit there.
    """
    if rev.startswith("-"):
        raise UsageError(f"'{rev}' is not a revision")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").strip()
    except LabctlError as exc:
        raise UsageError(f"'{rev}' names no commit in {repo}", hint="give a branch, tag or commit of the tree") from exc


def subject(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha).strip()


def diffstat(repo: Path, sha: str) -> str:
    """``git show --stat`` of the commit (its header, message and diffstat)."""
    return git(repo, "show", "--stat", "--format=commit %H%nAuthor: %an <%ae>%nDate:   %ad%n%n%w(0,4,4)%B", sha)


def is_ancestor(repo: Path, old: str, new: str) -> bool:
    return run(["git", "-C", str(repo), "merge-base", "--is-ancestor", old, new], 600, check=False).returncode == 0


@dataclass(frozen=True)
class Next:
    """What the search says now: a commit to try, or the end (``first``, or ``candidates``)."""

    commit: str | None = None  # the commit to try next
    first: str | None = None  # the first new commit, when known
    candidates: tuple[str, ...] = ()  # when only skipped commits and the new end are left: one of these
    remaining: int = 0  # candidates left (the new end included)
    steps_left: int = 0  # about how many more steps (log2)


def candidates(repo: Path, new: str, olds: list[str]) -> list[str]:
    """The commits the first new one can still be, newest first (the new end included)."""
    return git(repo, "rev-list", new, "--not", *olds).split()


def next_step(repo: Path, new: str, olds: list[str], skips: list[str]) -> Next:
    """The next commit to try, or the answer."""
    left = candidates(repo, new, olds)
    n = len(left)
    steps_left = max(0, (n - 1).bit_length())
    if n <= 1:
        return Next(first=new, remaining=n)
    skipped = set(skips)
    ranked = [line.split()[0] for line in git(repo, "rev-list", "--bisect-all", new, "--not", *olds).splitlines()
              if line.strip()]
    for sha in ranked:
        if sha != new and sha not in skipped:
            return Next(commit=sha, remaining=n, steps_left=steps_left)
    return Next(candidates=tuple(left), remaining=n)
