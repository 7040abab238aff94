"""Parsing oops reports out of console text: prefixes, sections, frames, titles."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.debug.oops import Frame, Oops, clean_func, culprit, make_title, parse_oopses, split_prefix

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oops"


def fixture(name: str) -> list[Oops]:
    return parse_oopses((FIXTURES / name).read_text())


def symbols(o: Oops) -> list[str]:
    return [("? " if not f.reliable else "") + f.symbol for f in o.frames]


# -- real console logs ---------------------------------------------------------------

def test_sysrq_crash_is_one_panic_with_its_call_trace() -> None:
    [o] = fixture("sysrq-crash.console.log")
    assert o.kind == "panic"
    assert o.title == "Kernel panic - not syncing: sysrq triggered crash"
    assert o.rip is None  # the only RIP line is user space (0033), inside the trace
    assert (o.cpu, o.pid, o.comm) == (0, 135, "bash")
    assert len(o.frames) == 19
    assert o.frames[3] == Frame("sysrq_handle_crash", 0x16, 0x20, kind="call", context="task", line_no=11)
    assert o.frames[4].func == "__handle_sysrq.cold"
    assert sum(not f.reliable for f in o.frames) == 9
    assert "? set_pte+0x5/0x10" in symbols(o)
    assert o.frames[-1].symbol == "entry_SYSCALL_64_after_hwframe+0x6e/0xd8"
    assert {f.context for f in o.frames} == {"task"}


def test_warning_then_null_dereference_with_fatal_panic_folded_in() -> None:
    warn, bug = fixture("cp-start-xmit.console.log")
    assert warn.kind == "warning" and warn.title == "WARNING in cp_start_xmit"
    assert warn.rip == Frame("cp_start_xmit", 0x652, 0x891, "8139cp", kind="rip", line_no=8)
    assert warn.panic is None
    assert len(warn.frames) == 40
    assert warn.modules[:2] == ["evdev", "button"] and "8139cp" in warn.modules
    assert bug.kind == "bug"
    assert bug.title == "BUG: kernel NULL pointer dereference in cp_start_xmit"
    assert bug.headline == "BUG: kernel NULL pointer dereference, address: 00000000000000c8"
    assert bug.panic == "Kernel panic - not syncing: Fatal exception in interrupt"
    # The RIP comes from before the trace, not from its repetition after "end trace".
    assert bug.rip is not None and bug.rip.line_no == 79 and bug.rip.symbol == "cp_start_xmit+0x4e/0x891"
    first = bug.frames[0]
    assert (first.func, first.module, first.reliable, first.offset == first.size) == ("cp_rx_poll", "8139cp", False,
                                                                                      True)
    assert len(bug.frames) == 26


def test_irq_and_task_sections_and_saved_registers_inside_the_trace() -> None:
    warn, gpf = fixture("virtio-net-irq.console.log")
    assert warn.title == "WARNING in page_to_skb"
    assert warn.rip is not None and warn.rip.module == "virtio_net"
    contexts = [(f.func, f.context, f.kind) for f in warn.frames]
    assert contexts[0] == ("receive_buf", "irq", "call")
    assert ("sysvec_apic_timer_interrupt", "irq", "call") in contexts
    assert ("asm_sysvec_apic_timer_interrupt", "task", "call") in contexts
    # "RIP: 0010:native_safe_halt+0xb/0x10" after asm_sysvec_*: the interrupted IP, exact.
    assert ("native_safe_halt", "task", "regs") in contexts
    assert not next(f for f in warn.frames if f.kind == "regs").is_return_address
    assert [f.module for f in warn.frames if f.module] == ["virtio_net", "virtio_ring", "virtio_net"]
    assert gpf.kind == "general_protection_fault" and gpf.title == "general protection fault in start_xmit"
    assert gpf.panic == "Kernel panic - not syncing: Fatal exception in interrupt"
    assert gpf.rip is not None and gpf.rip.symbol == "start_xmit+0x19/0x5a0"


def test_handmade_log_with_four_prefix_styles() -> None:
    reports = fixture("handmade-mixed.console.log")
    assert [r.title for r in reports] == [
        "kernel BUG in cp_interrupt",
        "WARNING in e1000_set_mac",
        "unregister_netdevice: waiting for eth1 to become free",
        "unregister_netdevice: waiting for eth1 to become free",
        "BUG: unable to handle page fault in e1000_clean_rx_irq",
    ]
    kbug, warn, unreg, _, fault = reports
    assert kbug.panic is not None and kbug.rip is not None and kbug.rip.symbol == "cp_interrupt+0x3aa/0x480"
    assert [f.context for f in kbug.frames[:6]] == ["irq"] * 5 + ["task"]
    assert warn.pid == 377 and warn.comm == "ip" and len(warn.frames) == 16
    assert unreg.frames == [] and unreg.rip is None
    # "g| " serial prefix without printk timestamps; old "[<addr>]" frames; Oops line joins the BUG.
    assert fault.comm == "ksoftirqd/0"
    assert symbols(fault)[:4] == ["e1000_clean+0xc2/0x6b0", "__napi_poll+0x28/0x160",
                                  "net_rx_action+0x2a0/0x350", "? handle_softirqs+0xd4/0x280"]
    assert fault.frames[4].module == "virtio_ring"


# -- prefixes ------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "message", "exact"), [
    ("[   54.568072] Kernel panic - not syncing: x", " Kernel panic - not syncing: x", True),
    ("[ 1234.000001][    T1] BUG: x", " BUG: x", True),
    ("[    0.5][  C0] <TASK>", " <TASK>", True),
    ("<4>[   12.345678] WARNING: x", " WARNING: x", True),
    ("<1>BUG: x", "BUG: x", True),
    ("Nov 23 01:20:00 host kernel: [  100.000731] RIP: 0010:f+0x1/0x2", " RIP: 0010:f+0x1/0x2", True),
    ("Nov 23 01:20:00 host kernel: BUG: x", "BUG: x", True),
    ("2026-11-23T01:20:00.123456+00:00 host kernel: [    5.000000] BUG: x", " BUG: x", True),
    ("Kernel panic - not syncing: kernel: panic_on_warn set", "Kernel panic - not syncing: kernel: panic_on_warn set",
     False),
    ("[Sun Nov 23 01:21:05 2026]  dev_set_mac_address+0x81/0x120", "  dev_set_mac_address+0x81/0x120", True),
    ("kern  :warn  : [   12.0] WARNING: x", " WARNING: x", True),
    ("g| BUG: x\r\n", "g| BUG: x", False),
    ("plain text", "plain text", False),
])
def test_split_prefix(line: str, message: str, exact: bool) -> None:
    assert split_prefix(line) == (message, exact)


def test_timestamps_prefixes_and_crlf_give_the_same_report() -> None:
    body = ["BUG: kernel NULL pointer dereference, address: 0000000000000008", "Oops: 0000 [#1] PREEMPT SMP NOPTI",
            "RIP: 0010:e1000_clean+0x10/0x6b0 [e1000]", "Call Trace:", " <TASK>", " ? foo+0x1/0x10",
            " bar+0x22/0x30", " </TASK>", "---[ end trace 0000000000000000 ]---"]
    styles = [lambda l: l, lambda l: f"[  12.{len(l):06d}] {l}", lambda l: f"<4>{l}",
              lambda l: f"Jan  1 00:00:00 box kernel: [    1.000000] {l}", lambda l: f"serial0| {l}\r"]
    results = [parse_oopses("\n".join(style(l) for l in ["noise", *body, "more noise"])) for style in styles]
    for [o] in results:
        assert o.title == "BUG: kernel NULL pointer dereference in e1000_clean"
        assert symbols(o) == ["? foo+0x1/0x10", "bar+0x22/0x30"]
        assert o.rip is not None and o.rip.module == "e1000"


# -- structure -----------------------------------------------------------------------

def test_several_reports_and_noise_between_them() -> None:
    text = "[ 1.0] WARNING: this is a user program's message, not the kernel's\n[ 2.0] ------------[ cut here ]------------\n[ 2.1] WARNING: CPU: 1 PID: 9 at net/core/dev.c:3000 skb_warn_bad_offload+0x7e/0x90\n[ 2.2] RIP: 0010:skb_warn_bad_offload+0x7e/0x90\n[ 2.3] Call Trace:\n[ 2.4]  __skb_gso_segment+0x1/0x10\n[ 2.5] ---[ end trace 0000000000000000 ]---\n[ 2.6]  stray_after_end+0x1/0x2\n[ 3.0] general protection fault, probably for non-canonical address 0xdead000000000100: 0000 [#1] SMP\n[ 3.1] RIP: 0010:list_del+0x5/0x40\n[ 3.2] Call Trace:\n[ 3.3]  list_del_entry+0x9/0x20"
    warn, gpf = parse_oopses(text)
    assert warn.title == "WARNING in skb_warn_bad_offload" and warn.line_no == 3
    assert symbols(warn) == ["__skb_gso_segment+0x1/0x10"]
    assert gpf.title == "general protection fault in list_del" and len(gpf.frames) == 1


def test_panic_with_its_own_trace_stays_a_report() -> None:
    text = "WARNING: CPU: 0 PID: 1 at a.c:1 foo+0x1/0x10\nRIP: 0010:foo+0x1/0x10\nCall Trace:\n bar+0x5/0x10\nKernel panic - not syncing: kernel: panic_on_warn set ...\nCall Trace:\n <TASK>\n dump_stack_lvl+0x44/0x5c\n panic+0x118/0x2f4\n check_panic_on_warn+0x2a/0x50\n __warn+0x9b/0x150\n foo+0x1/0x10"
    warn, panic = parse_oopses(text)
    assert warn.panic is None
    assert panic.title == "Kernel panic - not syncing: kernel: panic_on_warn set ..."
    assert len(panic.frames) == 5


def test_kasan_allocation_and_free_stacks_are_labelled() -> None:
    text = "BUG: KASAN: slab-use-after-free in skb_release_data+0x4a1/0x5e0\nRead of size 8 at addr ffff888012345678 by task ping/130\nCall Trace:\n <TASK>\n dump_stack_lvl+0x44/0x5c\n kasan_report+0xb0/0xe0\n skb_release_data+0x4a1/0x5e0\n </TASK>\n\nAllocated by task 130:\n kasan_save_stack+0x22/0x50\n __alloc_skb+0xd9/0x1a0\n\nFreed by task 0:\n kfree_skb_reason+0x50/0x120\n---[ end trace 0000000000000000 ]---"
    [o] = parse_oopses(text)
    assert o.title == "BUG: KASAN: slab-use-after-free in skb_release_data"
    assert [f.stack for f in o.frames] == [""] * 3 + ["Allocated by task 130"] * 2 + ["Freed by task 0"]
    assert culprit(o) == "skb_release_data"  # dump_stack_lvl and kasan_report only report it


def test_nested_sections_close_back_to_the_outer_one() -> None:
    text = "BUG: soft lockup - CPU#0 stuck for 22s! [swapper/0:0]\nCall Trace:\n <NMI>\n nmi_handle+0x1/0x2\n </NMI>\n <IRQ>\n irq_fn+0x1/0x2\n </IRQ>\n <TASK>\n task_fn+0x1/0x2\n </TASK>"
    [o] = parse_oopses(text)
    assert [f.context for f in o.frames] == ["nmi", "irq", "task"]
    assert o.title == "BUG: soft lockup in nmi_handle"  # no RIP: the first reliable frame


def test_no_report_in_clean_text() -> None:
    assert parse_oopses("") == []
    assert parse_oopses("LABCTL-READY g 6.1\n[ 1.0] e1000 0000:00:04.0 eth1: link up\n") == []


def test_return_addresses_and_exact_addresses() -> None:
    assert Frame("f", 0x10, 0x20).is_return_address
    assert not Frame("f", 0x10, 0x20, kind="rip").is_return_address
    assert not Frame("f", 0x10, 0x20, kind="regs").is_return_address
    assert not Frame("f", 0, 0x20).is_return_address  # offset 0 cannot follow a call
    assert Frame("f", 0x4e, 0x891, "8139cp").symbol == "f+0x4e/0x891"


def test_build_id_after_module_name_is_accepted() -> None:
    [o] = parse_oopses("BUG: x\nCall Trace:\n e1000_clean+0xc2/0x6b0 [e1000 0123456789abcdef0123456789abcdef01234567]\n")
    assert o.frames[0].module == "e1000"


# -- titles --------------------------------------------------------------------------

def _title(*lines: str) -> str:
    [o] = parse_oopses("\n".join(lines))
    return o.title


@pytest.mark.parametrize(("lines", "title"), [
    (["BUG: kernel NULL pointer dereference, address: 0000000000000010", "Oops: 0000 [#1] SMP",
      "RIP: 0010:cp_start_xmit+0x4e/0x891 [8139cp]"], "BUG: kernel NULL pointer dereference in cp_start_xmit"),
    (["BUG: unable to handle page fault for address: ffffc90000a1b000", "RIP: 0010:foo.isra.0+0x1/0x2"],
     "BUG: unable to handle page fault in foo"),
    (["BUG: scheduling while atomic: ping/135/0x00000102", "Call Trace:", " dump_stack_lvl+0x44/0x5c",
      " __schedule_bug.cold+0x8e/0x9b", " schedule+0x5d/0xe0", " msleep+0x2d/0x40"],
     "BUG: scheduling while atomic in schedule"),
    (["BUG: sleeping function called from invalid context at mm/slab.h:710", "Call Trace:",
      " dump_stack_lvl+0x44/0x5c", " __might_resched.cold+0xcc/0xe0", " kmem_cache_alloc+0x2f/0x300"],
     "BUG: sleeping function called from invalid context in kmem_cache_alloc"),
    (["kernel BUG at net/core/skbuff.c:120!", "invalid opcode: 0000 [#1] PREEMPT SMP NOPTI",
      "RIP: 0010:skb_panic+0x4c/0x4e"], "kernel BUG in skb_panic"),
    (["Oops: invalid opcode: 0000 [#1] PREEMPT SMP NOPTI", "RIP: 0010:foo+0x1/0x2"], "Oops: invalid opcode in foo"),
    (["Oops: 0002 [#1] SMP", "RIP: 0010:foo.cold+0x1/0x2"], "Oops in foo"),
    (["general protection fault, probably for non-canonical address 0xdead000000000122: 0000 [#1] SMP",
      "RIP: 0010:__list_del_entry_valid+0x1/0x2"], "general protection fault in __list_del_entry_valid"),
    (["WARNING: CPU: 0 PID: 1 at net/sched/sch_generic.c:525 dev_watchdog+0x20b/0x210",
      "RIP: 0010:dev_watchdog+0x20b/0x210"], "WARNING in dev_watchdog"),
    (["WARNING: at net/core/dev.c:2100 skb_warn_bad_offload+0x7e/0x90()", "Call Trace:", " x+0x1/0x2"],
     "WARNING in skb_warn_bad_offload"),
    (["WARNING: possible circular locking dependency detected", "Call Trace:", " lock_acquire+0x1/0x2"],
     "WARNING: possible circular locking dependency detected"),
    (["Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000009"],
     "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000009"),
    (["unregister_netdevice: waiting for veth0 to become free. Usage count = -1"],
     "unregister_netdevice: waiting for veth0 to become free"),
])
def test_titles(lines: list[str], title: str) -> None:
    assert _title(*lines) == title


def test_title_without_any_function() -> None:
    o = Oops(kind="bug", headline="BUG: Bad page state in process swapper  pfn:01234", text="Bad page state in "
             "process swapper  pfn:01234", line_no=1)
    assert make_title(o) == "BUG: Bad page state"


@pytest.mark.parametrize(("name", "clean"), [("foo.isra.0", "foo"), ("foo.cold", "foo"),
                                             ("foo.constprop.0.isra.0", "foo"), ("foo.part.0.cold", "foo"),
                                             ("finish_task_switch.isra.0", "finish_task_switch"), ("foo", "foo")])
def test_clean_func(name: str, clean: str) -> None:
    assert clean_func(name) == clean
