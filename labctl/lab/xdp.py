"""An XDP program on a guest's NIC, as data: a C source of the lab's directory that labctl builds on
the host (:mod:`.bpfbuild`), or xdp-filter (xdp-tools, in the image) with its rules; native or
generic, decided from the NIC model's driver (:data:`labctl.lab.nics.NIC_MODELS`) when the lab is read.

::

    nics:
      - name: eth1
        model: virtio-net-pci
        network: n
        xdp: {source: drop.c, mode: native, counters: xdp_stats}   # section: xdp (the default)
      - name: eth2
        model: e1000
        network: m
        xdp: {filter: {ports: [9], ips: [10.9.2.1]}}                # mode: generic (e1000 has no native XDP)

``mode``: ``native`` (the driver runs it: virtio-net-pci), ``generic`` (the kernel runs it on the skb,
any driver); without it, native where the driver has it, else generic. ``native`` on a NIC whose
driver lacks it is refused with the reason at its line. ``source`` is a path relative to the lab
file's directory, inside it, trusted as every host path a lab file names (:mod:`labctl.lab.trust`);
it is built when the lab is read, so a source that does not compile fails before anything starts,
with the compiler's message at its line; the object is part of the resolved lab (so of its state and
its snapshot key), never built again. ``counters``: the program's own per-action counters, an array
(or per-CPU array) map keyed by the XDP action (0 ABORTED, 1 DROP, 2 PASS, 3 TX, 4 REDIRECT) of u64
counts: what labctl's drop table reports them against. ``filter``: xdp-filter's rules, ``ports``
(TCP and UDP destination ports) and ``ips`` (source addresses), and its ``policy``: ``allow`` (the
default: what the rules match is dropped, the rest passed) or ``deny`` (the reverse).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from labctl.lab.bpfbuild import MAX_SOURCE, build, include_problem
from labctl.lab.checker import Checker, describe, did_you_mean, join
from labctl.lab.nics import NIC_MODELS
from labctl.lab.trust import TRUST_ENV, named_path_reason, read_capped
from labctl.lab.yamlpos import YamlMap

__all__ = ["ACTIONS", "DIRECTIONS", "FILTER_KEYS", "MODES", "TC_KEYS", "XDP_KEYS", "Tc", "TcRecord", "Xdp", "XdpFilterRecord",
           "XdpRecord", "parse_tc", "parse_xdp"]

XDP_KEYS = ("source", "section", "mode", "counters", "filter")
TC_KEYS = ("source", "section", "direction")
DIRECTIONS = ("ingress", "egress")
FILTER_KEYS = ("ports", "ips", "policy")
MODES = ("native", "generic")
POLICIES = ("allow", "deny")
ACTIONS = ("ABORTED", "DROP", "PASS", "TX", "REDIRECT")  # the XDP action numbers' names
MAX_RULES = 64
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,63}")


class XdpFilterRecord(TypedDict):
    """xdp-filter's rules in :class:`XdpRecord`."""

    ports: list[int]
    ips: list[str]
    policy: str


class XdpRecord(TypedDict):
    """:meth:`Xdp.to_dict`: a NIC's XDP program in a lab's recorded state; a source's (``source``,
    ``section``, ``sha256``, ``object`` in base64, ``counters``) or xdp-filter's (``filter``)."""

    mode: str
    program: str
    summary: str
    source: NotRequired[str]
    section: NotRequired[str]
    sha256: NotRequired[str]
    object: NotRequired[str]
    counters: NotRequired[str | None]
    filter: NotRequired[XdpFilterRecord]


class TcRecord(TypedDict):
    """:meth:`Tc.to_dict` (``object`` in base64)."""

    source: str
    section: str
    direction: str
    summary: str
    sha256: str
    object: str


@dataclass(frozen=True)
class Xdp:
    """An XDP program on one NIC: built from ``source`` (its ``object``), or xdp-filter (``ports``,
    ``ips``, ``policy``), in ``mode``."""

    mode: str
    source: str | None = None  # as written, relative to the lab's directory
    section: str = "xdp"
    object: bytes = b""
    counters: str | None = None
    ports: tuple[int, ...] = ()
    ips: tuple[str, ...] = ()
    policy: str = "allow"
    line: int = 0
    path: str = ""

    @property
    def program(self) -> str:
        """``drop.c`` or ``xdp-filter``."""
        return self.source or "xdp-filter"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.object).hexdigest()

    def summary(self) -> str:
        """``XDP drop.c (native)``, ``XDP xdp-filter allow ports 9 (generic)``."""
        if self.source is not None:
            return f"XDP {self.source} ({self.mode})"
        rules = ([f"ports {','.join(map(str, self.ports))}"] if self.ports else []) + (
            [f"ips {','.join(self.ips)}"] if self.ips else [])
        return " ".join(["XDP xdp-filter", self.policy, *rules]) + f" ({self.mode})"

    def to_dict(self) -> XdpRecord:
        d: XdpRecord = {"mode": self.mode, "program": self.program, "summary": self.summary()}
        if self.source is not None:
            d["source"], d["section"], d["sha256"] = self.source, self.section, self.sha256
            d["object"], d["counters"] = base64.b64encode(self.object).decode(), self.counters
        else:
            d["filter"] = {"ports": list(self.ports), "ips": list(self.ips), "policy": self.policy}
        return d

    @classmethod
    def from_dict(cls, d: XdpRecord) -> Xdp:
        """From :meth:`to_dict`'s form (a lab's recorded state); lines are 0."""
        f = d.get("filter") if isinstance(d.get("filter"), dict) else None
        if f is not None:
            return cls(str(d.get("mode") or "generic"), ports=tuple(int(p) for p in f.get("ports") or ()),
                       ips=tuple(str(i) for i in f.get("ips") or ()), policy=str(f.get("policy") or "allow"))
        return cls(str(d.get("mode") or "generic"), source=str(d.get("source")), section=str(d.get("section") or "xdp"),
                   object=base64.b64decode(str(d.get("object") or "")),
                   counters=str(d["counters"]) if d.get("counters") else None)


@dataclass(frozen=True)
class Tc:
    """A tc BPF program on one NIC (clsact, direct action), built from ``source``, on ``direction``."""

    source: str
    object: bytes
    section: str = "tc"
    direction: str = "ingress"
    line: int = 0
    path: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.object).hexdigest()

    def summary(self) -> str:
        return f"tc {self.source} ({self.direction})"

    def to_dict(self) -> TcRecord:
        return {"source": self.source, "section": self.section, "direction": self.direction, "summary": self.summary(),
                "sha256": self.sha256, "object": base64.b64encode(self.object).decode()}

    @classmethod
    def from_dict(cls, d: TcRecord) -> Tc:
        return cls(str(d.get("source")), base64.b64decode(str(d.get("object") or "")), str(d.get("section") or "tc"),
                   str(d.get("direction") or "ingress"))


def nic_tc(nic: dict[str, Any]) -> Tc | None:
    """A NIC's tc program from its ``to_dict()`` form (None: it has none)."""
    x: TcRecord | None = nic.get("tc")
    return Tc.from_dict(x) if isinstance(x, dict) else None


def nic_xdp(nic: dict[str, Any]) -> Xdp | None:
    """A NIC's XDP program from its ``to_dict()`` form (None: it has none)."""
    x: XdpRecord | None = nic.get("xdp")
    return Xdp.from_dict(x) if isinstance(x, dict) else None


# --------------------------------------------------------------------------- parsing


def parse_xdp(check: Checker, m: YamlMap, path: str, model: str | None, trusted: tuple[Path, ...] = ()) -> Xdp | None:
    """A NIC's ``xdp`` (see the module's docstring); None when it has none or it is invalid (reported)."""
    x = check.section(m, "xdp", path)
    if x is None:
        return None
    where, line = join(path, "xdp"), m.value_line("xdp")
    before = len(check.problems)
    check.keys(x, where, XDP_KEYS)
    if ("source" in x) == ("filter" in x):
        check.add(line, where, "an XDP program is a source (C of the lab's directory) or filter (xdp-filter's rules)")
        return None
    mode = _mode(check, x, where, model)
    section = check.string(x, "section", where) or "xdp"
    if not _NAME.fullmatch(section):
        check.add(x.value_line("section"), join(where, "section"), f"invalid section name '{section}'")
    counters = check.string(x, "counters", where)
    if counters is not None and not _NAME.fullmatch(counters):
        check.add(x.value_line("counters"), join(where, "counters"), f"invalid map name '{counters}'")
    if "filter" in x:
        for key in ("section", "counters"):
            if key in x:
                check.add(x.key_line(key), join(where, key), f"{key} is for a source (xdp-filter has its own)")
        ports, ips, policy = _filter(check, x, where)
        if len(check.problems) > before or mode is None:
            return None
        return Xdp(mode, ports=ports, ips=ips, policy=policy, line=line, path=where)
    if len(check.problems) > before or mode is None:
        return None
    obj = _source(check, x, where, section, trusted)
    if obj is None:
        return None
    return Xdp(mode, source=check.string(x, "source", where), section=section, object=obj, counters=counters,
               line=line, path=where)


def parse_tc(check: Checker, m: YamlMap, path: str, trusted: tuple[Path, ...] = ()) -> Tc | None:
    """A NIC's ``tc``: ``{source: C of the lab's directory, section: tc, direction: ingress|egress}``, built
    as an XDP source is; None when it has none or it is invalid (reported)."""
    x = check.section(m, "tc", path)
    if x is None:
        return None
    where, line = join(path, "tc"), m.value_line("tc")
    before = len(check.problems)
    check.keys(x, where, TC_KEYS, ("source",), line)
    section = check.string(x, "section", where) or "tc"
    if not _NAME.fullmatch(section):
        check.add(x.value_line("section"), join(where, "section"), f"invalid section name '{section}'")
    direction = check.string(x, "direction", where) or "ingress"
    if direction not in DIRECTIONS:
        check.add(x.value_line("direction"), join(where, "direction"),
                  f"unknown direction '{direction}'{did_you_mean(direction, DIRECTIONS, 'expected one of')}")
    if len(check.problems) > before or "source" not in x:
        return None
    obj = _source(check, x, where, section, trusted, "tc")
    name = check.string(x, "source", where)
    if obj is None or name is None:
        return None
    return Tc(name, obj, section, direction, line, where)


def _mode(check: Checker, x: YamlMap, path: str, model: str | None) -> str | None:
    """The mode written, or the model's best; a native mode its driver lacks is refused."""
    native = model is not None and NIC_MODELS[model].native_xdp
    mode = check.string(x, "mode", path)
    if mode is None:
        return "native" if native else "generic"
    if mode not in MODES:
        check.add(x.value_line("mode"), join(path, "mode"),
                  f"unknown XDP mode '{mode}'{did_you_mean(mode, MODES, 'expected one of')}")
        return None
    if mode == "native" and model is not None and not native:
        drivers = "/".join(NIC_MODELS[model].drivers)
        having = ", ".join(m.name for m in NIC_MODELS.values() if m.native_xdp)
        check.add(x.value_line("mode"), join(path, "mode"),
                  f"{model}'s driver ({drivers}) has no native XDP: write mode: generic, or use a model whose "
                  f"driver has it ({having})")
        return None
    return mode


def _filter(check: Checker, x: YamlMap, path: str) -> tuple[tuple[int, ...], tuple[str, ...], str]:
    where = join(path, "filter")
    f = check.mapping(x["filter"], x.value_line("filter"), where, allow_null=False)
    if f is None:
        return (), (), "allow"
    check.keys(f, where, FILTER_KEYS)
    policy = check.string(f, "policy", where) or "allow"
    if policy not in POLICIES:
        check.add(f.value_line("policy"), join(where, "policy"),
                  f"unknown policy '{policy}'{did_you_mean(policy, POLICIES, 'expected one of')}")
    ports: list[int] = []
    items = check.sequence(f, "ports", where)
    for i, value in enumerate(items):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            check.add(items.item_line(i), f"{where}.ports[{i}]", f"expected a port 1..65535, got {describe(value)}")
        else:
            ports.append(value)
    ips: list[str] = []
    items = check.sequence(f, "ips", where)
    for i, value in enumerate(items):
        try:
            ips.append(str(ipaddress.ip_address(str(value))))
        except ValueError:
            check.add(items.item_line(i), f"{where}.ips[{i}]", f"invalid address '{value}'")
    if len(ports) + len(ips) > MAX_RULES:
        check.add(f.line, where, f"{len(ports) + len(ips)} rules: xdp-filter here takes at most {MAX_RULES}")
    if not (ports or ips) and policy == "allow":
        check.add(f.line, where, "an allow filter without ports or ips drops nothing (give it rules)")
    return tuple(ports), tuple(ips), policy


def _source(check: Checker, x: YamlMap, path: str, section: str, trusted: tuple[Path, ...],
            kind: str = "XDP") -> bytes | None:
    """The built object of ``source``, or None (reported: where it is, whether it is trusted, what the
    compiler said)."""
    name = check.string(x, "source", path, required=True)
    if name is None:
        return None
    line, where = x.value_line("source"), join(path, "source")
    top = Path(check.file).parent.resolve()
    target = (top / name).resolve()
    if name.startswith(("/", "~")) or top not in target.parents:
        check.add(line, where, f"{kind} source {name}: write a path relative to the lab file's directory (inside it)")
        return None
    if not target.is_file():
        check.add(line, where, f"{kind} source {name} does not exist in the lab file's directory")
        return None
    why = named_path_reason(target, trusted, check.owner, check.remote, check.remote_root)
    if why is not None:
        check.add(line, where, f"{kind} source {target} is not trusted (labctl builds it and a guest runs it): {why}; "
                               f"pass --trust-dir {shlex.quote(str(target.parent))} (or {TRUST_ENV}) if you trust it")
        return None
    try:
        data = read_capped(target, MAX_SOURCE)
        text = data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        check.add(line, where, f"{kind} source {target} cannot be read as text: {exc}")
        return None
    if len(data) > MAX_SOURCE:
        check.add(line, where, f"{kind} source {name} has over {MAX_SOURCE} bytes")
        return None
    why = include_problem(text, str(target.relative_to(top)), top,
                          trust=lambda p: named_path_reason(p, trusted, check.owner, check.remote, check.remote_root))
    if why is not None:
        check.add(line, where, f"{kind} source {name} is not built: {why}")
        return None
    built = build(target, top, section)
    if built.error:
        check.add(line, where, f"{kind} source {name} does not compile: {built.error}")
        return None
    return built.object
