"""drgn's view of a vmcore for a report: the crashing task's stack with each frame's local
variables (an skb, netdev or socket pointer shown by its key fields), the kernel log, and each
lab NIC's netdev state. A vmcore of a kernel that did not panic shows the task on each CPU.

Everything is read from the guest's memory, so it is guest text: the CLI prints it through
:mod:`labctl.textsafe`; reads that fault show as ``<fault: ...>`` and never end the summary::

    with open_core(path) as k:
        s = summarize(k.prog, nics=["eth1"])
    print(format_summary(s))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from labctl.inspect.program import DebugInfoRecord, require_drgn

if TYPE_CHECKING:
    import drgn

MAX_VALUE = 160  # characters of one local variable's value
IFF_UP = 0x1
START_BIT = 0  # __LINK_STATE_START in enum netdev_state_t: netif_running() (dev->flags never holds IFF_RUNNING)
NOCARRIER_BIT = 2  # __LINK_STATE_NOCARRIER in enum netdev_state_t
STATS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped", "rx_errors", "tx_errors")


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_VALUE else line[:MAX_VALUE - 1] + "…"


def _string(obj: drgn.Object) -> str:
    return bytes(obj.string_()).decode("utf-8", "replace")


def _struct_name(obj: drgn.Object) -> str | None:
    """``sk_buff`` for a ``struct sk_buff *``, None for anything else."""
    d = require_drgn()
    t = obj.type_.unaliased()
    if t.kind != d.TypeKind.POINTER:
        return None
    target = t.type.unaliased()
    return target.tag if target.kind == d.TypeKind.STRUCT else None


def _be16(value: int) -> int:
    return ((value & 0xFF) << 8) | (value >> 8)  # a __be16 read on a little-endian kernel


def _ipv4(value: int) -> str:
    return ".".join(str((value >> s) & 0xFF) for s in (0, 8, 16, 24))  # a __be32, little-endian host


def _flow(skb: drgn.Object) -> str:
    """`` SRC:PORT > DST:PORT udp`` of an IPv4 skb whose headers are set ('' otherwise, or on a fault)."""
    d = require_drgn()
    try:
        if not int(skb.head) or int(skb.network_header) == 0xFFFF:
            return ""
        ip = d.cast("struct iphdr *", skb.head + skb.network_header)
        proto = int(ip.protocol)
        src, dst = _ipv4(int(ip.saddr)), _ipv4(int(ip.daddr))
        name = {6: "tcp", 17: "udp", 1: "icmp"}.get(proto, f"proto {proto}")
        if proto in (6, 17) and int(skb.transport_header) not in (0xFFFF, int(skb.network_header)):
            ports = d.cast("struct udphdr *", skb.head + skb.transport_header)  # tcp's ports sit alike
            src, dst = f"{src}:{_be16(int(ports.source))}", f"{dst}:{_be16(int(ports.dest))}"
        return f" {src} > {dst} {name}"
    except (d.FaultError, LookupError, ValueError, TypeError):
        return ""


def _skb(skb: drgn.Object) -> str:
    dev = skb.dev
    name = _string(dev.name) if dev else "-"
    proto = _be16(int(skb.protocol))
    flow = _flow(skb) if proto == 0x0800 else ""
    return f"skb len={int(skb.len)} data_len={int(skb.data_len)} protocol={proto:#06x} dev={name}{flow}"


def _netdev(dev: drgn.Object) -> str:
    return f"net_device {_string(dev.name)} mtu={int(dev.mtu)} flags={int(dev.flags):#x}"


def _sock(sk: drgn.Object) -> str:
    c = sk.__sk_common
    return (f"sock family={int(c.skc_family)} state={int(c.skc_state)} "
            f"local_port={int(c.skc_num)} remote_port={_be16(int(c.skc_dport))}")


_KEY_FIELDS = {"sk_buff": _skb, "net_device": _netdev, "sock": _sock}


def describe(obj: drgn.Object) -> str:
    """One local variable's value on one line: a number or a pointer (symbolized), an skb, netdev or
    socket pointer with its key fields; never the contents of a string, array, structure or union
    (what a guest's memory holds beyond them, such as a buffer's bytes, stays in the vmcore)."""
    d = require_drgn()
    try:
        if obj.absent_:
            return "<optimized out>"
        tag = _struct_name(obj)
        if tag in _KEY_FIELDS and obj.value_():
            return f"{hex(obj.value_())} ({_KEY_FIELDS[tag](obj)})"
        kind = obj.type_.unaliased().kind
        if kind in (d.TypeKind.STRUCT, d.TypeKind.UNION, d.TypeKind.ARRAY, d.TypeKind.CLASS):
            return f"({obj.type_.type_name()}) {{...}} ({d.sizeof(obj)} bytes)"
        return _short(obj.format_(dereference=False, symbolize=True, string=False))
    except (d.FaultError, d.ObjectAbsentError, LookupError, ValueError, TypeError) as exc:
        return f"<fault: {_short(str(exc))}>"


class FrameState(TypedDict):
    """One frame of a task's stack: its function, its source line, its locals described."""

    function: str
    source: str
    locals: dict[str, str]


class TaskState(TypedDict, total=False):
    """The crashing task (a panic), or the task one CPU ran."""

    crashed: bool
    cpu: int
    pid: int
    comm: str
    frames: list[FrameState]
    error: str


class QdiscState(TypedDict):
    kind: str
    qlen: int
    drops: int


class NetdevState(TypedDict, total=False):
    """One network device as the kernel holds it (``error`` alone when it could not be read)."""

    name: str
    ifindex: int
    mtu: int
    flags: int
    up: bool
    running: bool
    carrier: bool
    stats: dict[str, int]  # dev->stats: STATS
    qdisc: QdiscState
    error: str


class KernelSummary(TypedDict):
    """A kernel's state as data (:func:`summarize`)."""

    tasks: list[TaskState]
    netdevs: list[NetdevState]
    dmesg: str


class VmcoreSummary(KernelSummary):
    """:class:`KernelSummary` of a vmcore, with its file, release and debug info (``vmcore.json``)."""

    vmcore: str
    release: str
    debug_info: DebugInfoRecord


def _frames(trace: drgn.StackTrace) -> list[FrameState]:
    frames: list[FrameState] = []
    for frame in trace:
        try:
            file, line, _col = frame.source()
            where = f"{file}:{line}"
        except LookupError:
            where = ""
        local = {}
        try:
            names = frame.locals()
        except (LookupError, ValueError):
            names = []
        for name in names:
            try:
                local[name] = describe(frame[name])
            except (KeyError, LookupError) as exc:
                local[name] = f"<fault: {exc}>"
        frames.append({"function": frame.name or hex(frame.pc), "source": where, "locals": local})
    return frames


def _task(task: drgn.Object) -> TaskState:
    return {"pid": int(task.pid), "comm": _string(task.comm)}


def tasks(prog: drgn.Program) -> list[TaskState]:
    """The crashing task's stack (a panic), else the task running on each CPU."""
    d = require_drgn()
    from drgn.helpers.linux.cpumask import for_each_online_cpu
    from drgn.helpers.linux.sched import cpu_curr

    try:
        thread = prog.crashed_thread()
        return [{"crashed": True, **_task(thread.object), "frames": _frames(thread.stack_trace())}]
    except (LookupError, ValueError, d.FaultError):
        pass
    out: list[TaskState] = []
    for cpu in for_each_online_cpu(prog):
        entry: TaskState = {"crashed": False, "cpu": cpu, "frames": []}
        out.append(entry)
        try:
            task = cpu_curr(prog, cpu)
            entry.update(_task(task))
            entry["frames"] = _frames(prog.stack_trace(task))
        except (LookupError, ValueError, d.FaultError) as exc:
            entry["error"] = _short(str(exc))
    return out


def netdev_state(prog: drgn.Program, names: Sequence[str] | None = None) -> list[NetdevState]:
    """Each network device of the initial namespace (or those called ``names``): MTU, flags,
    carrier, counters and its root qdisc."""
    d = require_drgn()
    from drgn.helpers.linux.net import for_each_netdev

    out: list[NetdevState] = []
    for dev in for_each_netdev(prog):
        try:
            name = _string(dev.name)
            if names is not None and name not in names:
                continue
            flags = int(dev.flags)
            state: NetdevState = {
                "name": name, "ifindex": int(dev.ifindex), "mtu": int(dev.mtu), "flags": flags,
                "up": bool(flags & IFF_UP), "running": bool((int(dev.state) >> START_BIT) & 1),
                "carrier": not (int(dev.state) >> NOCARRIER_BIT) & 1,
                # dev->stats: what drivers with their own counters (virtio_net's per queue) leave at 0
                "stats": {k: int(getattr(dev.stats, k)) for k in STATS}}
            q = dev.qdisc
            if q:
                state["qdisc"] = {"kind": _string(q.ops.id), "qlen": int(q.q.qlen), "drops": int(q.qstats.drops)}
            out.append(state)
        except (LookupError, ValueError, d.FaultError) as exc:
            out.append({"name": "?", "error": _short(str(exc))})
    return out


def dmesg(prog: drgn.Program, lines: int = 200) -> str:
    """The last ``lines`` lines of the kernel log ('' when it cannot be read)."""
    d = require_drgn()
    from drgn.helpers.linux.printk import get_dmesg

    try:
        text = get_dmesg(prog).decode("utf-8", "replace")
    except (LookupError, ValueError, d.FaultError):
        return ""
    return "\n".join(text.splitlines()[-lines:])


def summarize(prog: drgn.Program, nics: Sequence[str] | None = None, log_lines: int = 200) -> KernelSummary:
    """The summary of a kernel (a vmcore's, usually) as data: ``tasks``, ``netdevs``, ``dmesg``."""
    return {"tasks": tasks(prog), "netdevs": netdev_state(prog, nics), "dmesg": dmesg(prog, log_lines)}


def vmcore_summary(path: Path, nics: Sequence[str] | None = None, vmlinux: Path | None = None) -> VmcoreSummary:
    """:func:`summarize` of the vmcore at ``path``, with its kernel's release and debug info.

    :raise DebugError: when it cannot be read or its debug info is not found.
    """
    from labctl.inspect.attach import open_core

    with open_core(path, vmlinux) as k:
        return {"vmcore": str(path), "release": k.release, "debug_info": k.debug.to_dict(),
                **summarize(k.prog, nics)}


def format_summary(s: KernelSummary) -> str:
    """The summary as text (guest text: print it through labctl.textsafe)."""
    lines = []
    for t in s.get("tasks", []):
        head = "crashed task" if t.get("crashed") else f"CPU {t.get('cpu')}"
        error = f": {t['error']}" if "error" in t else ""
        lines.append(f"{head}: pid {t.get('pid', '?')} ({t.get('comm', '?')}){error}")
        for i, f in enumerate(t.get("frames", [])):
            lines.append(f"  #{i} {f['function']}" + (f" at {f['source']}" if f["source"] else ""))
            lines += [f"       {k} = {v}" for k, v in f["locals"].items()]
    lines.append("network devices:")
    for n in s.get("netdevs", []):
        if "error" in n:
            lines.append(f"  {n['name']}: {n['error']}")
            continue
        q, st = n.get("qdisc"), n["stats"]
        lines.append(f"  {n['name']}: mtu {n['mtu']} {'UP' if n['up'] else 'DOWN'}"
                     f"{' RUNNING' if n['running'] else ''} carrier {'on' if n['carrier'] else 'off'}"
                     + (f" qdisc {q['kind']} qlen {q['qlen']} drops {q['drops']}" if q else "")
                     + f"; dev->stats rx {st['rx_packets']} tx {st['tx_packets']}"
                       f" dropped {st['rx_dropped']}/{st['tx_dropped']}")
    if s.get("dmesg"):
        lines += ["kernel log (last lines):", *("  " + ln for ln in s["dmesg"].splitlines())]
    return "\n".join(lines)
