"""A guest's firewall and NAT as data: nftables chains and rules, masquerade, SNAT and DNAT with
port maps, or an nft file from the lab's directory; checked with their lines, and rendered as the
one nft script the guest loads (:meth:`Firewall.script`).

::

    guests:
      r:
        firewall:
          filter:                                   # chains of table inet labctl, one per hook
            input: {policy: accept, rules: ["ip6 saddr fd00:1::/64 tcp dport 22 drop"]}
            forward: {policy: drop, rules: ["ct state established,related accept", "iifname eth1 accept"]}
          nat:
            masquerade: [{out: eth2}]                               # src: 10.1.0.0/24 to narrow it
            snat: [{out: eth3, src: 10.1.0.0/24, to: "192.0.2.1:61000-62000"}]
            dnat: [{in: eth2, port: 8080, to: "10.1.0.2:80"}]      # proto: tcp (or udp), dst: 192.0.2.1
          file: r.nft                                # loaded first (it may flush the ruleset)

Everything labctl writes lives in one table, ``inet labctl`` (IPv4 and IPv6 alike): a chain per
filter hook (``prerouting``, ``input``, ``forward``, ``output``, ``postrouting``; policy ``accept``
or ``drop``), ``nat_prerouting`` (DNAT) and ``nat_postrouting`` (masquerade, SNAT). A rule is one
nft rule as ``nft add rule`` takes it: one line, no ``;``, braces balanced. Whether nft takes it
only the guest knows: ``up`` checks the whole script with ``nft -c`` there before loading it, and a
rule nft refuses fails ``up`` at its line (:mod:`labctl.up.firewall`).

``file`` is a path relative to the lab file's directory and inside it, a regular file of at most
64 KiB of UTF-8 text, trusted as every host path a lab file names (:mod:`labctl.lab.trust`) and,
for a lab file of another user, owned by that user (the rule of shares, :mod:`labctl.lab.shares`).
It is read with the lab file, as part of it: its text is in the resolved lab (so in the post-boot
snapshot's key, a bundle's manifest and ``compare``), never read again.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from labctl.lab.checker import Checker, close_match, describe, did_you_mean, host_address, join
from labctl.lab.trust import TRUST_ENV, owner_name, untrusted_reason
from labctl.lab.yamlpos import YamlMap

__all__ = ["FIREWALL_KEYS", "HOOKS", "TABLE", "Chain", "ChainRecord", "Firewall", "FirewallRecord", "NatRule",
           "NatRuleRecord", "NftFile", "NftFileRecord", "Rule", "ScriptLine", "check_interfaces", "parse_firewall"]

FIREWALL_KEYS = ("filter", "nat", "file")
CHAIN_KEYS = ("policy", "rules")
NAT_KEYS = ("masquerade", "snat", "dnat")
MASQUERADE_KEYS = ("out", "src")
SNAT_KEYS = ("out", "src", "to")
DNAT_KEYS = ("in", "dst", "proto", "port", "to")
HOOKS = ("prerouting", "input", "forward", "output", "postrouting")
POLICIES = ("accept", "drop")
PROTOS = ("tcp", "udp")
TABLE = "inet labctl"
MAX_RULES = 256
MAX_RULE = 1000
MAX_FILE = 64 * 1024  # its text travels in one SSH command line (the guest's bash -c: 128 KiB at most)
_PORTS = re.compile(r"(\d{1,5})(?:-(\d{1,5}))?")


class ChainRecord(TypedDict):
    """:meth:`Chain.to_dict` (its hook is its key in :class:`FirewallRecord`'s ``filter``)."""

    policy: str
    rules: list[str]


NatRuleRecord = TypedDict("NatRuleRecord", {
    "type": str,  # masquerade, snat, dnat
    "in": NotRequired[str],  # a DNAT's interface
    "out": NotRequired[str],  # a masquerade's or SNAT's
    "src": NotRequired[str],
    "dst": NotRequired[str],
    "proto": NotRequired[str],
    "port": NotRequired[str],
    "to": NotRequired[str],
})
""":meth:`NatRule.to_dict`: the keys left out are the rule's Nones."""


class NftFileRecord(TypedDict):
    """:meth:`NftFile.to_dict`."""

    name: str
    sha256: str
    text: str
    source: str


class FirewallRecord(TypedDict):
    """:meth:`Firewall.to_dict`: a guest's firewall in a lab's recorded state."""

    table: str
    filter: dict[str, ChainRecord]
    nat: list[NatRuleRecord]
    file: NftFileRecord | None


@dataclass(frozen=True)
class Rule:
    """One nft rule of a filter chain, as written."""

    text: str
    line: int = 0
    path: str = ""


@dataclass(frozen=True)
class Chain:
    """A base chain of table inet labctl on ``hook`` (its name), with its policy and rules."""

    hook: str
    policy: str = "accept"
    rules: tuple[Rule, ...] = ()
    line: int = 0
    path: str = ""

    def to_dict(self) -> ChainRecord:
        return {"policy": self.policy, "rules": [r.text for r in self.rules]}


def _family(address: str) -> str:
    """``ip6`` or ``ip``: the family of an address, a prefix or a NAT target (``ADDR:PORT``, ``[V6]:PORT``)."""
    return "ip6" if address.startswith("[") or address.count(":") > 1 else "ip"


@dataclass(frozen=True)
class NatRule:
    """A masquerade, SNAT or DNAT: out of (or, DNAT, into) ``iface``, for ``src`` (``dst``), a
    DNAT's ``proto`` and ``port`` (``8080`` or ``8080-8090``), to ``to`` (``ADDR``, ``ADDR:PORT``,
    ``ADDR:P1-P2``, ``[V6]:PORT``)."""

    kind: str  # masquerade, snat, dnat
    iface: str
    src: str | None = None
    dst: str | None = None
    proto: str | None = None
    port: str | None = None
    to: str | None = None
    line: int = 0
    path: str = ""
    iface_line: int = 0

    def nft(self) -> str:
        """The rule as nft takes it (in an inet table: the family said where nft needs it)."""
        if self.kind == "dnat":
            parts = [f'iifname "{self.iface}"']
            if self.dst:
                parts.append(f"{_family(self.dst)} daddr {self.dst}")
            if self.port:
                parts.append(f"{self.proto or 'tcp'} dport {self.port}")
            parts.append(f"dnat {_family(self.to or '')} to {self.to}")
            return " ".join(parts)
        parts = [f'oifname "{self.iface}"']
        if self.src:
            parts.append(f"{_family(self.src)} saddr {self.src}")
        parts.append("masquerade" if self.kind == "masquerade" else f"snat {_family(self.to or '')} to {self.to}")
        return " ".join(parts)

    def text(self) -> str:
        """``masquerade out eth2``, ``snat out eth3 from 10.1.0.0/24 to 192.0.2.1``,
        ``dnat in eth2 tcp 8080 to 10.1.0.2:80``."""
        if self.kind == "dnat":
            what = [f"dnat in {self.iface}"] + ([f"to {self.dst}"] if self.dst else [])
            what += [f"{self.proto or 'tcp'} {self.port}"] if self.port else []
            return " ".join([*what, "→", str(self.to)])
        what = [f"{self.kind} out {self.iface}"] + ([f"from {self.src}"] if self.src else [])
        return " ".join(what + ([f"to {self.to}"] if self.to else []))

    def to_dict(self) -> NatRuleRecord:
        out: NatRuleRecord = {"type": self.kind}
        if self.kind == "dnat":
            out["in"] = self.iface
        else:
            out["out"] = self.iface
        if self.src is not None:
            out["src"] = self.src
        if self.dst is not None:
            out["dst"] = self.dst
        if self.proto is not None:
            out["proto"] = self.proto
        if self.port is not None:
            out["port"] = self.port
        if self.to is not None:
            out["to"] = self.to
        return out

    @classmethod
    def from_dict(cls, d: NatRuleRecord) -> NatRule:
        kind = str(d.get("type"))

        def opt(v: object) -> str | None:
            return str(v) if v is not None else None

        return cls(kind, str(d.get("in") if kind == "dnat" else d.get("out")), opt(d.get("src")), opt(d.get("dst")),
                   opt(d.get("proto")), opt(d.get("port")), opt(d.get("to")))


@dataclass(frozen=True)
class NftFile:
    """An nft file of the lab's directory: its name as written and its text, read with the lab."""

    name: str
    text: str
    line: int = 0
    path: str = ""
    source: str = ""  # its absolute path on this machine (where its lines are)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def to_dict(self) -> NftFileRecord:
        return {"name": self.name, "sha256": self.sha256, "text": self.text, "source": self.source}


@dataclass(frozen=True)
class ScriptLine:
    """What a line of the rendered script comes from: its lab line, data path and what it is."""

    line: int
    path: str
    what: str


@dataclass(frozen=True)
class Firewall:
    """A guest's firewall: filter chains, NAT rules and an nft file (loaded first)."""

    chains: tuple[Chain, ...] = ()
    nat: tuple[NatRule, ...] = ()
    file: NftFile | None = None
    line: int = 0
    path: str = ""
    lines: dict[int, ScriptLine] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> FirewallRecord:
        return {"table": TABLE, "filter": {c.hook: c.to_dict() for c in self.chains},
                "nat": [n.to_dict() for n in self.nat], "file": self.file.to_dict() if self.file else None}

    @classmethod
    def from_dict(cls, d: FirewallRecord) -> Firewall:
        """From :meth:`to_dict`'s form (a lab's recorded state); lines are 0."""
        chains = tuple(Chain(str(h), str((c.get("policy") if c else None) or "accept"),
                             tuple(Rule(str(r)) for r in (c.get("rules") if c else None) or ()))
                       for h, c in (d.get("filter") or {}).items())
        nat = tuple(NatRule.from_dict(n) for n in d.get("nat") or () if isinstance(n, dict))
        f = d.get("file")
        file = NftFile(str(f.get("name")), str(f.get("text") or ""), source=str(f.get("source") or "")) \
            if isinstance(f, dict) else None
        return cls(chains, nat, file)

    def script(self, include: str | None = None) -> tuple[str, dict[int, ScriptLine]]:
        """The nft script that loads it, and what each of its lines (1-based) comes from.

        ``include``: where the guest has the nft file (included first); the table is deleted
        before it is made, so the script loads the same on a guest that has it already.
        """
        out: list[tuple[str, ScriptLine | None]] = []
        where = ScriptLine(self.line, self.path, "the firewall")
        if self.file is not None and include is not None:
            out.append((f'include "{include}"', ScriptLine(self.file.line, self.file.path, f"nft file {self.file.name}")))
        if self.chains or self.nat:
            out += [(f"table {TABLE}", where), (f"delete table {TABLE}", where), (f"table {TABLE} {{", where)]
            for c in self.chains:
                head = ScriptLine(c.line, c.path, f"chain {c.hook}")
                out += [(f"  chain {c.hook} {{", head),
                        (f"    type filter hook {c.hook} priority filter; policy {c.policy};", head)]
                out += [(f"    {r.text}", ScriptLine(r.line, r.path, f"rule '{r.text}'")) for r in c.rules]
                out.append(("  }", head))
            for hook, kinds, prio in (("prerouting", ("dnat",), "dstnat"),
                                      ("postrouting", ("masquerade", "snat"), "srcnat")):
                rules = [n for n in self.nat if n.kind in kinds]
                if not rules:
                    continue
                head = ScriptLine(rules[0].line, rules[0].path, f"NAT chain nat_{hook}")
                out += [(f"  chain nat_{hook} {{", head),
                        (f"    type nat hook {hook} priority {prio}; policy accept;", head)]
                out += [(f"    {n.nft()}", ScriptLine(n.line, n.path, n.text())) for n in rules]
                out.append(("  }", head))
            out.append(("}", where))
        text = "".join(line + "\n" for line, _ in out)
        return text, {i + 1: ref for i, (_, ref) in enumerate(out) if ref is not None}

    def summary(self) -> list[str]:
        """Short lines for status, the graph and the report: ``nat: masquerade out eth2; ...``,
        ``filter input (policy accept): 1 rule``, ``nft file r.nft``."""
        lines = []
        if self.nat:
            lines.append("nat: " + "; ".join(n.text() for n in self.nat))
        for c in self.chains:
            n = len(c.rules)
            lines.append(f"filter {c.hook} (policy {c.policy}): {n} rule{'s' if n != 1 else ''}")
        if self.file is not None:
            lines.append(f"nft file {self.file.name} ({len(self.file.text.splitlines())} lines)")
        return lines


# --------------------------------------------------------------------------- parsing


def parse_firewall(check: Checker, body: YamlMap, path: str, base: Path,
                   trusted: tuple[Path, ...] = ()) -> Firewall | None:
    """A guest's ``firewall`` (see the module's docstring); None when it has none or it is invalid
    (reported). Interfaces named by NAT rules are checked by :func:`check_interfaces`."""
    m = check.section(body, "firewall", path)
    if m is None:
        return None
    where, line = join(path, "firewall"), body.value_line("firewall")
    before = len(check.problems)
    check.keys(m, where, FIREWALL_KEYS)
    if not any(k in m for k in FIREWALL_KEYS):
        check.add(line, where, f"a firewall needs {', '.join(FIREWALL_KEYS[:-1])} or {FIREWALL_KEYS[-1]}")
    chains = _chains(check, m, where)
    nat = _nat(check, m, where)
    file = _file(check, m, where, base, trusted)
    if len(check.problems) > before:
        return None
    return Firewall(chains, nat, file, line, where)


def _chains(check: Checker, m: YamlMap, path: str) -> tuple[Chain, ...]:
    out = []
    for hook, value, cpath, line, vline in check.entries(m, "filter", path):
        if hook not in HOOKS:
            check.add(line, cpath, f"unknown hook '{hook}'{did_you_mean(hook, HOOKS, 'a chain per hook')}")
            continue
        c = check.mapping(value, vline, cpath, allow_null=False)
        if c is None:
            continue
        check.keys(c, cpath, CHAIN_KEYS)
        policy = check.string(c, "policy", cpath) or "accept"
        if policy not in POLICIES:
            check.add(c.value_line("policy"), join(cpath, "policy"),
                      f"unknown policy '{policy}'{did_you_mean(policy, POLICIES, 'expected one of')}")
        out.append(Chain(hook, policy, _rules(check, c, cpath), line, cpath))
    return tuple(out)


def _rules(check: Checker, c: YamlMap, path: str) -> tuple[Rule, ...]:
    items = check.sequence(c, "rules", path)
    if len(items) > MAX_RULES:
        check.add(c.value_line("rules"), join(path, "rules"), f"{len(items)} rules: a chain has at most {MAX_RULES}")
        return ()
    out = []
    for i, value in enumerate(items):
        rpath, line = f"{path}.rules[{i}]", items.item_line(i)
        if not isinstance(value, str):
            check.add(line, rpath, f"expected an nft rule as a string, got {describe(value)}")
            continue
        why = rule_problem(value)
        if why is not None:
            check.add(line, rpath, why)
            continue
        out.append(Rule(value.strip(), line, rpath))
    return tuple(out)


def rule_problem(text: str) -> str | None:
    """Why ``text`` cannot be one rule of a chain, or None (what nft thinks of it, the guest says)."""
    rule = text.strip()
    if not rule:
        return "an empty rule"
    if len(rule) > MAX_RULE:
        return f"a rule of {len(rule)} characters: at most {MAX_RULE}"
    if any(c in rule for c in "\n\r\0"):
        return "a rule is one line"
    if ";" in rule:
        return "a rule has no ';' (write each rule as an item of rules)"
    depth = 0
    for c in rule:
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth < 0:
            break
    if depth != 0:
        return "its braces are not balanced"
    return None


def _nat(check: Checker, m: YamlMap, path: str) -> tuple[NatRule, ...]:
    nat = check.section(m, "nat", path)
    if nat is None:
        return ()
    where = join(path, "nat")
    check.keys(nat, where, NAT_KEYS)
    out: list[NatRule] = []
    for kind, keys in (("masquerade", MASQUERADE_KEYS), ("snat", SNAT_KEYS), ("dnat", DNAT_KEYS)):
        items = check.sequence(nat, kind, where)
        for n, npath, line in check.mappings(items, f"{where}.{kind}"):
            iface_key = "in" if kind == "dnat" else "out"
            required = (iface_key,) + (("to",) if kind != "masquerade" else ())
            check.keys(n, npath, keys, required, line)
            rule = _nat_rule(check, n, npath, kind, iface_key, line)
            if rule is not None:
                out.append(rule)
    return tuple(out)


def _nat_rule(check: Checker, n: YamlMap, path: str, kind: str, iface_key: str, line: int) -> NatRule | None:
    before = len(check.problems)
    iface = check.string(n, iface_key, path, required=True)
    if iface is not None and not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9_.-]{0,14}", iface):
        check.add(n.value_line(iface_key), join(path, iface_key), f"invalid interface name '{iface}'")
    src = _prefix(check, n, "src", path)
    dst = _prefix(check, n, "dst", path)
    proto = check.string(n, "proto", path)
    if proto is not None and proto not in PROTOS:
        check.add(n.value_line("proto"), join(path, "proto"), f"unknown protocol '{proto}' (expected tcp or udp)")
    port = _ports(check, n, "port", path)
    if proto is not None and "port" not in n:
        check.add(n.value_line("proto"), join(path, "proto"), "a protocol means something only with a port")
    to = _target(check, n, path, kind, "port" in n) if "to" in n else None
    families = {_family(x) for x in (src, dst, to) if x}
    if len(families) > 1:
        check.add(line, path, "its addresses are of two families (IPv4 and IPv6)")
    if len(check.problems) > before or iface is None:
        return None
    return NatRule(kind, iface, src, dst, proto if port else None, port, to, line, path, n.value_line(iface_key))


def _prefix(check: Checker, n: YamlMap, key: str, path: str) -> str | None:
    text = check.string(n, key, path)
    if text is None:
        return None
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError:
        check.add(n.value_line(key), join(path, key), f"invalid address or prefix '{text}' (host bits clear)")
        return None
    return str(net) if net.prefixlen != net.max_prefixlen else str(net.network_address)


def _ports(check: Checker, n: YamlMap, key: str, path: str) -> str | None:
    value = n.get(key)
    if value is None:
        return None
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    why = ports_problem(text) if isinstance(text, str) else f"expected a port or a range, got {describe(value)}"
    if why is not None:
        check.add(n.value_line(key), join(path, key), why)
        return None
    assert isinstance(text, str)
    return text


def ports_problem(text: str) -> str | None:
    """Why ``text`` is not a port (1-65535) or a range ``P1-P2`` (P1 < P2), or None."""
    m = _PORTS.fullmatch(text)
    if m is None:
        return f"invalid port '{text}' (a port such as 8080 or a range such as 8080-8090)"
    low, high = int(m.group(1)), int(m.group(2) or m.group(1))
    if not (1 <= low <= 65535 and 1 <= high <= 65535):
        return f"port {text} is out of range (1..65535)"
    if m.group(2) and low >= high:
        return f"port range {text} is empty or backwards"
    return None


def _target(check: Checker, n: YamlMap, path: str, kind: str, mapped: bool) -> str | None:
    """A SNAT's or DNAT's ``to``: ``ADDR``, ``ADDR:PORT[-PORT]`` or ``[V6]:PORT[-PORT]``."""
    text = check.string(n, "to", path, required=True)
    if text is None:
        return None
    line, where = n.value_line("to"), join(path, "to")
    address, ports = text, None
    if text.startswith("["):
        address, _, rest = text[1:].partition("]")
        ports = rest[1:] if rest.startswith(":") else None
        if rest and ports is None:
            check.add(line, where, f"invalid target '{text}' (write [ADDRESS]:PORT)")
            return None
    elif text.count(":") == 1:
        address, ports = text.split(":")
    ip = host_address(check, address, line, where,
                      f"invalid target '{text}' (an address, ADDRESS:PORT, or [IPv6]:PORT)", "a NAT target")
    if ip is None:
        return None
    if ports is not None:
        why = ports_problem(ports)
        if why is not None:
            check.add(line, where, why)
            return None
        if kind == "dnat" and not mapped:
            check.add(line, where, "a target port needs the port it maps (port)")
            return None
    if ports is None:
        return str(ip)
    return f"[{ip}]:{ports}" if ip.version == 6 else f"{ip}:{ports}"


# --------------------------------------------------------------------------- the nft file


def _file(check: Checker, m: YamlMap, path: str, base: Path, trusted: tuple[Path, ...]) -> NftFile | None:
    name = check.string(m, "file", path)
    if name is None:
        return None
    line, where = m.value_line("file"), join(path, "file")
    why, target = file_problem(name, base, trusted, check.owner)
    if why is not None or target is None:
        check.add(line, where, why or f"nft file {name}: cannot be read")
        return None
    try:
        text = target.read_bytes().decode()
    except (OSError, UnicodeDecodeError) as exc:
        check.add(line, where, f"nft file {target} cannot be read as UTF-8 text: {exc}")
        return None
    return NftFile(name, text, line, where, str(target))


def file_problem(name: str, base: Path, trusted: tuple[Path, ...] = (),
                 owner: int | None = None) -> tuple[str | None, Path | None]:
    """(why the nft file ``name`` of a lab in directory ``base`` cannot be used, or None; its
    resolved path). ``owner``: the uid that owns the lab file (None: text given, not a file)."""
    if name.startswith(("/", "~")):
        return f"nft file {name}: write a path relative to the lab file's directory (inside it)", None
    top = base.resolve()
    target = (top / name).resolve()
    if top not in target.parents:
        return f"nft file {name} is not inside the lab file's directory", None
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return f"nft file {name} does not exist in the lab file's directory", None
    except OSError as exc:
        return f"nft file {target} cannot be read: {exc.strerror or exc}", None
    if not stat.S_ISREG(st.st_mode):
        return f"nft file {target} is not a regular file", None
    if st.st_size > MAX_FILE:
        return f"nft file {target} has {st.st_size} bytes: at most {MAX_FILE}", None
    why = untrusted_reason(target, trusted)
    if why is not None:
        return (f"nft file {target} is not trusted (the guest's firewall is made of it): {why}; "
                f"pass --trust-dir {shlex.quote(str(target.parent))} (or {TRUST_ENV}) if you trust it"), None
    me = os.geteuid()
    if owner is not None and owner not in (me, 0) and st.st_uid != owner:
        return (f"nft file {target} belongs to {owner_name(st.st_uid)}, and the lab file to {owner_name(owner)}: "
                "a lab file of another user names only files that user owns"), None
    return None, target


# --------------------------------------------------------------------------- across the guest


def check_interfaces(check: Checker, fw: Firewall | None, guest: str, names: set[str], mgmt_nic: str,
                     mgmt_subnet: ipaddress.IPv4Network) -> None:
    """The interfaces NAT rules name are the guest's own (never the management NIC ``mgmt_nic``),
    and their addresses are outside the management subnet."""
    if fw is None:
        return
    for n in fw.nat:
        for key, text in (("src", n.src), ("dst", n.dst), ("to", n.to)):
            if text and _family(text) == "ip" and ipaddress.ip_network(text.split(":")[0], strict=False).overlaps(mgmt_subnet):
                check.add(n.line, f"{n.path}.{key}", f"{text} is in {mgmt_subnet}, labctl's management network")
        if n.iface == mgmt_nic:
            key = "in" if n.kind == "dnat" else "out"
            check.add(n.iface_line, f"{n.path}.{key}", f"{mgmt_nic} is labctl's management NIC: its traffic is labctl's")
        elif n.iface not in names:
            key = "in" if n.kind == "dnat" else "out"
            hint = close_match(n.iface, names) or f" (its interfaces: {', '.join(sorted(names)) or 'none'})"
            check.add(n.iface_line, f"{n.path}.{key}", f"guest {guest} has no interface '{n.iface}'{hint}")
