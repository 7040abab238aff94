"""Config bisection's pure part: two ``.config`` files, their differences, and the candidates between them.

As ktest.pl's config bisect does it: a candidate is the good config with part of the differences set to
the bad config's values, put through ``make olddefconfig`` (which may force or drop options: a
dependency not met, a ``select``). The result is judged by the lab; good, it is the new good end, bad,
the new bad end; until one option is left (the answer: ``CONFIG_X=y -> n breaks the lab``) or none of
the candidates tried makes progress (the answer is then the smallest set reached).

The order of the differences is dependency-aware as far as names tell: an option sorts beside its
family (``CONFIG_E1000`` and ``CONFIG_E1000E``, ``CONFIG_NET_SCH_*``), so that a half keeps an option
with those whose names extend it. When olddefconfig undoes part of a half anyway, that is said
(:attr:`Candidate.missing`), and the candidate is used while it still splits the difference; else the
other half, then quarters, eighths... down to single options are tried (:func:`chunks`).

Nothing here runs a process or reads a file: the worktree's ``olddefconfig`` is handed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from labctl.errors import UsageError

_SET = re.compile(r"CONFIG_([A-Za-z0-9_]+)=(.*)")
_UNSET = re.compile(r"# CONFIG_([A-Za-z0-9_]+) is not set")
_HEADER = re.compile(r"# Linux/(\S+) (\d+)\.(\d+)\S* Kernel Configuration")
OFF = "n"


@dataclass(frozen=True)
class Config:
    """A ``.config``: option (with ``CONFIG_``) -> value as written (``y``, ``m``, a number, a quoted
    string), ``n`` for ``# CONFIG_X is not set``; an option not mentioned is ``n`` too (not visible)."""

    values: dict[str, str]
    arch: str = ""  # from the header, "# Linux/x86 6.1.192 Kernel Configuration"
    version: str = ""  # major.minor from the header

    def get(self, name: str) -> str:
        return self.values.get(name, OFF)


def parse(text: str) -> Config:
    """A ``.config``'s text; a later line for the same option wins, as in Kconfig."""
    values: dict[str, str] = {}
    arch = version = ""
    for raw in text.splitlines():
        line = raw.strip()
        if m := _SET.fullmatch(line):
            values[f"CONFIG_{m.group(1)}"] = m.group(2)
        elif m := _UNSET.fullmatch(line):
            values[f"CONFIG_{m.group(1)}"] = OFF
        elif not arch and (h := _HEADER.fullmatch(line)):
            arch, version = h.group(1), f"{h.group(2)}.{h.group(3)}"
    return Config(values, arch, version)


def render(cfg: Config) -> str:
    """A ``.config`` olddefconfig reads (option order does not matter to it)."""
    lines = [f"# {k} is not set" if v == OFF else f"{k}={v}" for k, v in sorted(cfg.values.items())]
    return "\n".join(lines) + "\n"


def diff(good: Config, bad: Config) -> list[str]:
    """The options whose values differ, in :func:`order`."""
    return order([k for k in set(good.values) | set(bad.values) if good.get(k) != bad.get(k)])


def _family(name: str) -> str:
    """The name without its last ``_WORD`` (``CONFIG_NET_SCH_TBF`` -> ``CONFIG_NET_SCH``)."""
    return name.rsplit("_", 1)[0] if name.count("_") > 1 else name


def order(names: list[str]) -> list[str]:
    """Family by family (options sharing a prefix stay together), each sorted by name."""
    return sorted(names, key=lambda n: (_family(n), n))


def change_text(name: str, good: Config, bad: Config) -> str:
    """``CONFIG_X=y -> n``."""
    return f"{name}={good.get(name)} -> {bad.get(name)}"


def changes(names: list[str], good: Config, bad: Config) -> dict[str, list[str]]:
    """name -> [good value, bad value]: the answer's and the steps' form in the state and --json."""
    return {n: [good.get(n), bad.get(n)] for n in names}


def chunks(names: list[str]) -> Iterator[list[str]]:
    """The parts of ``names`` worth trying, best split first: the halves, then the quarters, ... then each
    name alone (ktest tries the other half when a half makes no progress; smaller parts go on from there)."""
    n = len(names)
    size = (n + 1) // 2
    seen: set[tuple[str, ...]] = set()
    while size >= 1:
        for i in range(0, n, size):
            part = tuple(names[i:i + size])
            if part and len(part) < n and part not in seen:
                seen.add(part)
                yield list(part)
        if size == 1:
            break
        size = (size + 1) // 2


def with_bad(good: Config, bad: Config, names: list[str]) -> Config:
    """The good config with ``names`` set to the bad config's values."""
    values = dict(good.values)
    for n in names:
        values[n] = bad.get(n)
    return Config(values, good.arch, good.version)


@dataclass
class Candidate:
    """A config to try: the half of the differences set to the bad values (``names``), as olddefconfig left it."""

    names: list[str]  # the options intended to take the bad end's values
    config: Config  # after olddefconfig
    missing: list[str] = field(default_factory=list)  # intended, but olddefconfig kept (or set) otherwise
    left_good: int = 0  # options still differing from the good end
    left_bad: int = 0  # ... from the bad end
    tried: list[str] = field(default_factory=list)  # the parts tried before it that made no progress, and why


def progress(good: Config, bad: Config, got: Config) -> tuple[int, int]:
    """How many options ``got`` differs by from each end."""
    return len(diff(good, got)), len(diff(got, bad))


def pick(good: Config, bad: Config, olddefconfig: Callable[[Config], Config],
         unusable: Collection[str] = (), fingerprint: Callable[[Config], str] = render) -> Candidate | None:
    """The first part of the differences whose candidate, through ``olddefconfig``, lies strictly between
    the two ends (it differs from each by fewer options than they differ by) and is not ``unusable``
    (a fingerprint of a candidate that could not be judged); None when no part does (the differences
    cannot be split further)."""
    names = diff(good, bad)
    total = len(names)
    tried: list[str] = []
    for part in chunks(names):
        got = olddefconfig(with_bad(good, bad, part))
        to_good, to_bad = progress(good, bad, got)
        missing = [n for n in part if got.get(n) != bad.get(n)]
        label = _names_text(part)
        if to_good == 0:
            tried.append(f"{label}: olddefconfig gave back the good config")
        elif to_bad == 0:
            tried.append(f"{label}: olddefconfig gave the bad config")
        elif to_good >= total or to_bad >= total:
            tried.append(f"{label}: olddefconfig moved it off the line between the ends")
        elif fingerprint(got) in unusable:
            tried.append(f"{label}: tried before, could not be judged")
        else:
            return Candidate(part, got, missing, to_good, to_bad, tried)
    return None


def _names_text(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def describe(c: Candidate, good: Config, bad: Config) -> str:
    """The step table's subject: which options the candidate set to the bad values, and what olddefconfig did."""
    total = len(diff(good, bad))
    text = f"{len(c.names)} of {total} as bad: {', '.join(change_text(n, good, bad) for n in c.names)}"
    if c.missing:
        text += f"; olddefconfig kept {', '.join(f'{n}={c.config.get(n)}' for n in c.missing)}"
    return text


def answer_text(opts: dict[str, list[str]], term_new: str = "bad") -> str:
    """``CONFIG_X=y -> n breaks the lab``, or the smallest set reached."""
    what = "breaks the lab" if term_new == "bad" else f"makes it {term_new}"
    parts = [f"{n}={v[0]} -> {v[1]}" for n, v in opts.items()]
    if len(parts) == 1:
        return f"{parts[0]} {what}"
    return f"these {len(parts)} changes together {what} (no candidate between them could be made): " + ", ".join(parts)


def makefile_version(text: str) -> str:
    """``major.minor`` from a kernel tree's top Makefile ("" when it has none)."""
    v = re.search(r"^VERSION = (\d+)$", text, re.MULTILINE)
    p = re.search(r"^PATCHLEVEL = (\d+)$", text, re.MULTILINE)
    return f"{v.group(1)}.{p.group(1)}" if v and p else ""


def unsafe_value(cfg: Config, tree: PurePosixPath | None = None) -> str | None:
    """Why building ``cfg`` would run or read what it should not, or None: a value holding ``$(``
    (Kconfig's macros: ``$(shell ...)`` runs as whoever builds), or ``CONFIG_INITRAMFS_SOURCE``
    naming anything outside the tree (``tree``, absolute; relative names are the tree's), which the
    kernel would embed (``/root``)."""
    for name, value in cfg.values.items():
        if "$(" in value:
            return f"{name}={value[:60]}: a value with '$(' (kconfig would run it)"
    initramfs = cfg.values.get("CONFIG_INITRAMFS_SOURCE", '""').strip('"')
    for part in initramfs.split():
        p = PurePosixPath(part)
        inside = ".." not in p.parts and (not p.is_absolute() or (tree is not None and p.is_relative_to(tree)))
        if not inside:
            return f"CONFIG_INITRAMFS_SOURCE names {part}, outside the tree (the kernel would embed it)"
    return None


def check_pair(good_text: str, bad_text: str, tree_cfg: Config, tree_version: str, names: tuple[str, str],
               tree: PurePosixPath | None = None) -> None:
    """The two configs as given, before anything starts: each is a ``.config`` for this tree's architecture
    and version, safe to build (:func:`unsafe_value`; ``tree``: where it is), and they differ.

    :raise UsageError: naming the file and what is wrong.
    """
    parsed = []
    for text, name in zip((good_text, bad_text), names, strict=True):
        cfg = parse(text)
        if not cfg.values:
            raise UsageError(f"{name}: not a kernel .config (no CONFIG_ line)")
        why = unsafe_value(cfg, tree)
        if why is not None:
            raise UsageError(f"{name}: {why}; nothing started")
        if cfg.arch and tree_cfg.arch and cfg.arch != tree_cfg.arch:
            raise UsageError(f"{name}: a config for {cfg.arch}, the tree's is for {tree_cfg.arch}",
                             hint="give configs of this tree's architecture")
        if cfg.version and tree_version and cfg.version != tree_version:
            raise UsageError(f"{name}: a config for Linux {cfg.version}, the tree is {tree_version}",
                             hint="give configs of this tree's version (make olddefconfig them there)")
        parsed.append(cfg)
    if not diff(parsed[0], parsed[1]):
        raise UsageError(f"{names[0]} and {names[1]} set the same options: nothing to bisect")
