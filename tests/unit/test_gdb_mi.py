"""Parsing and formatting gdb/MI records, with records captured from a real
session: gdb 13 attached to a TCG guest's gdbstub, breakpoint at
``e1000_xmit_frame`` (e1000 module symbols added), while pinging."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pygdbmi import gdbmiparser

from labctl.debug.gdb import (
    ArgValue,
    FrameInfo,
    StopRecord,
    Transcript,
    format_stop,
    format_transcript,
    is_breakpoint_hit,
    mi_quote,
    parse_arg,
    parse_frame,
    parse_register_names,
    parse_register_values,
    parse_stack,
    parse_stack_args,
    stop_reason,
    write_transcript,
)

# -- captured records (verbatim, from gdb 13.1 -i mi3 against QEMU 7.2's gdbstub) -----

ATTACH_STOP = (
    '*stopped,frame={addr="0xffffffff81a592eb",func="native_safe_halt",args=[],'
    'file="arch/x86/include/asm/irqflags.h",'
    'fullname="debian/build/build_amd64_none_amd64/arch/x86/include/asm/irqflags.h",line="52",'
    'arch="i386:x86-64"},thread-id="1",stopped-threads="all"')
BKPT = (
    '5^done,bkpt={number="1",type="hw breakpoint",disp="keep",enabled="y",addr="0xffffffffc0361a20",'
    'func="e1000_xmit_frame",file="drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'fullname="debian/build/build_amd64_none_amd64/drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'line="3098",thread-groups=["i1"],times="0",original-location="e1000_xmit_frame"}')
BKPT_ERROR = '6^error,msg="Function \\"nonexistent_function\\" not defined."'
HIT = (
    '*stopped,reason="breakpoint-hit",disp="keep",bkptno="1",frame={addr="0xffffffffc0361a20",'
    'func="e1000_xmit_frame",args=[{name="skb",value="0xffff88801ef33200"},'
    '{name="netdev",value="0xffff88801fbde000"}],file="drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'fullname="debian/build/build_amd64_none_amd64/drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'line="3098",arch="i386:x86-64"},thread-id="1",stopped-threads="all"')
STACK_ARGS_SIMPLE = (
    '8^done,stack-args=[frame={level="0",args=[{name="skb",type="struct sk_buff *",'
    'value="0xffff88801ef33200"},{name="netdev",type="struct net_device *",value="0xffff88801fbde000"}]}]')
STACK_ARGS_ALL = (
    '9^done,stack-args=[frame={level="0",args=[{name="skb",value="0xffff88801ef33200"},'
    '{name="netdev",value="0xffff88801fbde000"}]}]')
REGISTER_NAMES = (
    '10^done,register-names=["rax","rbx","rcx","rdx","rsi","rdi","rbp","rsp","r8","r9","r10","r11",'
    '"r12","r13","r14","r15","rip","eflags","cs","ss","ds","es","fs","gs","st0","","","fs_base"]')
REGISTER_VALUES = (
    '11^done,register-values=[{number="16",value="0xffffffffc0361a20"},{number="7",value="0xffffc900006bf738"},'
    '{number="5",value="0xffff88801ef33200"},{number="4",value="0xffff88801fbde000"}]')
STACK = (
    '12^done,stack=[frame={level="0",addr="0xffffffffc0361a20",func="e1000_xmit_frame",'
    'file="drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'fullname="debian/build/build_amd64_none_amd64/drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'line="3098",arch="i386:x86-64"},frame={level="1",addr="0xffffffff817dcc70",func="__netdev_start_xmit",'
    'file="include/linux/netdevice.h",fullname="debian/build/build_amd64_none_amd64/include/linux/netdevice.h",'
    'line="4898",arch="i386:x86-64"},frame={level="2",addr="0xffffffff817dcc70",func="netdev_start_xmit",'
    'file="include/linux/netdevice.h",fullname="debian/build/build_amd64_none_amd64/include/linux/netdevice.h",'
    'line="4912",arch="i386:x86-64"},frame={level="3",addr="0xffffffff817dcc70",func="xmit_one",'
    'file="net/core/dev.c",fullname="debian/build/build_amd64_none_amd64/net/core/dev.c",line="3706",'
    'arch="i386:x86-64"}]')
STEP = (
    '*stopped,reason="end-stepping-range",frame={addr="0xffffffffc0361a36",func="e1000_xmit_frame",'
    'args=[{name="skb",value="0xffff88801ef33200"},{name="netdev",value="0xffff88801fbde000"}],'
    'file="drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'fullname="debian/build/build_amd64_none_amd64/drivers/net/ethernet/intel/e1000/e1000_main.c",'
    'line="3105",arch="i386:x86-64"},thread-id="1",stopped-threads="all"')
STEPI_INLINED = (
    '*stopped,reason="end-stepping-range",frame={addr="0xffffffffc0361a39",func="vlan_get_protocol",'
    'args=[{name="skb",value="<optimized out>"}],file="include/linux/if_vlan.h",'
    'fullname="debian/build/build_amd64_none_amd64/include/linux/if_vlan.h",line="652",arch="i386:x86-64"},'
    'thread-id="1",stopped-threads="all"')
INTERRUPT = (
    '*stopped,reason="signal-received",signal-name="SIGINT",signal-meaning="Interrupt",'
    'frame={addr="0xffffffff81a592eb",func="native_safe_halt",args=[],file="arch/x86/include/asm/irqflags.h",'
    'fullname="debian/build/build_amd64_none_amd64/arch/x86/include/asm/irqflags.h",line="52",'
    'arch="i386:x86-64"},thread-id="1",stopped-threads="all"')
# An assembly frame: DWARF names .S files with the absolute build path.
ASM_FRAME = ('frame={level="9",addr="0xffffffff81c0009b",func="entry_SYSCALL_64",'
             'file="/build/reproducible-path/linux-6.1.192/arch/x86/entry/entry_64.S",'
             'fullname="/build/reproducible-path/linux-6.1.192/arch/x86/entry/entry_64.S",line="120"}')


def payload(line: str) -> dict[str, Any]:
    rec = gdbmiparser.parse_response(line)
    return rec["payload"] or {}


def test_the_captured_records_parse_as_expected() -> None:
    rec = gdbmiparser.parse_response(BKPT)
    assert (rec["type"], rec["message"], rec["token"]) == ("result", "done", 5)
    err = gdbmiparser.parse_response(BKPT_ERROR)
    assert err["message"] == "error"
    assert err["payload"]["msg"] == 'Function "nonexistent_function" not defined.'
    hit = gdbmiparser.parse_response(HIT)
    assert (hit["type"], hit["message"]) == ("notify", "stopped")


def test_a_breakpoint_hit_frame() -> None:
    stopped = payload(HIT)
    assert is_breakpoint_hit(stopped, "1")
    assert not is_breakpoint_hit(stopped, "2")
    assert stop_reason(stopped) == "breakpoint-hit"
    frame = parse_frame(stopped["frame"])
    assert frame == FrameInfo("e1000_xmit_frame", "drivers/net/ethernet/intel/e1000/e1000_main.c", 3098,
                              "0xffffffffc0361a20")
    assert frame.where() == "e1000_xmit_frame (drivers/net/ethernet/intel/e1000/e1000_main.c:3098)"
    args = [parse_arg(a) for a in stopped["frame"]["args"]]
    assert args == [ArgValue("skb", "0xffff88801ef33200"), ArgValue("netdev", "0xffff88801fbde000")]


def test_stop_reasons() -> None:
    assert stop_reason(payload(STEP)) == "end-stepping-range"
    assert stop_reason(payload(INTERRUPT)) == "signal-received SIGINT"
    assert stop_reason(payload(ATTACH_STOP)) == "unknown"  # attaching reports a stop without reason
    assert not is_breakpoint_hit(payload(INTERRUPT), "1")


def test_stack_arguments_with_and_without_types() -> None:
    simple = parse_stack_args(payload(STACK_ARGS_SIMPLE))
    assert simple == [ArgValue("skb", "0xffff88801ef33200", "struct sk_buff *"),
                      ArgValue("netdev", "0xffff88801fbde000", "struct net_device *")]
    assert [a.type for a in parse_stack_args(payload(STACK_ARGS_ALL))] == [None, None]
    assert parse_stack_args({}) == []


def test_registers_by_name() -> None:
    numbers = parse_register_names(payload(REGISTER_NAMES))
    assert numbers["rip"] == 16 and numbers["rsp"] == 7 and numbers["rdi"] == 5 and numbers["rsi"] == 4
    assert "" not in numbers and numbers["fs_base"] == 27  # gaps keep their numbers
    wanted = {r: numbers[r] for r in ("rip", "rsp", "rdi", "rsi")}
    values = parse_register_values(payload(REGISTER_VALUES), wanted)
    assert values == {"rip": "0xffffffffc0361a20", "rsp": "0xffffc900006bf738",
                      "rdi": "0xffff88801ef33200", "rsi": "0xffff88801fbde000"}


def test_backtrace_frames() -> None:
    frames = parse_stack(payload(STACK))
    assert [f.func for f in frames] == ["e1000_xmit_frame", "__netdev_start_xmit", "netdev_start_xmit", "xmit_one"]
    assert [f.level for f in frames] == [0, 1, 2, 3]
    assert frames[3].where() == "xmit_one (net/core/dev.c:3706)"


def test_absolute_assembly_paths_are_shown_relative_to_the_source_tree() -> None:
    stack = payload(f"1^done,stack=[{ASM_FRAME}]")
    (frame,) = parse_stack(stack)
    assert frame.file == "arch/x86/entry/entry_64.S"
    assert frame.line == 120


def test_a_frame_without_source() -> None:
    frame = parse_frame({"addr": "0xffffffffc0000000"})
    assert frame.where() == "0xffffffffc0000000"
    assert parse_frame(None).where() == "??"


def test_inlined_step_with_optimized_out_argument() -> None:
    frame = parse_frame(payload(STEPI_INLINED)["frame"])
    assert frame.where() == "vlan_get_protocol (include/linux/if_vlan.h:652)"


def test_mi_quote_escapes_for_c_strings() -> None:
    assert mi_quote('add-symbol-file "/a b/x.ko" 0x1') == '"add-symbol-file \\"/a b/x.ko\\" 0x1"'
    assert mi_quote("a\\b") == '"a\\\\b"'
    # What gdb gets back after MI unquoting is the original text.
    rec = gdbmiparser.parse_response("~" + mi_quote('x "y" z'))
    assert rec["payload"] == 'x "y" z'


def _transcript() -> Transcript:
    hit = payload(HIT)
    stops = [
        StopRecord("hit", 1, 0, "breakpoint-hit", parse_frame(hit["frame"]), 0.24,
                   args=[parse_arg(a) for a in hit["frame"]["args"]],
                   registers={"rip": "0xffffffffc0361a20", "rsp": "0xffffc900006bf738"},
                   backtrace=parse_stack(payload(STACK)), raw=hit),
        StopRecord("step", 1, 1, "end-stepping-range", parse_frame(payload(STEP)["frame"]), 0.25),
        StopRecord("step", 1, 2, "end-stepping-range", parse_frame(payload(STEPI_INLINED)["frame"]), 0.26),
    ]
    bkpt = payload(BKPT)["bkpt"]
    bkpt["where"] = parse_frame(bkpt).where()
    return Transcript("e1000_xmit_frame", hits=1, stops=stops, message="breakpoint at e1000_xmit_frame hit 1 time",
                      breakpoint=bkpt, timings={"attach": 0.05})


def test_text_transcript() -> None:
    text = format_transcript(_transcript())
    lines = text.splitlines()
    assert lines[0] == ("breakpoint 1 (hw breakpoint) at e1000_xmit_frame = "
                        "e1000_xmit_frame (drivers/net/ethernet/intel/e1000/e1000_main.c:3098)")
    assert lines[1] == ("hit 1 at e1000_xmit_frame (drivers/net/ethernet/intel/e1000/e1000_main.c:3098) "
                        "args: skb=0xffff88801ef33200, netdev=0xffff88801fbde000")
    assert lines[2] == "  registers: rip=0xffffffffc0361a20 rsp=0xffffc900006bf738"
    assert lines[3] == "  #0  e1000_xmit_frame (drivers/net/ethernet/intel/e1000/e1000_main.c:3098)"
    assert lines[6] == "  #3  xmit_one (net/core/dev.c:3706)"
    assert lines[7] == "  step 1: e1000_xmit_frame (drivers/net/ethernet/intel/e1000/e1000_main.c:3105)"
    assert lines[8] == "  step 2: vlan_get_protocol (include/linux/if_vlan.h:652)"
    assert "breakpoint at e1000_xmit_frame hit 1 time" in lines
    assert text.endswith("timings: attach 0.05 s\n")


def test_stops_other_than_hits_and_steps_are_labelled() -> None:
    stop = StopRecord("interrupt", 0, 0, "signal-received SIGINT", parse_frame(payload(INTERRUPT)["frame"]), 5.0)
    assert format_stop(stop) == [("interrupt stop (signal-received SIGINT) at "
                                  "native_safe_halt (arch/x86/include/asm/irqflags.h:52)")]
    odd = StopRecord("step", 1, 3, "step-timeout", FrameInfo("schedule", None, None, "0x1"), 1.0)
    assert format_stop(odd) == ["  step 3: schedule [step-timeout]"]
    failed = Transcript("nope", error="cannot set a breakpoint at nope", message="cannot set a breakpoint at nope")
    assert format_transcript(failed).splitlines()[0] == "no breakpoint set at nope"


def test_json_transcript_round_trips(tmp_path: Path) -> None:
    t = _transcript()
    write_transcript(t, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "gdb-transcript.json").read_text())
    assert data["hits"] == 1 and data["timed_out"] is False
    hit = data["stops"][0]
    assert hit["frame"]["func"] == "e1000_xmit_frame"
    assert hit["args"][0] == {"name": "skb", "value": "0xffff88801ef33200", "type": None}
    assert hit["backtrace"][3]["file"] == "net/core/dev.c"
    assert hit["raw"]["bkptno"] == "1"  # the parsed MI record is kept
    assert (tmp_path / "out" / "gdb-transcript.txt").read_text() == t.to_text()
    assert [s.kind for s in t.hit_stops] == ["hit"]
