"""Netfilter at a followed packet's hops: its NAT rewrites, its conntrack state, the nftables chain and rule.

* **NAT** (:func:`continues`, :func:`rewrite`): NAT changes what names a packet (its addresses, ports,
  ICMP echo id), so after a rewrite its events carry another identity. Within one guest the skb is
  the same object from the receive to the send (``netif_receive_skb`` → ``ip_forward`` after
  PREROUTING's DNAT, ``ip_forward`` → ``net_dev_queue`` after POSTROUTING's SNAT), and what NAT
  leaves alone (the family, the protocol, IPv4's id, the ICMP echo sequence, TCP's sequence number,
  UDP's length) must match: then the rewritten events are the same packet, and the hop after the
  rewrite says it (``SNAT 10.1.0.2:40000 → 10.2.0.1:61000``), the reply's reverse rewrite too.
* **Conntrack** (:func:`ct_state`): the probes fetch ``skb->_nfct`` where conntrack has run (forward,
  local delivery, each nftables chain): the entry's address with the state in its low 3 bits
  (``enum ip_conntrack_info``); no entry where another packet of the guest had one: invalid.
* **nftables** (:func:`chain_name`, :func:`dropping_rule`): the probe on ``nft_do_chain`` names the base
  chain a packet entered (table family, table, chain); a packet dropped by nftables was dropped by the
  last chain it entered, and the ruleset listed when the follow started names the rule there: the
  chain's one rule with a drop verdict, the one whose counter moved, or its policy.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from labctl.trace.hops import Event, Header, _ip

# enum ip_conntrack_info (the low 3 bits of skb->_nfct)
CT_STATES = {0: "established", 1: "related", 2: "new", 3: "established, reply", 4: "related, reply", 7: "untracked"}
NFPROTO = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}
# hops where the same skb may come back rewritten: after PREROUTING (received → forwarded or taken
# in) and after POSTROUTING (forwarded → queued to a device); an nftables chain sees it between
RECEIVED = ("netif_rx", "nft")
REWRITTEN_AFTER_RX = ("ip_fwd", "ip6_fwd", "ip_local", "ip6_local", "tcp_rcv", "tcp6_rcv", "nft")
FORWARDED = ("ip_fwd", "ip6_fwd", "nft")
REWRITTEN_AFTER_FWD = ("dev_queue", "nft")


def ct_state(ev: Event) -> str | None:
    """The packet's conntrack state at ``ev`` (``new``, ``established``, ``related``..., ``none``: no
    entry), None where the probe does not fetch it."""
    ct = ev.num("ct")
    if ct is None:
        return None
    if ct == 0:
        return "none"
    return CT_STATES.get(ct & 7, f"state {ct & 7}")


def chain_name(ev: Event) -> str:
    """``nft inet labctl input`` of an ``nft`` event."""
    fam = ev.num("tfam")
    return f"nft {NFPROTO.get(fam or 0, f'family {fam}')} {ev.fields.get('table', '?')} {ev.fields.get('chain', '?')}"


def _invariant(h: Header) -> tuple[object, ...]:
    """What NAT never changes in a packet."""
    rest: tuple[object, ...] = ()
    if h.is_echo(1) or h.is_echo(2):
        rest = (h.l4[0], struct.unpack(">H", h.l4[6:8])[0])  # type, sequence (the id may be mapped)
    elif h.proto == 6 and len(h.l4) >= 8:
        rest = (struct.unpack(">I", h.l4[4:8])[0],)
    elif h.proto == 17 and len(h.l4) >= 6:
        rest = (struct.unpack(">H", h.l4[4:6])[0],)
    return (h.family, h.proto, h.ipid if h.family == 4 else h.length, h.offset, rest)


def continues(before: Event, after: Event, old: Header, new: Header) -> bool:
    """Whether ``after`` is the skb of ``before`` (same guest, same skb) rewritten by NAT: a step where
    netfilter runs between them, and everything NAT leaves alone the same."""
    if old.key() == new.key() or old.family not in (4, 6):
        return False
    step = ((before.point in RECEIVED and after.point in REWRITTEN_AFTER_RX)
            or (before.point in FORWARDED and after.point in REWRITTEN_AFTER_FWD))
    return step and _invariant(old) == _invariant(new)


def _end(h: Header, src: bool) -> str:
    addr = _ip(h.saddr if src else h.daddr, h.family)
    ports = h.ports()
    if ports is not None:
        return f"[{addr}]:{ports[0 if src else 1]}" if h.family == 6 else f"{addr}:{ports[0 if src else 1]}"
    if h.is_echo(1) or h.is_echo(2):
        return f"{addr} id {struct.unpack('>H', h.l4[4:6])[0]}"
    return addr


def rewrite(old: Header, new: Header, reply: bool = False) -> str:
    """``SNAT 10.1.0.2 id 7 → 10.2.0.1 id 7``, ``DNAT 10.2.0.1:8080 → 10.1.0.2:80``; ``reply``: a reply of
    a connection NAT rewrote, rewritten back (conntrack's reply direction)."""
    echo = old.is_echo(1) or old.is_echo(2)
    ident = struct.unpack(">H", old.l4[4:6])[0] != struct.unpack(">H", new.l4[4:6])[0] if echo else False
    parts = []
    if old.saddr != new.saddr or (old.ports() or (0, 0))[0] != (new.ports() or (0, 0))[0] or (ident and not reply):
        parts.append(f"SNAT {_end(old, True)} → {_end(new, True)}")
    if old.daddr != new.daddr or (old.ports() or (0, 0))[1] != (new.ports() or (0, 0))[1] or (ident and reply):
        parts.append(f"DNAT {_end(old, False)} → {_end(new, False)}")
    text = "; ".join(parts) or "NAT"
    return text + (" (the reply, rewritten back)" if reply else "")


@dataclass(frozen=True)
class ChainRule:
    handle: str
    text: str
    verdict: str  # drop, reject, accept, jump, ""
    comment: str
    packets: int | None


_TABLE = re.compile(r"^table (\S+) (\S+) \{")
_CHAIN = re.compile(r"^chain (\S+) \{")
_HANDLE = re.compile(r"\s*# handle (\d+)\s*$")
_COMMENT = re.compile(r'\bcomment "((?:[^"\\]|\\.)*)"')
_COUNTER = re.compile(r"\bcounter packets (\d+) bytes \d+")
_POLICY = re.compile(r"\bpolicy (\w+);")


def nft_chains(ruleset: str) -> tuple[dict[tuple[str, str, str], list[str]], dict[tuple[str, str, str], str]]:
    """``nft -a list ruleset``, chain by chain: the lines after each chain's opening line (stripped; a
    base chain's ``type ... hook ... policy`` line left out) by (family, table, chain), and each base
    chain's policy."""
    lines: dict[tuple[str, str, str], list[str]] = {}
    policies: dict[tuple[str, str, str], str] = {}
    family = table = ""
    key: tuple[str, str, str] | None = None
    for raw in ruleset.splitlines():
        line = raw.strip()
        if m := _TABLE.match(line):
            family, table, key = m.group(1), m.group(2), None
        elif m := _CHAIN.match(line):
            key = (family, table, m.group(1))
            lines.setdefault(key, [])
        elif key is None:
            continue
        elif line.startswith("type ") and (p := _POLICY.search(line)):
            policies[key] = p.group(1)
        else:
            lines[key].append(line)
    return lines, policies


def chains(ruleset: str) -> tuple[dict[tuple[str, str, str], list[ChainRule]], dict[tuple[str, str, str], str]]:
    """``nft -a list ruleset``: each chain's rules by (family, table, chain), and each base chain's policy."""
    lines, policies = nft_chains(ruleset)
    return {key: [_chain_rule(h.group(1), line) for line in body if (h := _HANDLE.search(line))]
            for key, body in lines.items()}, policies


def _chain_rule(handle: str, line: str) -> ChainRule:
    body = _HANDLE.sub("", line)
    comment = _COMMENT.search(body)
    counter = _COUNTER.search(body)
    verdict = next((v for v in ("drop", "reject", "accept", "jump", "goto")
                    if re.search(rf"(^|\s){v}(\s|$)", _COMMENT.sub("", body))), "")
    return ChainRule(handle, body, verdict, comment.group(1) if comment else "",
                     int(counter.group(1)) if counter else None)


def _named(family: str, table: str, chain: str, r: ChainRule) -> str:
    """The rule by its handle, and its comment, else its own text (its counter's figures left out)."""
    text = f"comment '{r.comment}'" if r.comment else f"'{_COUNTER.sub('counter', r.text).strip()}'"
    return f"nft {family} {table} {chain} handle {r.handle} ({text})"


def dropping_rule(ev: Event, ruleset: str, after: str = "") -> str:
    """Which rule of the chain of the ``nft`` event ``ev`` dropped the packet: ``nft inet filter forward
    handle 7 (comment 'no ssh')``; the chain's only rule with a drop or reject verdict, else the one whose
    counter moved between ``ruleset`` and ``after`` (a later listing), else the chain's policy, else just
    the chain (and its candidate rules' handles)."""
    name = chain_name(ev)
    family = NFPROTO.get(ev.num("tfam") or 0, "")
    key = (family, ev.fields.get("table", ""), ev.fields.get("chain", ""))
    rules, policies = chains(ruleset)
    candidates = [r for r in rules.get(key, []) if r.verdict in ("drop", "reject")]
    if len(candidates) == 1:
        return _named(*key, candidates[0])
    if after and candidates:
        now = {r.handle: r for r in chains(after)[0].get(key, [])}
        moved = [r for r in candidates if r.packets is not None and (now.get(r.handle) or r).packets != r.packets]
        if len(moved) == 1:
            return _named(*key, moved[0])
    if candidates:
        return f"{name} (one of the rules with handles {', '.join(r.handle for r in candidates)})"
    if policies.get(key) == "drop":
        return f"{name}'s policy drop"
    return name
