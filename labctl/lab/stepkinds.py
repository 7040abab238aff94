"""The step kinds, registered in one place: each kind's lab-file keys, how they are checked, and
what it records in the step's result.

A step is made of kinds (its commands, its tracers, its gdb session, its selftests...). Each kind
is declared here by a :class:`KindDecl`: the keys of a step it owns in the lab file, the parser
of those keys (into the spec the step keeps in :attr:`labctl.lab.stepspec.Step.specs`, under the
kind's name) and the keys of the step's result it writes its records under, with their types.
Every stage reads the kinds from here, each for its part: the lab file's checker
(:mod:`.stepspec`: which keys a step may have), the runner (:mod:`labctl.steps.kinds`: how each
kind runs), summary.json (:mod:`labctl.report.run_summary` keeps every record declared here) and
the report (each :class:`labctl.report.sections.ReportSection` names the kinds it shows).
``tests/unit/test_step_kinds.py`` fails when a kind declared here lacks its run, its record's type
or a report section that shows it.

Adding a kind (docs/development.md, "Adding a step kind") touches three files besides its own
modules and tests: its line in :data:`KINDS` here; its run's in :data:`labctl.steps.kinds.RUNS`; its
report section's in :data:`labctl.report.registry.SECTIONS`. Its lab module (its keys' parser, its
spec and its record's types) is named here, not in the package's docstring, and its run and its
section import its types from it directly, not through the face (the module of a declared record
type is the kind's own: ``tests/unit/test_import_rules.py``). The kinds' lab modules named here:
:mod:`.stepsysctl` (``sysctls``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from labctl.lab.checker import Checker
from labctl.lab.followspec import parse_follow
from labctl.lab.kselftest import SelftestRecord
from labctl.lab.kselftest import parse as parse_kselftest
from labctl.lab.specs import GuestSpec
from labctl.lab.stepgdb import GdbRecord, parse_gdb
from labctl.lab.stepnetwork import CaptureRecord, NetworkRecord
from labctl.lab.stepsysctl import SysctlRecord, parse_sysctls
from labctl.lab.yamlpos import YamlMap


@dataclass(frozen=True)
class StepContext:
    """What a kind's parser is given to check its keys of one step (problems go to ``check`` with
    their lines): the lab's guests, the host directories the lab may name, and the step's own
    checks of a template: ``templates(text, line, path)`` reports unknown ``{{variables}}``,
    ``each_row(text, check, line, path)`` runs ``check`` on the text as every matrix row fills it
    in (False after reporting the first row that fails), ``each_guest(text, line, path)`` checks a
    guest name that may be a template, ``guest(m, key, path)`` a plain guest name."""

    check: Checker
    guests: Mapping[str, GuestSpec]
    trusted: tuple[Path, ...]
    templates: Callable[[str, int, str], None]
    each_row: Callable[[str, Callable[[str], object], int, str], bool]
    each_guest: Callable[[str, int, str], None]
    guest: Callable[[YamlMap, str, str], str | None]


Parse = Callable[[StepContext, YamlMap, str], object | None]
"""A kind's parser: (context, the step's mapping, its path) -> the kind's spec, or None when the
step does not ask for the kind or its keys are wrong (reported)."""


@dataclass(frozen=True)
class KindDecl:
    """One step kind's declaration (see the module docstring).

    ``keys``: the step's lab-file keys the kind owns; ``parse``: their parser (None for the kinds
    the step's own parser reads, :mod:`.stepspec`: ``run``, ``trace``, ``impair``); ``records``:
    (key of the step's result and summary entry, the record's type) of what the kind records,
    empty for a kind that leaves only files (their reading is its report section's).
    """

    name: str
    keys: tuple[str, ...] = ()
    parse: Parse | None = None
    records: tuple[tuple[str, object], ...] = ()


def _gdb(ctx: StepContext, m: YamlMap, path: str) -> object | None:
    return parse_gdb(ctx.check, m, path, ctx.templates, ctx.each_row, ctx.guest)


def _kselftest(ctx: StepContext, m: YamlMap, path: str) -> object | None:
    if "kselftest" not in m:
        return None
    return parse_kselftest(ctx.check, m, path, set(ctx.guests), ctx.trusted, ctx.each_guest)


def _follow(ctx: StepContext, m: YamlMap, path: str) -> object | None:
    return parse_follow(ctx.check, m, path, dict(ctx.guests), ctx.templates, ctx.each_row)


def _sysctls(ctx: StepContext, m: YamlMap, path: str) -> object | None:
    return parse_sysctls(ctx.check, m, path, ctx.guests)


KINDS: tuple[KindDecl, ...] = (
    KindDecl("drops"),  # the lab's drops: (every step unless false), files only
    KindDecl("network", ("impair",), records=(("network", NetworkRecord), ("captures", list[CaptureRecord]))),
    KindDecl("sysctls", ("sysctls",), _sysctls, (("sysctls", SysctlRecord),)),
    KindDecl("stats"),  # trace.GUEST.stats, files only
    KindDecl("trace", ("trace",)),
    KindDecl("follow", ("follow",), _follow),
    KindDecl("gdb", ("gdb",), _gdb, (("gdb", GdbRecord),)),
    KindDecl("commands", ("run",)),
    KindDecl("kselftest", ("kselftest",), _kselftest, (("kselftest", SelftestRecord),)),
)
"""Every step kind, in the order each phase of a step visits them (:mod:`labctl.steps.variant`)."""


def kind_keys() -> tuple[str, ...]:
    """The step keys the kinds own, in declaration order."""
    return tuple(k for d in KINDS for k in d.keys)


def recorded_keys() -> tuple[str, ...]:
    """The keys of a step's result that hold the kinds' records (summary.json keeps them all)."""
    return tuple(key for d in KINDS for key, _ in d.records)
