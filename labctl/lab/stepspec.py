"""The ``steps:`` section of a lab file: workloads wrapped in tracing.

::

    steps:
      - name: transfer                  # [a-z0-9][a-z0-9_-]*
        description: optional
        matrix:                         # optional: run the step once per row
          - {label: rtl8139, nic: eth1, server: 10.1.0.2}
        nic: a.{{nic}}                  # optional: the NIC under test (driver share)
        repeat: 3                       # optional: run each variant 3 times (1..100, default 1):
                                        # the spread is the run-to-run noise labctl compare uses
        run:                            # commands, in order
          - guest: b
            command: iperf3 -s -1       # a shell command line, run as root
            background: true            # keep it running during the step
            timeout: 60                 # seconds (default 300)
            ready_after: 1              # background only: wait before going on
          - guest: a
            command: iperf3 -c {{server}} -R -t 10 -J
        impair: {a.eth1: {loss: "{{loss}}"}}   # for the step's duration (labctl.lab.netopts)
        trace:                          # per guest
          a:
            perf_record: {events: [cpu-clock], call_graph: false, frequency: 999, target: system}
            perf_stat: {events: [cpu-clock, context-switches]}
            ftrace: {events: [net:net_dev_queue], tracer: function_graph, functions: [ip_rcv], filter: "len > 100"}
            kprobes: [ip_rcv]
            mpstat: true
            skb_latency: true           # per-packet stage latency (or {buffer_kb: 16384}); not with ftrace
            bpftrace: {script: "kprobe:ip_rcv { @[comm] = count(); }"}   # or {file: prog.bt}
            stats: true                 # statistics snapshots before/after (default true)
            capture: [eth1]             # pcapng of these NICs (true: all of a's) in the bundle

A step may follow packets through the lab's kernels and wires (``follow: {filter: ..., guests: [...]}``,
:mod:`labctl.lab.followspec`) while it runs.

A step may run the kernel's selftests (``kselftest: {tree: DIR, target: net, tests: [...]}``,
:mod:`labctl.lab.kselftest`) instead of, or after, its ``run`` commands.

A ``run`` entry may also be ``{link: GUEST.NIC, state: down}`` (QMP
``set_link``); links and impairments a step changes are put back when it ends.

``{{name}}`` in commands, ``nic``, ``impair``, ``link`` and ftrace filters is replaced by the
matrix row's value (shell-quoted in commands); ``{{GUEST.IFACE.ip}}`` by that interface's
(a NIC's, VLAN's, bond's or bridge's) first IPv4 address (its first IPv6 one when it has none),
``.ip4`` and ``.ip6`` by its first of each family. Unknown names are reported with their line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from labctl.lab.checker import Checker, close_match
from labctl.lab.followspec import FollowSpec
from labctl.lab.ifaces import address_keys
from labctl.lab.kselftest import Kselftest
from labctl.lab.netopts import LinkSpec, StepImpair, link_spec, step_impairs
from labctl.lab.specs import GuestSpec, MasterSpec, NicSpec
from labctl.lab.stepgdb import GdbStep
from labctl.lab.stepkinds import KINDS, StepContext, kind_keys
from labctl.lab.templates import TEMPLATE as _TEMPLATE
from labctl.lab.templates import render, yaml_bool
from labctl.lab.tracespec import TraceParser, TraceSpec
from labctl.lab.yamlpos import YamlMap

_STEP_KEYS = ("name", "description", "matrix", "nic", "repeat", *kind_keys())  # the kinds' own: labctl.lab.stepkinds
MAX_REPEAT = 100
T = TypeVar("T")
_RUN_KEYS = ("guest", "command", "background", "timeout", "ready_after")
_STEP_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
_VAR = re.compile(r"[a-z_][a-z0-9_]{0,31}")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class RunSpec:
    guest: str
    command: str  # template
    background: bool
    timeout: float
    ready_after: float
    line: int


@dataclass(frozen=True)
class Step:
    name: str
    description: str
    matrix: tuple[dict[str, str], ...]  # each row has a "label"
    nic: str | None  # template "guest.nic"
    run: tuple[RunSpec | LinkSpec, ...]
    trace: dict[str, TraceSpec]
    line: int
    repeat: int = 1  # runs of each variant
    impair: tuple[StepImpair, ...] = ()  # impairments for the step's duration
    specs: dict[str, object] = field(default_factory=dict)  # a kind's name -> its spec (labctl.lab.stepkinds)

    def variants(self) -> list[dict[str, str]]:
        """The matrix rows, or one empty row when the step has no matrix."""
        return list(self.matrix) or [{}]

    def spec(self, kind: str, cls: type[T]) -> T | None:
        """The spec of the step's kind ``kind`` (its parser's, :mod:`labctl.lab.stepkinds`), None when it has none."""
        value = self.specs.get(kind)
        return value if isinstance(value, cls) else None

    @property
    def gdb(self) -> GdbStep | None:
        """A scripted gdb breakpoint session alongside the commands."""
        return self.spec("gdb", GdbStep)

    @property
    def kselftest(self) -> Kselftest | None:
        """The kernel's selftests, run after the commands."""
        return self.spec("kselftest", Kselftest)

    @property
    def follow(self) -> FollowSpec | None:
        """Packets followed through the lab while the step runs."""
        return self.spec("follow", FollowSpec)


@dataclass
class StepParser:
    """Validates ``steps`` with the lab checker."""

    check: Checker
    guests: dict[str, GuestSpec]
    trusted: tuple[Path, ...] = ()  # --trust-dir: host paths a step names (kselftest's tree)
    steps: list[Step] = field(default_factory=list)

    def parse(self, data: YamlMap) -> tuple[Step, ...]:
        if "steps" not in data:
            return ()
        seq = self.check.sequence(data, "steps", "")
        names: dict[str, int] = {}
        for m, path, _ in self.check.mappings(seq, "steps"):
            step = self._step(m, path)
            if step is None:
                continue
            if step.name in names:
                self.check.add(m.value_line("name"), f"{path}.name",
                               f"duplicate step name '{step.name}' (first at line {names[step.name]})")
            names[step.name] = step.line
            self.steps.append(step)
        return tuple(self.steps)

    def _addresses(self) -> dict[str, str]:
        """``{{GUEST.IFACE.ip}}``, ``.ip4``, ``.ip6`` of every interface (NICs, VLANs, bonds, bridges)."""
        out = {}
        for g in self.guests.values():
            holders: list[NicSpec | MasterSpec] = [*g.nics, *g.masters]
            views = []
            for h in holders:
                if h.name:
                    views.append((h.name, [a.address for a in h.addresses]))
                views += [(v.name, [a.address for a in v.addresses]) for v in h.vlans if v.name]
            out.update(address_keys(g.name, views))
        return out

    def _step(self, m: YamlMap, path: str) -> Step | None:
        c = self.check
        c.keys(m, path, _STEP_KEYS, ("name",) if "kselftest" in m else ("name", "run"))
        name = c.matching(m, "name", path, _STEP_NAME, "step name", "use a-z, 0-9, '_', '-'", True)
        matrix = self._matrix(m, path)
        known = {k for row in matrix for k in row} | set(self._addresses())
        nic = c.string(m, "nic", path)
        if nic is not None:
            self._templates(nic, known, m.value_line("nic"), f"{path}.nic")
            self._check_nic(nic, matrix, m.value_line("nic"), f"{path}.nic")
        repeat = c.integer(m, "repeat", path, (1, MAX_REPEAT))
        run = self._runs(m, path, known, matrix)
        trace = TraceParser(self.check, self.guests, lambda text, line, where: self._templates(text, known, line, where),
                            lambda text, check, line, where: self._each_row(text, matrix, check, line, where),
                            self.trusted).parse(m, path)
        impair = step_impairs(c, m, path, lambda text, line, where: self._templates(text, known, line, where),
                              lambda text, check, line, where: self._each_row(text, matrix, check, line, where),
                              lambda nic, line, where: self._check_nic(nic, matrix, line, where))
        ctx = StepContext(c, self.guests, self.trusted, lambda text, line, where: self._templates(text, known, line, where),
                          lambda text, check, line, where: self._each_row(text, matrix, check, line, where),
                          lambda text, line, where: self._each_guest(text, known, matrix, line, where), self._guest)
        specs = {d.name: spec for d in KINDS if d.parse is not None and (spec := d.parse(ctx, m, path)) is not None}
        if name is None or ("kselftest" in m and "kselftest" not in specs):
            return None
        return Step(name, c.string(m, "description", path) or "", matrix, nic, run, trace, m.line, repeat or 1, impair,
                    specs)

    def _each_guest(self, template: str, known: set[str], matrix: tuple[dict[str, str], ...], line: int,
                    path: str) -> None:
        """A guest name that may be a template: every matrix row must fill it in with a guest of the lab."""
        self._templates(template, known, line, path)

        def check(value: str) -> str:
            if value not in self.guests:
                raise ValueError(f"unknown guest '{value}'{close_match(value, self.guests)}")
            return value

        self._each_row(template, matrix, check, line, path)

    def _each_row(self, template: str, matrix: tuple[dict[str, str], ...], check: Any, line: int,
                  path: str) -> bool:
        """Check ``template`` as every matrix row fills it in; report the first bad row. True when all pass."""
        addresses = self._addresses()
        for row in matrix or ({},):
            value = render(template, row, addresses, quote=False)
            if _TEMPLATE.search(value):
                continue  # an unknown variable: reported by _templates
            try:
                check(value)
            except ValueError as exc:
                where = f" (matrix row '{row['label']}')" if row.get("label") and value != template else ""
                self.check.add(line, path, f"{exc}{where}")
                return False
        return True

    def _matrix(self, m: YamlMap, path: str) -> tuple[dict[str, str], ...]:
        c = self.check
        rows: list[dict[str, str]] = []
        seq = c.sequence(m, "matrix", path)
        labels: set[str] = set()
        for row, rpath, _ in c.mappings(seq, f"{path}.matrix"):
            values: dict[str, str] = {}
            for key, value in row.items():
                if not _VAR.fullmatch(str(key)):
                    c.add(row.key_line(key), f"{rpath}.{key}", f"invalid variable name '{key}' (use a-z, 0-9, '_')")
                elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    if _CONTROL.search(str(value)):
                        c.add(row.value_line(key), f"{rpath}.{key}", "control characters are not allowed")
                        continue
                    values[str(key)] = str(value)
                else:
                    c.add(row.value_line(key), f"{rpath}.{key}", "expected a string or number")
            label = values.get("label")
            if label is None:
                c.add(row.line, rpath, "missing required key 'label'")
            elif not _LABEL.fullmatch(label):
                c.add(row.value_line("label"), f"{rpath}.label", f"invalid label '{label}'")
            elif label in labels:
                c.add(row.value_line("label"), f"{rpath}.label", f"duplicate label '{label}'")
            else:
                labels.add(label)
            rows.append(values)
        if rows and {tuple(sorted(r)) for r in rows} != {tuple(sorted(rows[0]))}:
            c.add(seq.line, f"{path}.matrix", "every matrix row must set the same variables")
        return tuple(rows)

    def _templates(self, text: str, known: set[str], line: int, path: str) -> None:
        for var in _TEMPLATE.findall(text):
            if var not in known:
                self.check.add(line, path, f"unknown variable '{{{{{var}}}}}'{close_match(var, known)}")

    def _check_nic(self, nic: str, matrix: tuple[dict[str, str], ...], line: int, path: str) -> None:
        for row in matrix or ({},):
            value = render(nic, row, {}, quote=False)
            guest, _, name = value.partition(".")
            g = self.guests.get(guest)
            if g is None or not any(n.name == name for n in g.nics):
                self.check.add(line, path, f"'{value}' is not a lab NIC (write GUEST.NIC, e.g. a.eth1)")
                return

    def _runs(self, m: YamlMap, path: str, known: set[str],
              matrix: tuple[dict[str, str], ...]) -> tuple[RunSpec | LinkSpec, ...]:
        c = self.check
        out: list[RunSpec | LinkSpec] = []
        seq = c.sequence(m, "run", path)
        if "run" in m and not seq:
            c.add(m.value_line("run"), f"{path}.run", "a step needs at least one command")
        for r, rpath, _ in c.mappings(seq, f"{path}.run"):
            if "link" in r:
                link = link_spec(c, r, rpath, lambda text, line, where: self._templates(text, known, line, where),
                                 lambda nic, line, where: self._check_nic(nic, matrix, line, where))
                if link is not None:
                    out.append(link)
                continue
            c.keys(r, rpath, _RUN_KEYS, ("guest", "command"))
            guest = self._guest(r, "guest", rpath)
            command = c.string(r, "command", rpath, required=True)
            if command is not None:
                self._templates(command, known, r.value_line("command"), f"{rpath}.command")
            background = yaml_bool(self.check, r, "background", rpath, False)
            timeout = c.integer(r, "timeout", rpath, (1, 86400), " s")
            ready = c.integer(r, "ready_after", rpath, (0, 600), " s")
            if guest and command is not None:
                out.append(RunSpec(guest, command, background, float(timeout or 300),
                                   float(1 if ready is None else ready), r.line))
        return tuple(out)

    def _guest(self, m: YamlMap, key: str, path: str) -> str | None:
        name = self.check.string(m, key, path, required=True)
        if name is not None and name not in self.guests:
            self.check.add(m.value_line(key), f"{path}.{key}", f"unknown guest '{name}'{close_match(name, self.guests)}")
            return None
        return name
