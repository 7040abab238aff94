"""What the ``skb_latency`` tracer records in the guest, and the kernel facts it needs.

The guest has no kernel debuginfo, so ``perf probe`` cannot fetch function
arguments by name. The kprobes are written to ``kprobe_events`` directly,
with arguments from the x86-64 calling convention (``%di``, ``%si``,
``%dx``: first, second, third argument) and fields at byte offsets read
once, on the host, from the image's ``vmlinux.debug`` with gdb::

    ip_rcv_core(skb, net)                       skb, IP protocol/ihl/length, TCP data offset
    tcp_v4_rcv(skb)                             skb, skb->len, TCP data offset
    tcp_sendmsg(sk, msg, size)                  socket, size, tcp_sock->write_seq
    __tcp_transmit_skb(sk, skb, clone_it, ...)  socket, skb, TCP_SKB_CB(skb)->seq/end_seq
    __ip_queue_xmit(sk, skb, fl, tos)           the skb (TCP's clone)
    ip_output(net, sk, skb)                     skb
    __dev_queue_xmit(skb, sb_dev)               skb
    skb_try_coalesce(to, from, ...) and its return value

Everything is recorded by one ``trace-cmd record`` with the ``mono`` clock
(comparable across CPUs), together with the tracepoints in :data:`EVENTS`.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path

from labctl.errors import TraceError
from labctl.kernel import Kernel

log = logging.getLogger(__name__)
q = shlex.quote
GROUP = "labctl_skb"
OFFSETS_FILE = "struct-offsets.json"
FIELDS = {
    "skb_cb": "&((struct sk_buff *)0)->cb",
    "skb_len": "&((struct sk_buff *)0)->len",
    "skb_data": "&((struct sk_buff *)0)->data",
    "tcp_write_seq": "&((struct tcp_sock *)0)->write_seq",
}
EVENTS = (
    "net:napi_gro_receive_entry", "net:napi_gro_receive_exit", "net:netif_receive_skb_entry",
    "net:netif_rx_entry", "net:netif_receive_skb", "net:net_dev_queue", "net:net_dev_xmit",
    "skb:skb_copy_datagram_iovec", "skb:kfree_skb", "skb:consume_skb", "napi:napi_poll",
    "irq:irq_handler_entry", "irq:irq_handler_exit", "irq:softirq_entry", "irq:softirq_exit",
    "irq:softirq_raise",
)
DEFAULT_BUFFER_KB = 8192


def kprobe_definitions(off: dict[str, int]) -> list[str]:
    """``kprobe_events`` lines for the offsets in ``off`` (keys of :data:`FIELDS`)."""
    cb, length, data, wseq = off["skb_cb"], off["skb_len"], off["skb_data"], off["tcp_write_seq"]
    g = GROUP
    return [
        (f"p:{g}/ip_rcv_core ip_rcv_core skb=%di:x64 ihl=+0(+{data}(%di)):u8 tot_len=+2(+{data}(%di)):u16 "
         f"proto=+9(+{data}(%di)):u8 tcpoff=+32(+{data}(%di)):u8"),
        f"p:{g}/tcp_v4_rcv tcp_v4_rcv skb=%di:x64 len=+{length}(%di):u32 doff=+12(+{data}(%di)):u8",
        f"p:{g}/tcp_sendmsg tcp_sendmsg sk=%di:x64 size=%dx:u64 wseq=+{wseq}(%di):u32",
        (f"p:{g}/tcp_transmit_skb __tcp_transmit_skb sk=%di:x64 skb=%si:x64 clone=%dx:u32 "
         f"seq=+{cb}(%si):u32 end_seq=+{cb + 4}(%si):u32"),
        f"p:{g}/ip_queue_xmit __ip_queue_xmit skb=%si:x64",
        f"p:{g}/ip_output ip_output skb=%dx:x64",
        f"p:{g}/dev_queue_xmit __dev_queue_xmit skb=%di:x64",
        f"p:{g}/skb_try_coalesce skb_try_coalesce to=%di:x64 from=%si:x64",
        f"r:{g}/skb_try_coalesce_ret skb_try_coalesce ret=$retval:u8",
    ]


def probe_names() -> list[str]:
    return [d.split()[0].split("/", 1)[1] for d in kprobe_definitions(dict.fromkeys(FIELDS, 0))]


def add_command(off: dict[str, int]) -> str:
    """Shell: define the kprobes (removing stale ones of ours first); non-zero exit if one fails."""
    k = "/sys/kernel/tracing/kprobe_events"
    return remove_command() + "; " + " && ".join(f"echo {q(d)} >> {k}" for d in kprobe_definitions(off))


def remove_command() -> str:
    k = "/sys/kernel/tracing/kprobe_events"
    parts = [f"echo 0 > /sys/kernel/tracing/events/{GROUP}/enable 2>/dev/null"]
    parts += [f"echo {q('-:' + GROUP + '/' + n)} >> {k} 2>/dev/null" for n in probe_names()]
    return "; ".join(parts) + "; true"


def record_argv(buffer_kb: int | None) -> list[str]:
    argv = ["trace-cmd", "record", "-C", "mono", "-b", str(buffer_kb or DEFAULT_BUFFER_KB), "-o", "skb.dat",
            "-e", GROUP]
    for ev in EVENTS:
        argv += ["-e", ev]
    return argv


def postprocess_command() -> str:
    names = "|".join(probe_names())
    return ("[ -s skb.dat ] && trace-cmd report -t -i skb.dat > skb-report.txt 2> skb-report.err; "
            "[ -s skb.dat ] && trace-cmd report --stat -i skb.dat > skb-stat.txt 2>> skb-report.err; "
            f"grep -E {q('^ *(' + names + ') ')} /sys/kernel/tracing/kprobe_profile > skb-kprobe-profile.txt "
            "2>/dev/null; rm -f skb.dat")


_GDB_VALUE = re.compile(r"^\$\d+ = (\d+)$", re.MULTILINE)


def kernel_offsets(kernel: Kernel, cache_dir: Path | None = None) -> dict[str, int]:
    """Byte offsets of :data:`FIELDS` in the guest's kernel, from its ``vmlinux.debug`` (cached as JSON
    beside the kernel, or in ``cache_dir`` when the kernel's directory is read-only).

    :raise TraceError: the kernel has no debug info, or gdb cannot read a field.
    """
    cached = _read_cache(kernel.dir / OFFSETS_FILE) or (
        _read_cache(cache_dir / OFFSETS_FILE) if cache_dir else None)
    if cached is not None:
        return cached
    vmlinux = kernel.vmlinux_debug
    if not vmlinux.is_file():
        raise TraceError(f"kernel {kernel.name} has no vmlinux with debug info: skb_latency needs it for "
                         "field offsets", hint="give the lab's kernel its debug file")
    from labctl.proc import run

    argv = ["gdb", "-batch", "-nx"]
    for expr in FIELDS.values():
        argv += ["-ex", f"print (unsigned long){expr}"]
    res = run([*argv, str(vmlinux)], timeout=300, check=False)
    values = [int(v) for v in _GDB_VALUE.findall(res.stdout.decode(errors="replace"))]
    if res.returncode != 0 or len(values) != len(FIELDS):
        err = res.stderr.decode(errors="replace").strip()[-300:]
        raise TraceError(f"gdb could not read struct offsets from {vmlinux}: {err}")
    off = dict(zip(FIELDS, values))
    kernel.keep_json(OFFSETS_FILE, off, cache_dir)
    return off


def _read_cache(path: Path) -> dict[str, int] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and set(FIELDS) <= set(data) and all(isinstance(data[k], int) for k in FIELDS):
        return {k: int(data[k]) for k in FIELDS}
    return None
