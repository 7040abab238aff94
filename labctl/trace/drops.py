"""Every skb a guest's kernel dropped during a step, as a table; and which netfilter rule dropped.

A drop is a hit of ``skb:kfree_skb`` (labctl's probe on it, :mod:`.hops`): where (the caller of
kfree_skb, ``function+offset/size [module]``), why (the kernel's drop reason, 6.0 and later), the
device, the protocol (EtherType) and, for IPv4, IPv6 and ARP, the packet's headers. :func:`table` groups them by
(where, reason, device, protocol) with a count and the first few packets' headers. Frees of skbs
that never were network packets (no device, no protocol: unix sockets, netlink) are counted apart
(``local``): kfree_skb is also how the kernel frees those.

Netfilter: a ``NETFILTER_DROP`` says netfilter dropped, not which rule. The ruleset's counters
(``nft -a list ruleset`` before and after) do: :func:`moved_rules` names each rule with a drop
verdict whose counter moved, with its table and chain (iptables' rules appear there too, in their
``ip filter`` table).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from labctl.trace.hops import Event, drop_header, reason_name
from labctl.trace.nfhops import nft_chains

HEADERS_KEPT = 3
ETHERTYPES = {0x0800: "IPv4", 0x86DD: "IPv6", 0x0806: "ARP", 0x8100: "802.1Q", 0x88CC: "LLDP"}


class XdpDrop(TypedDict):
    """An XDP drop row's program (:class:`labctl.trace.xdpverdicts.XdpRow`): its own count, what xdpdump missed."""

    program: str
    mode: str
    own_count: int | None
    missed: int


class DropRecord(TypedDict):
    """One row of a step's drops (:meth:`DropRow.as_dict`, and XDP's :meth:`~labctl.trace.xdpverdicts.XdpRow.as_dict`)."""

    guest: str
    where: str
    function: str
    reason: str | None
    dev: str | None
    protocol: str
    count: int
    headers: list[str]
    rules: NotRequired[list[str]]  # the netfilter rules that dropped
    xdp: NotRequired[XdpDrop]


@dataclass
class DropRow:
    guest: str
    where: str
    reason: str | None
    dev: str | None
    protocol: str
    count: int = 0
    headers: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)

    @property
    def function(self) -> str:
        """``nft_do_chain`` of ``nft_do_chain+0x47f/0x5e0 [nf_tables]`` (what compare pairs by)."""
        return re.split(r"[+ ]", self.where, maxsplit=1)[0]

    def as_dict(self) -> DropRecord:
        out: DropRecord = {"guest": self.guest, "where": self.where, "function": self.function,
                           "reason": self.reason, "dev": self.dev, "protocol": self.protocol, "count": self.count,
                           "headers": self.headers}
        if self.rules:
            out["rules"] = self.rules
        return out


def protocol_name(ev: Event) -> str:
    n = ev.num("proto")
    if n is None:
        return "?"
    if n == 0:
        return "none"
    # the tracepoint's protocol is skb->protocol in network order, read as a little-endian u16 or printed host
    for value in (n, int.from_bytes(n.to_bytes(2, "little"), "big")):
        if value in ETHERTYPES:
            return ETHERTYPES[value]
    return f"0x{n:04x}"


def is_local(ev: Event) -> bool:
    """A free of an skb that never was a network packet (no device, no protocol)."""
    return ev.dev is None and ev.num("proto") in (0, None)


def table(events: list[Event], reasons: Sequence[str] | None = None) -> tuple[list[DropRow], int]:
    """Drop rows, most counted first, and how many local (non-network) frees were left out; ``reasons``:
    the kernel's drop reasons by number (:func:`labctl.trace.hops.reason_name`)."""
    rows: dict[tuple[object, ...], DropRow] = {}
    local = 0
    for ev in events:
        if ev.point != "drop":
            continue
        if is_local(ev):
            local += 1
            continue
        row = DropRow(ev.guest, ev.fields.get("loc") or "?", reason_name(ev, reasons), ev.dev, protocol_name(ev))
        key = (row.guest, row.where, row.reason, row.dev, row.protocol)
        row = rows.setdefault(key, row)
        row.count += 1
        if len(row.headers) < HEADERS_KEPT:
            h = drop_header(ev)
            if h is not None:
                row.headers.append(h.describe())
    return sorted(rows.values(), key=lambda r: (-r.count, r.guest, r.where)), local


# ---------------------------------------------------------------------- netfilter


@dataclass(frozen=True)
class Rule:
    family: str
    table: str
    chain: str
    handle: str
    text: str
    packets: int
    verdict: str  # drop, reject, or ""

    @property
    def name(self) -> str:
        return f"nftables rule '{self.text}' (table {self.family} {self.table}, chain {self.chain}, handle {self.handle})"


_COUNTER = re.compile(r"\bcounter packets (\d+) bytes \d+\s*")
_HANDLE = re.compile(r"\s*# handle (\d+)\s*$")


def parse_ruleset(text: str) -> tuple[dict[tuple[str, str, str, str], Rule], dict[tuple[str, str, str], str]]:
    """``nft -a list ruleset``: rules with counters by (family, table, chain, handle), and each base
    chain's policy by (family, table, chain)."""
    rules: dict[tuple[str, str, str, str], Rule] = {}
    lines, policies = nft_chains(text)
    for (family, tbl, chain), body in lines.items():
        for line in body:
            if (c := _COUNTER.search(line)) and (h := _HANDLE.search(line)):
                text_ = _HANDLE.sub("", _COUNTER.sub("counter ", line)).strip()
                verdict = next((v for v in ("drop", "reject") if re.search(rf"\b{v}\b", line)), "")
                rules[(family, tbl, chain, h.group(1))] = Rule(family, tbl, chain, h.group(1), text_,
                                                               int(c.group(1)), verdict)
    return rules, policies


class GuestDrops(TypedDict):
    """One guest's drops over a step: how many (the kernel's and its XDP programs'), the skbs freed
    locally (not drops), the trace's lost events, how it traced, its notes."""

    drops: int
    local_frees: int
    lost: int
    mode: str | None
    notes: list[str]


class DropSummary(TypedDict):
    """A step's drops (summary.json's ``drops``): the total, each guest's, the biggest rows."""

    total: int
    guests: dict[str, GuestDrops]
    rows: list[DropRecord]  # labctl.trace.drops.DropRow.as_dict, and XDP's rows
    rows_left_out: int


def moved_rules(before: str, after: str) -> list[tuple[Rule, int]]:
    """The rules with a drop or reject verdict whose packet counter moved between two listings."""
    old, _ = parse_ruleset(before)
    new, _ = parse_ruleset(after)
    out = []
    for key, rule in new.items():
        moved = rule.packets - (old[key].packets if key in old else 0)
        if moved > 0 and rule.verdict:
            out.append((rule, moved))
    return out


def netfilter_note(before: str, after: str) -> str | None:
    """What dropped, from the counters: ``nftables rule '...' (table inet filter, chain input, handle 2)``,
    or the chains whose policy drops when no rule's counter moved."""
    moved = moved_rules(before, after)
    if moved:
        return "; ".join(f"{r.name}, {n} packet(s)" if len(moved) > 1 else r.name for r, n in moved)
    _, policies = parse_ruleset(after)
    drops = [f"{f} {t} chain {c}" for (f, t, c), p in policies.items() if p == "drop"]
    if drops:
        return "the policy of " + " or ".join(f"table {d}" for d in drops) + " (no rule's counter moved)"
    return None
