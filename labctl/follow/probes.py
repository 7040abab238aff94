"""The probes that follow packets and catch drops in a guest's kernel, as shell commands: pure functions.

Everything goes through tracefs, with no compiler, BPF or debug info in the guest:

* a **tracefs instance** of labctl's own (``instances/labctl-TAG``) records only labctl's events,
  on the ``mono`` clock, without overwriting (the first events are kept when it fills), so that
  the user's own ftrace or trace-cmd is untouched;
* **event probes** (``e:`` in ``dynamic_events``, Linux 5.15 and later) on the tracepoints
  ``net:net_dev_queue``, ``net:net_dev_start_xmit``, ``net:netif_receive_skb`` and ``skb:kfree_skb``,
  and ``skb:skb_copy_datagram_iovec``, and **kprobes** (``p:``) on ``ip_forward``,
  ``ip_local_deliver``, ``tcp_v4_rcv`` and ``skb_consume_udp`` (UDP copies a linear skb without the
  tracepoint), each fetching the packet's IPv4 header fields at
  ``skb->data`` plus where that header is at that point (:data:`POINTS`); byte offsets of the
  structs come from the kernel's debug info (:mod:`labctl.kernel.offsets`). Tracepoints wherever
  the stack has one: a kprobe hit while another kprobe's handler runs on the CPU is missed (the
  kernel counts it in ``kprobe_profile``), and a kprobe on ``ip_output`` ran in every sender's context
  (sshd's too), so that a packet's softirq nested into it lost its hops under TCG (4-12 hops of 2000
  pings; a ping's reader probe did it too, once in 2000); the kprobes left run in softirq
  context, but for a UDP socket's reader;
* each follow point gets the filter as the kernel's own event filter (:mod:`labctl.trace.pktfilter`),
  so unrelated packets are never recorded; drops are recorded unfiltered (they are few);
* IPv6 and ARP (:data:`POINTS`' ``family``): a probe of their own on each tracepoint and kprobes on
  ``ip6_forward``, ``ip6_input``, ``tcp_v6_rcv`` and ``arp_rcv``, each fetching its family's header
  (:data:`FIELDS`) and ``skb->protocol``; a family the filter cannot match gets no probe at all;
* the drop's reason is a field of ``skb:kfree_skb`` from Linux 6.0 on (fewer, older ones: only where);
  its location is symbolized by the kernel (``:symbol``, 6.1); on a kernel without event probes the
  tracepoint itself is recorded (where as an address, no device or headers).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from labctl.pktfilter import ARP, Node, kernel_filter
from labctl.trace import window_words

q = shlex.quote
TRACEFS = "/sys/kernel/tracing"
PREFIX = "labctl_"  # event groups are labctl_TAG, instances labctl-TAG
OFFSETS_FILE = "follow-offsets.json"
REASONS_FILE = "drop-reasons.json"  # enum skb_drop_reason's names by value
OFFSET_FIELDS = {
    "skb_data": ("struct sk_buff", "data"),
    "skb_head": ("struct sk_buff", "head"),
    "skb_nh": ("struct sk_buff", "network_header"),
    "skb_dev": ("struct sk_buff", "dev"),
    "dev_name": ("struct net_device", "name"),
    "skb_protocol": ("struct sk_buff", "protocol"),
}
# netfilter's, each optional (a kernel without netfilter has neither): the skb's conntrack entry and
# state (``_nfct``, in vmlinux) and nftables' chain and table names (types of the nf_tables module)
CT_FIELDS = {"skb_nfct": ("struct sk_buff", "_nfct")}
NFT_FIELDS = {"chain_table": ("struct nft_chain", "table"), "chain_name": ("struct nft_chain", "name"),
              "table_name": ("struct nft_table", "name"), "table_family": ("struct nft_table", "family")}
NFT_MODULE = "net/netfilter/nf_tables.ko"
CT_OFFSETS_FILE = "follow-ct-offsets.json"
NFT_OFFSETS_FILE = "follow-nft-offsets.json"
FOLLOW_BUFFER_KB = 8192
DROPS_BUFFER_KB = 2048


@dataclass(frozen=True)
class ProbePoint:
    """Where a follow point is probed: an event probe on a tracepoint (``place`` "net.net_dev_queue",
    the skb ``$skbaddr``) or a kprobe on a function (the skb in a register), the family of the packets
    it follows (``4``, ``6``, :data:`ARP`) and where their network header is from ``skb->data`` there
    (``ip_at``). An IPv6 or ARP point on a tracepoint another family's point also has is an event of
    its own (``xmit6``, ``xmit_arp``): each fetches its family's fields and has its family's filter."""

    name: str
    kind: str  # "e" or "p"
    place: str
    skb: str  # $skbaddr, %di, %si, %dx
    ip_at: int
    dev: bool = False
    family: int = 4
    ct: bool = False  # fetches the skb's conntrack entry (``ct``: its address, the state in the low 3 bits)
    nft: bool = False  # nft_do_chain: the chain and table (``%si``: the chain) too
    l4: tuple[int, ...] = ()  # the one protocol's packets it sees (tcp_v4_rcv: TCP's), probed only for a filter that can match one


POINTS = (
    ProbePoint("dev_queue", "e", "net.net_dev_queue", "$skbaddr", 14, dev=True),  # after the Ethernet header
    ProbePoint("xmit", "e", "net.net_dev_start_xmit", "$skbaddr", 14, dev=True),
    ProbePoint("netif_rx", "e", "net.netif_receive_skb", "$skbaddr", 0, dev=True),  # eth_type_trans pulled L2
    ProbePoint("ip_fwd", "p", "ip_forward", "%di", 0, ct=True),
    ProbePoint("ip_local", "p", "ip_local_deliver", "%di", 0, ct=True),
    ProbePoint("tcp_rcv", "p", "tcp_v4_rcv", "%di", -20, l4=(6,)),  # IP's header pulled (no options)
    # the reader's copy, in its context: a raw socket keeps the IP header, a ping socket is at the ICMP header
    ProbePoint("raw_read", "e", "skb.skb_copy_datagram_iovec", "$skbaddr", 0),
    ProbePoint("sock_read", "e", "skb.skb_copy_datagram_iovec", "$skbaddr", -20),
    ProbePoint("udp_read", "p", "skb_consume_udp", "%si", -20, l4=(17,)),
    # IPv6: no header options assumed past the fixed 40 bytes; a raw ICMPv6 socket is at the ICMPv6 header too
    ProbePoint("dev_queue6", "e", "net.net_dev_queue", "$skbaddr", 14, dev=True, family=6),
    ProbePoint("xmit6", "e", "net.net_dev_start_xmit", "$skbaddr", 14, dev=True, family=6),
    ProbePoint("netif_rx6", "e", "net.netif_receive_skb", "$skbaddr", 0, dev=True, family=6),
    ProbePoint("ip6_fwd", "p", "ip6_forward", "%di", 0, family=6, ct=True),
    ProbePoint("ip6_local", "p", "ip6_input", "%di", 0, family=6, ct=True),
    ProbePoint("tcp6_rcv", "p", "tcp_v6_rcv", "%di", -40, family=6, l4=(6,)),
    ProbePoint("read6", "e", "skb.skb_copy_datagram_iovec", "$skbaddr", -40, family=6),
    ProbePoint("udp6_read", "p", "skb_consume_udp", "%si", -40, family=6, l4=(17,)),
    # ARP: on the wire and into arp_rcv (what the kernel then does with it: a reply, or nothing)
    ProbePoint("dev_queue_arp", "e", "net.net_dev_queue", "$skbaddr", 14, dev=True, family=ARP),
    ProbePoint("xmit_arp", "e", "net.net_dev_start_xmit", "$skbaddr", 14, dev=True, family=ARP),
    ProbePoint("netif_rx_arp", "e", "net.netif_receive_skb", "$skbaddr", 0, dev=True, family=ARP),
    ProbePoint("arp_rcv", "p", "arp_rcv", "%di", 0, family=ARP),
    # an nftables base chain (its rules run; a drop by one of them is the next event of the skb): the
    # packet (``pkt->skb``, at its network header), its conntrack state, the chain and table
    ProbePoint("nft", "p", "nft_do_chain", "+0(%di)", 0, ct=True, nft=True),
    ProbePoint("nft6", "p", "nft_do_chain", "+0(%di)", 0, family=6, ct=True, nft=True),
)
NFT_POINTS = tuple(p.name for p in POINTS if p.nft)

# each family's header fields by name: (offset from the network header, type); BASE: fetched by every
# point of the family (what names a packet), the others only when the filter reads them
FIELDS: dict[int, dict[str, tuple[int, str]]] = {
    4: {"vi": (0, "u8"), "tl": (2, "u16"), "id": (4, "u16"), "fo": (6, "u16"), "ttl": (8, "u8"), "proto": (9, "u8"),
        "saddr": (12, "u32"), "daddr": (16, "u32"), "l4a": (20, "u32"), "l4b": (24, "u32"),
        **{f"{s}b{i}": ((12 if s == "s" else 16) + i, "u8") for s in "sd" for i in range(4)},
        "sport": (20, "u16"), "dport": (22, "u16")},
    6: {"vi": (0, "u8"), "plen": (4, "u16"), "nxt": (6, "u8"), "hl": (7, "u8"),
        **{f"s6{c}": (8 + 4 * i, "u32") for i, c in enumerate("abcd")},
        **{f"d6{c}": (24 + 4 * i, "u32") for i, c in enumerate("abcd")},
        "l4a": (40, "u32"), "l4b": (44, "u32"),
        **{f"{s}6b{i}": ((8 if s == "s" else 24) + i, "u8") for s in "sd" for i in range(16)},
        "sport": (40, "u16"), "dport": (42, "u16")},
    ARP: {"op": (6, "u16"), "sha": (8, "u32"), "shb": (12, "u16"), "spa": (14, "u32"), "tha": (18, "u16"),
          "thb": (20, "u32"), "tpa": (24, "u32"),
          **{f"{s}pb{i}": ((14 if s == "s" else 24) + i, "u8") for s in "st" for i in range(4)}},
}
BASE = {4: ("vi", "tl", "id", "fo", "ttl", "proto", "saddr", "daddr", "l4a", "l4b"),
        6: ("vi", "plen", "nxt", "hl", "s6a", "s6b", "s6c", "s6d", "d6a", "d6b", "d6c", "d6d", "l4a", "l4b"),
        ARP: ("op", "sha", "shb", "spa", "tha", "thb", "tpa")}


def _at(offset: int, base: str) -> str:
    return f"{'+' if offset >= 0 else '-'}{abs(offset)}({base})"


def ip_fields(data: str, at: int, extra: set[str] = frozenset(), family: int = 4) -> str:  # type: ignore[assignment]
    """Fetch arguments of the ``family`` header at ``at`` bytes from the pointer ``data`` (``+208(%di)``):
    its :data:`BASE` fields, then those of ``extra`` it has."""
    spec = FIELDS[family]
    names = list(BASE[family]) + [n for n in spec if n in extra and n not in BASE[family]]
    return " ".join(f"{n}={_at(at + spec[n][0], data)}:{spec[n][1]}" for n in names)


def point_definition(group: str, p: ProbePoint, off: dict[str, int], extra: set[str]) -> str:
    """The ``dynamic_events`` line of one follow point (IPv6 and ARP points also fetch ``skb->protocol``,
    ``pr``: network order read little-endian)."""
    skb = p.skb
    data = f"+{off['skb_data']}({skb})"
    dev = f" dev=+{off['dev_name']}(+{off['skb_dev']}({skb})):string" if p.dev else ""
    pr = f" pr=+{off['skb_protocol']}({skb}):u16" if p.family != 4 else ""
    ct = f" ct=+{off['skb_nfct']}({skb}):x64" if p.ct and "skb_nfct" in off else ""
    nft = ""
    if p.nft:
        table = f"+{off['chain_table']}(%si)"
        nft = (f" chain=+0(+{off['chain_name']}(%si)):string table=+0(+{off['table_name']}({table})):string"
               f" tfam=+{off['table_family']}({table}):u8")
    return (f"{p.kind}:{group}/{p.name} {p.place} skb={skb}:x64{dev}{pr}{ct}{nft} "
            f"{ip_fields(data, p.ip_at, extra, p.family)}")


def drop_definition(group: str, off: dict[str, int] | None, reason: bool, symbol: bool, extra: str = "") -> str:
    """The event probe on ``skb:kfree_skb``: where, why, the device, and a window of bytes around
    ``skb->data`` with where the network header is (:func:`labctl.trace.hops.drop_header`); ``extra``:
    more fetch arguments (:func:`drop_filter`'s)."""
    parts = [f"e:{group}/drop skb.kfree_skb skb=$skbaddr:x64 proto=$protocol:u16"]
    if off is not None:
        s, d = "$skbaddr", f"+{off['skb_data']}($skbaddr)"
        parts.append(f"dev=+{off['dev_name']}(+{off['skb_dev']}({s})):string head=+{off['skb_head']}({s}):x64 "
                     f"data={d}:x64 nh=+{off['skb_nh']}({s}):u16")
        parts += [f"{name}={_at(at, d)}:x64" for name, at in window_words()]
    if extra:
        parts.append(extra)
    parts.append(drop_fetch(reason, symbol))
    return " ".join(parts)


def drop_fetch(reason: bool, symbol: bool) -> str:
    """A drop event's reason (where ``skb:kfree_skb`` has one) and location, the location last (a
    symbol has spaces): the end of every drop probe's definition."""
    return ("reason=$reason:u32 " if reason else "") + f"loc=$location:{'symbol' if symbol else 'x64'}"


# where a dropped skb's network header is from skb->data: the network layer's, after an Ethernet header,
# before it once the network layer pulled its header (IPv4's 20 bytes, IPv6's 40)
DROP_AT = {4: (0, 14, -20), 6: (0, 14, -40), ARP: (0, 14)}
_PREFIX = {4: "h", 6: "h6_", ARP: "ha_"}
_PR = re.compile(r"\bpr == (0x[0-9a-f]+)")


def _host_order(m: re.Match[str]) -> str:
    """``pr == 0xdd86`` (skb->protocol read little-endian) as the drop tracepoint's ``proto == 0x86dd``."""
    return f"proto == {int.from_bytes(int(m.group(1), 16).to_bytes(2, 'little'), 'big'):#x}"


def _field_names(family: int) -> re.Pattern[str]:
    return re.compile(r"\b(" + "|".join(sorted(FIELDS[family], key=len, reverse=True)) + r")\b")


def drop_filter(off: dict[str, int], filt: str | dict[int, str]) -> tuple[str, str]:
    """A followed guest's drop event, filtered as the follow points are: the fetch arguments (only the
    fields each family's filter reads, at each of its :data:`DROP_AT` from ``skb->data``, named
    ``h0_vi``, ``h14_vi``, ``hm20_vi``... for IPv4, ``h6_0_vi``... for IPv6, ``ha_0_tpa``... for ARP) and
    the filter that keeps a drop whose header matches at one of them; ``filt``: the IPv4 filter, or
    each family's (:func:`labctl.pktfilter.kernel_filter`). The probes' ``pr`` (``skb->protocol`` read
    little-endian) becomes the tracepoint's ``proto``, which the kernel gives in host order. Unrelated
    drops (a TCP stream's GRO lists: hundreds a second) are never recorded nor sent to the host; a
    followed packet dropped with its header elsewhere (IP options before a pulled header) is missed."""
    filters = {4: filt} if isinstance(filt, str) else filt
    data = f"+{off['skb_data']}($skbaddr)"
    args, alts = [], []
    for family, text in filters.items():
        names = _field_names(family)
        used = sorted(set(names.findall(text)))
        spec = FIELDS[family]
        for at in DROP_AT[family]:
            prefix = f"{_PREFIX[family]}{'m' if at < 0 else ''}{abs(at)}_"
            args += [f"{prefix}{n}={_at(at + spec[n][0], data)}:{spec[n][1]}" for n in used]
            body = names.sub(prefix + r"\1", text)
            alts.append("(" + _PR.sub(_host_order, body) + ")")
    return " ".join(args), " || ".join(alts)


def definitions(group: str, node: Node, off: dict[str, int], reason: bool, symbol: bool) -> tuple[list[str], dict[str, str]]:
    """A followed guest's ``dynamic_events`` lines for the filter ``node`` and each event's filter: the
    points of each family the filter can match (none for another; a point of one protocol, ``l4``, only
    for a filter that can match it: :meth:`labctl.pktfilter.Node.protocols`), then the drop event."""
    defs, filters, by_family = [], {}, {}
    for family in sorted({p.family for p in POINTS}):
        filt, extra = kernel_filter(node, family)
        if filt is None:  # the filter matches nothing of this family: no probes for it
            continue
        by_family[family] = filt
        protos = node.protocols(family)
        for p in (p for p in POINTS if p.family == family and (not p.nft or "chain_name" in off)
                  and (not p.l4 or protos is None or protos & set(p.l4))):
            defs.append(point_definition(group, p, off, extra))
            filters[p.name] = filt
    drop_args, drop_filt = drop_filter(off, by_family)
    defs.append(drop_definition(group, off, reason, symbol, drop_args))
    return defs, {**filters, "drop": drop_filt}


@dataclass(frozen=True)
class Caps:
    """What the guest's tracefs offers (:func:`caps_command`'s answer)."""

    tracefs: bool = False
    eprobes: bool = False
    reason: bool = False
    symbol: bool = False
    kprobes: bool = False
    groups: tuple[str, ...] = ()  # labctl's event groups and instances found there (a killed labctl's)

    @classmethod
    def parse(cls, text: str) -> Caps:
        words = dict(w.split("=", 1) for w in text.split() if "=" in w)
        groups = tuple(sorted({w for w in text.split() if w.startswith(PREFIX)}))
        return cls(words.get("tracefs") == "1", words.get("eprobes") == "1", words.get("reason") == "1",
                   words.get("symbol") == "1", words.get("kprobes") == "1", groups)


def caps_command() -> str:
    """Shell: what tracefs offers, and labctl's groups and instances left there (``labctl_TAG``)."""
    t = TRACEFS
    return (f"T={t}; [ -d $T/events ] || mount -t tracefs nodev $T 2>/dev/null; "
            "[ -d $T/events ] && echo tracefs=1; "
            "grep -qF 'e[:[<group>/]' $T/README 2>/dev/null && echo eprobes=1; "
            "grep -q 'reason;' $T/events/skb/kfree_skb/format 2>/dev/null && echo reason=1; "
            "grep -qw symbol $T/README 2>/dev/null && echo symbol=1; "
            "[ -w $T/kprobe_events ] && echo kprobes=1; "
            f"sed -n 's/^[pe]:\\({PREFIX}[A-Za-z0-9_]*\\)\\/.*/\\1/p' $T/dynamic_events 2>/dev/null | sort -u; "
            f"ls $T/instances 2>/dev/null | sed -n 's/^labctl-\\([A-Za-z0-9_]*\\)$/{PREFIX}\\1/p'; true")


def tag_of(group: str) -> str:
    return group[len(PREFIX):]


def remove_command(tag: str, events: list[str] | None = None) -> str:
    """Shell: disable and remove labctl's instance and events of ``tag`` (all of its group when ``events``
    is None); never fails."""
    t, g, inst = TRACEFS, PREFIX + tag, f"{TRACEFS}/instances/labctl-{tag}"
    parts = [f"T={t}", f"echo 0 > {inst}/tracing_on 2>/dev/null",
             f"for e in {inst}/events/{g}/*/enable; do echo 0 > \"$e\" 2>/dev/null; done",
             f"rmdir {inst} 2>/dev/null"]
    if events is None:
        parts.append(f"for e in $(sed -n 's/^[pe]:\\({g}\\/[A-Za-z0-9_]*\\) .*/\\1/p' $T/dynamic_events); do "
                     "echo \"-:$e\" >> $T/dynamic_events 2>/dev/null; done")
    else:
        parts += [f"echo {q('-:' + g + '/' + e)} >> $T/dynamic_events 2>/dev/null" for e in events]
    return "; ".join(parts) + "; true"


def setup_command(tag: str, definitions: list[str], filters: dict[str, str], buffer_kb: int,
                  extra: tuple[str, ...] = ()) -> str:
    """Shell: define the events, make the instance (mono clock, no overwrite, ``buffer_kb`` per CPU),
    set each event's filter, enable them. Prints ``labctl-fail WHAT`` for each step the kernel refused
    (the event then stays off), ``labctl-ok EVENT`` for each event enabled. ``extra``: commands run
    before enabling (a ruleset listing)."""
    t, g, inst = TRACEFS, PREFIX + tag, f"{TRACEFS}/instances/labctl-{tag}"
    parts = [f"T={t}"]
    for d in definitions:
        name = d.split()[0].split("/", 1)[1]
        parts.append(f"echo {q(d)} >> $T/dynamic_events 2>/dev/null || echo labctl-fail define {name}")
    parts += [f"mkdir -p {inst} || echo labctl-fail instance",
              f"echo mono > {inst}/trace_clock 2>/dev/null || echo labctl-fail clock",
              f"echo 0 > {inst}/options/overwrite 2>/dev/null",
              f"echo {int(buffer_kb)} > {inst}/buffer_size_kb 2>/dev/null"]
    parts += list(extra)
    for d in definitions:
        name = d.split()[0].split("/", 1)[1]
        ev = f"{inst}/events/{g}/{name}"
        if name in filters:
            parts.append(f"{{ echo {q(filters[name])} > {ev}/filter; }} 2>/dev/null || echo labctl-fail filter {name}")
        parts.append(f"{{ [ -d {ev} ] && echo 1 > {ev}/enable && echo labctl-ok {name}; }} 2>/dev/null || "
                     f"echo labctl-fail enable {name}")
    return "; ".join(parts) + "; true"


def tracepoint_setup_command(tag: str, buffer_kb: int, extra: tuple[str, ...] = ()) -> str:
    """Shell: an instance recording ``skb:kfree_skb`` itself (a kernel without event probes)."""
    inst = f"{TRACEFS}/instances/labctl-{tag}"
    return "; ".join([f"mkdir -p {inst} || echo labctl-fail instance",
                      f"echo mono > {inst}/trace_clock 2>/dev/null || echo labctl-fail clock",
                      f"echo 0 > {inst}/options/overwrite 2>/dev/null",
                      f"echo {int(buffer_kb)} > {inst}/buffer_size_kb 2>/dev/null", *extra,
                      (f"{{ echo 1 > {inst}/events/skb/kfree_skb/enable && echo labctl-ok kfree_skb; }} 2>/dev/null "
                      "|| echo labctl-fail enable kfree_skb")]) + "; true"


def resume_command(tag: str) -> str:
    """Shell: the instance of ``tag`` emptied and recording again (``labctl-ok resume``), or nothing
    when it is gone (the guest was reset or rebooted)."""
    inst = f"{TRACEFS}/instances/labctl-{tag}"
    return (f"{{ [ -d {inst} ] && echo 0 > {inst}/tracing_on && echo > {inst}/trace && "
            f"echo 1 > {inst}/tracing_on && echo labctl-ok resume; }} 2>/dev/null; true")


def read_command(tag: str) -> str:
    """Shell: the instance's whole buffer, then a line ``labctl-lost N`` (events it had no room for)."""
    inst = f"{TRACEFS}/instances/labctl-{tag}"
    return (f"echo 0 > {inst}/tracing_on 2>/dev/null; cat {inst}/trace; "
            f"echo labctl-lost $(cat {inst}/per_cpu/cpu*/stats 2>/dev/null | "
            "awk '/^(overrun|dropped events):/ {n += $NF} END {print n + 0}')")


def pipe_command(tag: str) -> str:
    """Shell: the instance's events as they happen (consumed as read)."""
    return f"exec cat {TRACEFS}/instances/labctl-{tag}/trace_pipe"


def sync_command(tag: str) -> str:
    """Shell: for each line N the host sends, a marker ``labctl-sync N`` in the instance, then N back
    (a heartbeat, ``hb``, is not answered: its marker is all it is for)."""
    inst = f"{TRACEFS}/instances/labctl-{tag}"
    return (f"cd {inst} && while read -r n; do echo \"labctl-sync $n\" > trace_marker && "
            "{ [ \"$n\" = hb ] || echo \"$n\"; }; done")


RULESET = "nft -a list ruleset 2>/dev/null"


def results(text: str) -> tuple[list[str], list[str]]:
    """The events a setup enabled, and what the kernel refused (``labctl-ok`` / ``labctl-fail`` lines)."""
    ok = [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("labctl-ok ")]
    fail = [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("labctl-fail ")]
    return ok, fail
