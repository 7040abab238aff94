"""A lab file or a packed file from a git repository, at a path, optionally at a revision::

    git+https://HOST/REPO.git#PATH          the default branch's head
    git+https://HOST/REPO.git@REV#PATH      a branch, a tag or a full commit id
    git+http://, git+ssh://[USER@]HOST/, git+file:///DIR, git://HOST/   the same, by git's other transports

(pip's form: the revision after the repository's ``@``, the file's path as the fragment.)

The commit is fetched alone (``git fetch --depth 1``) into a bare repository of labctl's cache,
``<cache>/git/<sha256 of the repository URL>/repo.git``, and its tree is written out once into
``trees/<commit>/`` beside it from ``git archive``: regular files only, none executable, no
symbolic link (a link would name a file of this host), nothing outside the tree. Git runs with no
prompt and only the URL's transport allowed (``GIT_ALLOW_PROTOCOL``); no hook, filter or program
of the repository ever runs (a fetch into a bare repository runs none, ``git archive`` neither).
The user's directories are never written. What was fetched is named by :meth:`Checkout.label`,
the same URL with the full commit id: it runs the same files again.

Errors (a bad URL, no path, an unknown revision or repository, a path not in the tree) are
:class:`~labctl.errors.UsageError` (exit 2) before anything starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO
from urllib.parse import urlsplit

from labctl.errors import LabFileError, UsageError
from labctl.lab import Lab, load_lab
from labctl.pack.cache import pin
from labctl.pack.fetch import check_foreign
from labctl.paths import build_into, cache_dir, exclusive
from labctl.proc import kill_group, run, start_piped

#: URL scheme -> git's name of its transport.
SCHEMES = {"git+https": "https", "git+http": "http", "git+ssh": "ssh", "git+file": "file", "git": "git"}
REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]{0,199}")
FULL_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
MAX_TREE_BYTES = 8 << 30
FETCH_TIMEOUT_S = 1800
CHUNK = 1 << 20


def is_git_url(text: str) -> bool:
    return urlsplit(text).scheme in SCHEMES


@dataclass(frozen=True)
class GitSource:
    """A git URL taken apart: the repository as git is given it, the revision, the file's path."""

    url: str  # as given
    repo: str  # the repository's URL for git (without ``git+``, ``@REV`` and ``#PATH``)
    transport: str  # git's name of it: https, http, ssh, file, git
    rev: str | None  # None: the remote's HEAD
    path: str  # relative, in the tree

    def label(self, commit: str) -> str:
        """This source pinned to ``commit``: the URL that fetches the same files again."""
        prefix = "" if self.transport == "git" else "git+"
        return f"{prefix}{self.repo}@{commit}#{self.path}"


def parse_git_url(text: str) -> GitSource:
    """:raise UsageError: for a URL that is not a git source of labctl's form (see the module)."""
    parts = urlsplit(text)
    transport = SCHEMES.get(parts.scheme)
    if transport is None:
        raise UsageError(f"{text}: not a git URL (git+https://, git+http://, git+ssh://, git+file://, git://)")
    if parts.query:
        raise UsageError(f"{text}: a git URL takes no query (?...): REPO[@REV]#PATH")
    if not parts.fragment:
        raise UsageError(f"{text}: no path of a file in the repository", hint=f"{text}#path/to/lab.yaml")
    if parts.password is not None or (parts.username is not None and transport != "ssh"):
        raise UsageError(f"{text}: a git URL here carries no user name or password (it is shown and recorded)",
                         hint="let git's credential helper or SSH give them")
    if transport == "file" and parts.netloc not in ("", "localhost"):
        raise UsageError(f"{text}: git+file:// names a directory of this host (git+file:///DIR)")
    if transport != "file" and not parts.hostname:
        raise UsageError(f"{text}: no host")
    path, rev = parts.path, None
    if "@" in path:  # pip's rule: the last @ of the path
        path, rev = path.rsplit("@", 1)
        if not REV.fullmatch(rev) or ".." in rev or rev.endswith((".lock", "/", ".")):
            raise UsageError(f"{text}: '{rev}' is not a branch, a tag or a commit id")
    if not path.strip("/"):
        raise UsageError(f"{text}: no repository path")
    return GitSource(text, f"{parts.scheme.removeprefix('git+')}://{parts.netloc}{path}", transport, rev,
                     _file_path(text, parts.fragment))


def _file_path(url: str, fragment: str) -> str:
    p = PurePosixPath(fragment)
    if p.is_absolute() or any(c in ("", ".", "..") for c in fragment.split("/")) or "\0" in fragment:
        raise UsageError(f"{url}: '{fragment}' is not a path in the repository (relative, no '.' or '..')")
    return fragment


@dataclass(frozen=True)
class Checkout:
    """A git source fetched: its commit, the tree written out, and the file asked for in it."""

    source: GitSource
    commit: str
    root: Path

    @property
    def file(self) -> Path:
        return self.root / self.source.path

    @property
    def label(self) -> str:
        return self.source.label(self.commit)


def repo_dir(repo: str) -> Path:
    """Where labctl keeps what it fetched of the repository ``repo``."""
    return cache_dir() / "git" / hashlib.sha256(repo.encode()).hexdigest()[:16]


def fetch_git(src: GitSource) -> Checkout:
    """The commit ``src`` names, fetched and written out (once per commit; a full commit id already
    written out is not fetched again: the pinned URL of a run works offline).

    :raise UsageError: when git cannot fetch it, or the path is no regular file of its tree.
    """
    base = repo_dir(src.repo)
    pin(base)
    with exclusive(base.parent / f".{base.name}.lock"):
        if src.rev and FULL_COMMIT.fullmatch(src.rev) and (base / "trees" / src.rev).is_dir():
            commit = src.rev  # a commit is what it is: written out once, no need of the network again
        else:
            commit = _fetch(src, base)
        root = base / "trees" / commit
        if not root.is_dir():
            with build_into(root, 0o755, store=base / "trees") as work:
                _write_tree(src, base / "repo.git", commit, work)
    out = Checkout(src, commit, root)
    if not out.file.is_file() or out.file.is_symlink():
        raise UsageError(f"{src.url}: no file {src.path} in {src.repo} at commit {commit}; nothing started")
    return out


def _fetch(src: GitSource, base: Path) -> str:
    """Fetch the commit ``src`` names into ``base``'s bare repository; its full id.

    :raise UsageError: when git cannot.
    """
    bare = base / "repo.git"
    if not (bare / "HEAD").is_file():
        base.mkdir(parents=True, exist_ok=True)
        (base / "url").write_text(src.repo + "\n")
        _git(src, ["init", "--bare", "-q", str(bare)])
    want = src.rev or "HEAD"
    rc, _out, err = _git(src, ["-C", str(bare), "fetch", "--depth", "1", "--no-tags", "--quiet", "--", src.repo, want],
                         check=False)
    if rc != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        why = [ln for ln in lines if ln.startswith(("fatal:", "error:"))][:1] or lines[-1:]
        hint = "a revision is a branch, a tag or a full commit id" if src.rev and not FULL_COMMIT.fullmatch(src.rev) \
            else None
        raise UsageError(f"{src.url}: git could not fetch {want} of {src.repo}: "
                         f"{why[0].removeprefix('fatal: ') if why else 'no reason given'}; nothing started", hint=hint)
    return _git(src, ["-C", str(bare), "rev-parse", "--verify", "FETCH_HEAD^{commit}"])[1].decode().strip()


def _git(src: GitSource, args: list[str], check: bool = True) -> tuple[int, bytes, bytes]:
    """``git ARGS`` with no prompt and only the source's transport; its status, output and errors."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": src.transport, "LC_ALL": "C"}
    if src.transport == "ssh" and "GIT_SSH_COMMAND" not in os.environ:
        env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"
    res = run(["git", *args], timeout=FETCH_TIMEOUT_S, env=env, check=check)
    return res.returncode, res.stdout, res.stderr


def _write_tree(src: GitSource, bare: Path, commit: str, work: Path) -> None:
    """The commit's tree into ``work``: regular files (mode 0644) and directories, nothing else."""
    proc = start_piped(["git", "-C", bare, "archive", "--format=tar", commit])
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    total = 0
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for m in tar:
                name = m.name.rstrip("/")
                if not m.isreg() or not name or name.startswith("/") or ".." in name.split("/"):
                    continue
                total += m.size
                if total > MAX_TREE_BYTES:
                    raise UsageError(f"{src.url}: its tree is over {MAX_TREE_BYTES >> 30} GiB; nothing started")
                f = tar.extractfile(m)
                assert f is not None
                _copy(f, work / name)
        proc.stdout.read()
        if proc.wait(timeout=60) != 0:
            raise UsageError(f"{src.url}: git archive of {commit} failed: "
                             f"{(proc.stderr.read() if proc.stderr else b'').decode(errors='replace').strip()}")
    finally:
        if proc.poll() is None:
            kill_group(proc)


def _copy(f: IO[bytes], dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        while chunk := f.read(CHUNK):
            out.write(chunk)


def git_lab(checkout: Checkout) -> Lab:
    """The lab file of ``checkout``, held to a stranger's lab file's rules (:func:`check_foreign`): its
    bpftrace files may be files of the same tree, nothing else of this host. Its source is the
    checkout's label (the URL with the commit id): problems name it, and so does a run's card.

    :raise LabFileError: for a bad lab file. :raise UsageError: for one naming a host path.
    """
    label = checkout.label
    try:
        lab = load_lab(checkout.file, remote=label, remote_root=checkout.root)
    except LabFileError as exc:
        raise LabFileError([p._replace(file=label) if p.file == str(checkout.file) else p
                            for p in exc.problems]) from None
    check_foreign(lab, label, checkout.root)
    return dataclasses.replace(lab, source=label)
