"""Who may use ``labctl serve``: tokens, and what each one may reach.

::

    <state dir>/web/              mode 0700
        owner.token               the lab owner's token (every lab of this user's), 0600
        class-<lab>.json          a class's tokens: the trainer's and one per student, 0600

A class's tokens are made the first time ``serve`` serves that class and
revoked by ``class down`` (:func:`revoke`). Every request resolves its token
again (:func:`resolve`): a class token holds only while the class record it
was made for (same lab, same ``created_at``) is still there and still names the
student, so a token stops working the moment ``class down`` removes the record,
and a new class of the same lab never honours the old class's tokens.

A student's token reaches one instance, ``LAB@STUDENT``; the trainer's the
instances of the class's students as its record names them now (not the
owner's own ``LAB@X``, nor a student no longer on the roster); the owner's
every lab of this user's.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from labctl.errors import LabctlError, LabStateError, UsageError
from labctl.lab import LAB_IDENT
from labctl.paths import atomic_write, ensure_private_dir, state_dir
from labctl.training import ClassRecord, class_names, classes_root

OWNER, TRAINER, STUDENT = "owner", "trainer", "student"
TOKEN_BYTES = 24
URL_FILE = "web_url"  # in a student's handout directory


def web_dir() -> Path:
    return state_dir() / "web"


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


@dataclass(frozen=True)
class Principal:
    """Who a token belongs to: the owner, a class's trainer or one of its students."""

    kind: str
    lab: str = ""  # the class's lab (trainer, student)
    student: str = ""
    students: tuple[str, ...] = ()  # the trainer's: the class's roster when the token was resolved

    def may_reach(self, ident: str) -> bool:
        """True when this principal may see and act on the lab instance ``ident``."""
        if not LAB_IDENT.fullmatch(ident):
            return False
        if self.kind == OWNER:
            return True
        if self.kind == TRAINER:
            base, _, student = ident.partition("@")
            return base == self.lab and student in self.students
        return self.kind == STUDENT and ident == f"{self.lab}@{self.student}"

    def may_see_class(self, lab: str) -> bool:
        """True when this principal may see the class of ``lab`` (its owner, or its trainer)."""
        return self.kind == OWNER or (self.kind == TRAINER and self.lab == lab)

    def describe(self) -> str:
        return {OWNER: "lab owner", TRAINER: f"trainer of {self.lab}"}.get(self.kind, f"{self.student} ({self.lab})")


class TokensFile(TypedDict):
    """``class-<lab>.json``: :class:`ClassTokens` as saved."""

    lab: str
    created_at: str
    trainer: str
    students: dict[str, str]  # student -> token


@dataclass
class ClassTokens:
    """A class's tokens, tied to the class record they were made for."""

    lab: str
    created_at: str
    trainer: str
    students: dict[str, str]

    @staticmethod
    def path_of(lab: str) -> Path:
        return web_dir() / f"class-{lab}.json"

    def save(self) -> None:
        ensure_private_dir(web_dir())
        atomic_write(self.path_of(self.lab), json.dumps(self.__dict__, indent=2) + "\n", 0o600)

    @classmethod
    def read(cls, lab: str) -> ClassTokens | None:
        try:
            data: TokensFile = json.loads(cls.path_of(lab).read_text())  # checked below
            return cls(str(data["lab"]), str(data["created_at"]), str(data["trainer"]),
                       {str(k): str(v) for k, v in dict(data["students"]).items()})
        except (OSError, ValueError, KeyError, TypeError):
            return None


def class_tokens(record: ClassRecord) -> ClassTokens:
    """The tokens of the class ``record`` (made and saved, 0600, the first time; a student added
    since gets one). Tokens left by an earlier class of the same lab are replaced."""
    tokens = ClassTokens.read(record.lab)
    if tokens is None or tokens.created_at != record.created_at or tokens.lab != record.lab:
        tokens = ClassTokens(record.lab, record.created_at, new_token(), {})
    changed = False
    for s in record.students:
        if s not in tokens.students:
            tokens.students[s] = new_token()
            changed = True
    if changed or not ClassTokens.path_of(record.lab).is_file():
        tokens.save()
    return tokens


def owner_token() -> str:
    """The owner's token (made and saved, 0600, the first time)."""
    path = web_dir() / "owner.token"
    try:
        token = path.read_text().strip()
        if len(token) >= 32:
            return token
    except OSError:
        pass
    ensure_private_dir(web_dir())
    token = new_token()
    atomic_write(path, token + "\n", 0o600)
    return token


def revoke(lab: str) -> None:
    """Revoke a class's tokens (``class down``): its token file goes."""
    try:
        ClassTokens.path_of(lab).unlink(missing_ok=True)
    except OSError:
        pass


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


RESOLVE_TTL = 1.0  # seconds an answer of resolve() is reused while the token files stay as they were
_resolved: dict[str, tuple[float, tuple[object, ...], Principal | None]] = {}


def _token_files() -> tuple[object, ...]:
    """What the tokens and class records are now, without reading them: each file's name, inode,
    size and change time (a revoked token or a class taken down changes it)."""
    out: list[object] = []
    for d in (web_dir(), classes_root()):
        try:
            with os.scandir(d) as entries:
                for e in entries:
                    st = e.stat(follow_symlinks=False)
                    out.append((e.name, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((str(d), None))
    return tuple(sorted(out, key=repr))


def resolve(token: str | None) -> Principal | None:
    """Whose ``token`` is (:func:`resolve_now`); the answer is reused for ``RESOLVE_TTL`` seconds
    while no token file or class record changed: every live page and terminal asks each second,
    and a room of 36 students asks 150 times a second."""
    if not token or len(token) > 200:
        return None
    now, files = time.monotonic(), _token_files()
    hit = _resolved.get(token)
    if hit is not None and now - hit[0] < RESOLVE_TTL and hit[1] == files:
        return hit[2]
    who = resolve_now(token)
    if len(_resolved) > 4096:
        _resolved.clear()
    _resolved[token] = (now, files, who)
    return who


def resolve_now(token: str | None) -> Principal | None:
    """Whose ``token`` is, checked against the files and class records as they are now; None for
    an unknown or revoked token."""
    if not token or len(token) > 200:
        return None
    try:
        own = (web_dir() / "owner.token").read_text().strip()
    except OSError:
        own = ""
    if own and _same(token, own):
        return Principal(OWNER)
    for lab in class_names():
        tokens = ClassTokens.read(lab)
        if tokens is None:
            continue
        who: Principal | None = None
        if _same(token, tokens.trainer):
            who = Principal(TRAINER, lab)
        for student, t in tokens.students.items():
            if _same(token, t):
                who = Principal(STUDENT, lab, student)
        if who is None:
            continue
        try:
            record = ClassRecord.load(lab)
        except (LabStateError, UsageError):
            return None
        if record.created_at != tokens.created_at:
            return None
        if who.kind == STUDENT and who.student not in record.students:
            return None
        return Principal(TRAINER, lab, students=tuple(record.students)) if who.kind == TRAINER else who
    return None


def write_url_file(record: ClassRecord, student: str, url: str) -> Path | None:
    """The student's URL in their handout directory (``web_url``, 0600); None when it cannot be
    written (the directory is gone or not safe)."""
    path = record.handout(student) / URL_FILE
    try:
        if not path.parent.is_dir():
            return None
        atomic_write(path, url + "\n", 0o600)
    except (OSError, LabctlError):  # an unsafe or vanished directory: no URL file, serve still runs
        return None
    return path
