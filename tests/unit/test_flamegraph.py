"""Flame graphs: folding perf script text, folded round-trip, SVG layout, colours, script and CSP hash."""

from __future__ import annotations

import base64
import hashlib
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from labctl.report.flamegraph import SCRIPT, frame_colour, module_hue, render_diff_svg, render_svg, script_csp_source
from labctl.trace.flamefold import Frame, Stack, fold_perf_script, kallsyms_modules, read_folded, write_folded

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FLAME = FIXTURES / "flame"
NS = "{http://www.w3.org/2000/svg}"
EVENT = "cpu-clock:pppH"


@pytest.fixture(scope="module")
def iperf() -> dict[Stack, int]:
    folded = fold_perf_script((FLAME / "iperf3-e1000.perf-script.txt").read_text())
    assert folded.skipped_lines == 0 and folded.skipped_samples == 0
    return folded.events[EVENT]


def k(fn: str) -> Frame:
    return Frame(fn, "kernel")


def functions(stack: Stack) -> list[str]:
    return [f.function for f in stack]


def leaf_count(stacks: dict[Stack, int], leaf: str) -> int:
    return sum(n for s, n in stacks.items() if s[-1].function == leaf)


def frames_of(svg: str) -> list[ET.Element]:
    """The frame groups of a graph (standalone or inline), in document order."""
    root = ET.fromstring(svg)
    return [g for g in root.iter() if g.tag.endswith("g") and "lfg-f" in g.get("class", "").split()]


def notes_of(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter() if t.get("class") == "lfg-note"]


def fill_of(g: ET.Element) -> str:
    return next(c for c in g if c.tag.endswith("rect")).get("fill", "")


def title_of(g: ET.Element) -> str:
    return next(c for c in g if c.tag.endswith("title")).text or ""


def by_function(svg: str, name: str) -> ET.Element:
    return next(g for g in frames_of(svg) if g.get("data-f") == name)


# --------------------------------------------------------------------------- folding


def test_fixture_folds_to_every_sample_with_counts(iperf: dict[Stack, int]) -> None:
    assert sum(iperf.values()) == 41
    assert leaf_count(iperf, "e1000_xmit_frame") == 8
    assert leaf_count(iperf, "e1000_tx_map") == 2
    assert leaf_count(iperf, "copy_user_enhanced_fast_string") == 6
    assert leaf_count(iperf, "native_safe_halt") == 12
    assert leaf_count(iperf, "tcp_ack") == 3
    by_process: dict[str, int] = {}
    for stack, n in iperf.items():
        by_process[stack[0].function] = by_process.get(stack[0].function, 0) + n
    assert by_process == {"iperf3": 18, "swapper": 21, "ksoftirqd/0": 2}


def test_stacks_run_root_to_leaf_with_offsets_stripped(iperf: dict[Stack, int]) -> None:
    xmit = next(s for s in iperf if s[-1].function == "e1000_xmit_frame")
    names = functions(xmit)
    assert names[:3] == ["iperf3", "__libc_start_call_main", "[unknown]"]
    assert names[-4:] == ["__dev_queue_xmit", "sch_direct_xmit", "dev_hard_start_xmit", "e1000_xmit_frame"]
    assert names.index("tcp_sendmsg") < names.index("__tcp_transmit_skb") < names.index("dev_hard_start_xmit")
    assert not any("+0x" in n for s in iperf for n in functions(s))


def test_frames_know_their_module_or_dso(iperf: dict[Stack, int]) -> None:
    frames = {f for s in iperf for f in s}
    assert Frame("e1000_xmit_frame", "module", "e1000") in frames
    assert Frame("e1000_clean_rx_irq", "module", "e1000") in frames
    assert Frame("tcp_sendmsg", "kernel") in frames
    assert Frame("Nwrite", "user", "libiperf.so.0.0.0") in frames
    assert Frame("[unknown]", "user", "iperf3") in frames
    assert Frame("[unknown]", "unknown") in frames
    assert Frame("swapper", "process") in frames
    assert Frame("e1000_xmit_frame", "module", "e1000").where == "module e1000"


def test_events_are_kept_apart() -> None:
    folded = fold_perf_script((FLAME / "mixed-events.perf-script.txt").read_text())
    assert list(folded.events) == ["net:net_dev_queue", EVENT]
    assert folded.total("net:net_dev_queue") == 3 and folded.total(EVENT) == 2
    assert folded.total("nope") == 0
    queue = folded.events["net:net_dev_queue"]
    assert all(s[-1].function == "__dev_queue_xmit" for s in queue)
    assert not any(f.function == "e1000_xmit_frame" for s in queue for f in s)
    assert {s[-1].function for s in folded.events[EVENT]} == {"e1000_xmit_frame", "native_safe_halt"}


def test_samples_without_callchains_fold_from_the_header_line() -> None:
    """Real perf 6.1 output of ``perf record`` without -g: one frame on each header line, no blank lines."""
    folded = fold_perf_script((FIXTURES / "trace/misc/perf-script-head.txt").read_text())
    assert list(folded.events) == ["cpu-clock"] and folded.total("cpu-clock") == 300
    assert folded.skipped_lines == 0 and folded.skipped_samples == 0
    stacks = folded.events["cpu-clock"]
    assert stacks[(Frame("swapper", "process"), k("native_safe_halt"))] > 0
    assert (Frame("perf", "process"), Frame("[unknown]", "user", "perf")) in stacks
    assert (Frame("perf", "process"), Frame("[unknown]", "user", "libc.so.6")) in stacks


def test_without_comm_the_stack_starts_at_the_outermost_frame() -> None:
    folded = fold_perf_script((FLAME / "mixed-events.perf-script.txt").read_text(), comm=False)
    assert (k("default_idle"), k("native_safe_halt")) in folded.events[EVENT]


def test_odd_input_is_skipped_and_counted_never_raised() -> None:
    text = ("garbage before any sample\n"
            "  iperf3   612 [001]  1.000001:  1 cpu-clock: \n"
            "\tffffffff81000000 tcp_sendmsg+0x2c ([kernel.kallsyms])\n"
            "\t  some srcline:12\n"
            "\n"
            "  iperf3   612 1.000002: cpu-clock: \n"  # no cpu, no period (older perf)
            "\tffffffff81000000 a;b+0x1 ([kernel.kallsyms])\n"
            "\n"
            "  iperf3   612 [001]  1.000003:  1 cpu-clock: \n"
            "\tffffffff81000000 ip_rcv+0x2c ([kernel.kallsyms])\n")  # cut off: no closing blank line
    folded = fold_perf_script(text)
    assert folded.skipped_lines == 2 and folded.skipped_samples == 1
    assert folded.events["cpu-clock"] == {(Frame("iperf3", "process"), k("tcp_sendmsg")): 1,
                                          (Frame("iperf3", "process"), k("a:b")): 1}
    for junk in ("", "\n\n", "\x00\xff", "\t1234 x (", "a 1 [0] 1.0: ev:"):
        fold_perf_script(junk)
        read_folded(junk)


def test_frameless_samples_are_skipped_without_comm() -> None:
    text = "  swapper   0 [000]  1.0:  1 net:net_dev_queue: dev=eth1 len=66\n"
    assert fold_perf_script(text).events["net:net_dev_queue"] == {(Frame("swapper", "process"),): 1}
    assert fold_perf_script(text, comm=False).skipped_samples == 1


def test_kallsyms_gives_kernel_frames_back_their_module() -> None:
    kallsyms = ("ffffffff81000000 T tcp_sendmsg\n"
                "ffffffffc0150000 t e1000_xmit_frame\t[e1000]\n"
                "ffffffffc0160000 t init_module\t[e1000]\n"
                "ffffffffc0170000 t init_module\t[8139cp]\n")
    mods = kallsyms_modules(kallsyms)
    assert mods == {"e1000_xmit_frame": "e1000"}
    text = ("  iperf3   612 [001]  1.0:  1 cpu-clock: \n"
            "\tffffffffc0150000 e1000_xmit_frame+0x17 ([kernel.kallsyms])\n"
            "\tffffffff81000000 tcp_sendmsg+0x17 ([kernel.kallsyms])\n\n")
    stack = next(iter(fold_perf_script(text, module_symbols=mods).events["cpu-clock"]))
    assert stack[1:] == (k("tcp_sendmsg"), Frame("e1000_xmit_frame", "module", "e1000"))


def test_inlined_frames_take_their_callers_module() -> None:
    """perf prints an inlined callee as ``addr sym (inlined)``, without a dso, before its container."""
    text = ("  iperf3   612 [001]  1.0:  1 cpu-clock: \n"
            "\tffffffffc0150017 e1000_maybe_stop_tx (inlined)\n"
            "\tffffffffc0150017 e1000_xmit_frame+0x17 ([e1000])\n\n")
    stack = next(iter(fold_perf_script(text).events["cpu-clock"]))
    assert stack[1:] == (Frame("e1000_xmit_frame", "module", "e1000"), Frame("e1000_maybe_stop_tx", "module", "e1000"))


@pytest.mark.parametrize(("dso", "kind", "module"), [
    ("[kernel.kallsyms]", "kernel", ""), ("/boot/vmlinux-6.1.0-56-amd64", "kernel", ""),
    ("[virtio_net]", "module", "virtio_net"), ("/lib/modules/6.1/kernel/e1000.ko.xz", "module", "e1000"),
    ("[unknown]", "unknown", ""), ("[vdso]", "user", "vdso"), ("/usr/bin/iperf3", "user", "iperf3"),
    ("/usr/bin/iperf3 (deleted)", "user", "iperf3"),
])
def test_dso_kinds(dso: str, kind: str, module: str) -> None:
    text = f"  x   1 [000]  1.0:  1 cpu-clock: \n\t7f00 fn+0x1 ({dso})\n\n"
    assert next(iter(fold_perf_script(text).events["cpu-clock"]))[-1] == Frame("fn", kind, module)


# --------------------------------------------------------------------------- folded text


def test_folded_text_round_trips_with_module_annotation(iperf: dict[Stack, int]) -> None:
    text = write_folded(iperf)
    assert read_folded(text) == iperf
    lines = text.splitlines()
    assert lines == sorted(lines) and len(lines) == len(iperf)
    assert ("iperf3_[p];__libc_start_call_main_[u:libc.so.6];[unknown]_[u:iperf3];" in text)
    xmit = next(line for line in lines if line.rsplit(" ", 1)[0].endswith("e1000_xmit_frame_[k:e1000]"))
    assert xmit.endswith(" 8") and ";dev_hard_start_xmit_[k];" in xmit


def test_foreign_folded_text_reads_as_unknown_frames() -> None:
    stacks = read_folded("# comment\nmain;foo_[k];bar 3\nmain;foo_[k];bar 2\nbad line\nx;y notanumber\n")
    assert stacks == {(Frame("main"), k("foo"), Frame("bar")): 5}


# --------------------------------------------------------------------------- SVG


def test_standalone_svg_is_well_formed_and_self_contained(iperf: dict[Stack, int]) -> None:
    svg = render_svg(iperf, title="iperf3 over e1000")
    root = ET.fromstring(svg.encode())
    assert root.tag == NS + "svg"
    assert svg.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg"')
    assert re.findall(r"https?://[^\s\"']*", svg) == ["http://www.w3.org/2000/svg"]
    assert "href" not in svg and "url(" not in svg
    assert render_svg(iperf, title="iperf3 over e1000") == svg


def test_inline_svg_has_no_declaration_no_namespace_and_prefixed_ids(iperf: dict[Stack, int]) -> None:
    one = render_svg(iperf, inline=True, id_prefix="s1-")
    two = render_diff_svg(iperf, iperf, inline=True, id_prefix="s2-")
    assert one.startswith('<svg class="lfg"') and "http" not in one and "<?xml" not in one
    ids = [re.findall(r'\bid="([^"]+)"', svg) for svg in (one, two)]
    assert ids[0] and all(i.startswith("s1-") for i in ids[0]) and all(i.startswith("s2-") for i in ids[1])
    assert len(set(ids[0])) == len(ids[0]) and not set(ids[0]) & set(ids[1])
    ET.fromstring(one)
    with pytest.raises(ValueError):
        render_svg(iperf, id_prefix='x" onload="alert(1)')


def test_widths_follow_samples_and_children_sum_to_their_parent(iperf: dict[Stack, int]) -> None:
    svg = render_svg(iperf, width=1220)
    frames = frames_of(svg)
    root = frames[0]
    assert root.get("data-f") == "all" and root.get("data-n") == "41" and root.get("data-d") == "0"
    rect = next(c for c in root if c.tag.endswith("rect"))
    assert float(rect.get("width", "")) == pytest.approx(1200)
    top = [g for g in frames if g.get("data-d") == "1"]
    assert sum(int(g.get("data-n", "")) for g in top) == 41
    assert [g.get("data-f") for g in top] == ["iperf3", "ksoftirqd/0", "swapper"]
    for g in frames:
        width = float(next(c for c in g if c.tag.endswith("rect")).get("width", ""))
        assert width == pytest.approx(1200 * int(g.get("data-n", "")) / 41, abs=0.01)
    assert by_function(svg, "e1000_xmit_frame").get("data-n") == "10"


def test_narrow_frames_are_dropped_and_their_samples_stated() -> None:
    stacks = {(k("a"), k("b")): 10_000, (k("a"), k("tiny")): 1, (k("c"),): 2}
    svg = render_svg(stacks, width=1000, min_width=0.15)  # 980 px / 10003: tiny 0.098 px, c 0.196 px
    shown = {g.get("data-f") for g in frames_of(svg)}
    assert "tiny" not in shown and {"a", "b", "c"} <= shown
    assert notes_of(svg)[0] == ("not drawn: frames narrower than 0.15 px, holding 1 sample "
                                "(0.01%; their callers' widths include them)")
    assert notes_of(render_svg(stacks, width=1000, min_width=0.01))[0].startswith("every frame is drawn")


def test_tooltips_name_function_module_samples_and_percent(iperf: dict[Stack, int]) -> None:
    svg = render_svg(iperf)
    assert title_of(by_function(svg, "e1000_xmit_frame")) == "e1000_xmit_frame [module e1000]: 10 samples, 24.39%"
    assert title_of(by_function(svg, "tcp_sendmsg")) == "tcp_sendmsg [kernel]: 16 samples, 39.02%"
    assert title_of(by_function(svg, "Nwrite")) == "Nwrite [user libiperf.so.0.0.0]: 17 samples, 41.46%"
    assert title_of(by_function(svg, "swapper")) == "swapper [process]: 21 samples, 51.22%"
    assert title_of(frames_of(svg)[0]) == "all: 41 samples, 100.00%"


def test_legend_lists_kinds_and_modules_present(iperf: dict[Stack, int]) -> None:
    legend = next(g for g in ET.fromstring(render_svg(iperf)).iter() if g.get("class") == "lfg-legend")
    labels = [t.text for t in legend if t.tag.endswith("text")]
    assert labels == ["process", "kernel", "module e1000", "user space", "unknown"]
    only_kernel = next(g for g in ET.fromstring(render_svg({(k("a"),): 1})).iter() if g.get("class") == "lfg-legend")
    assert [t.text for t in only_kernel if t.tag.endswith("text")] == ["kernel"]


def test_colours_tell_kinds_and_modules_apart() -> None:
    e1000 = frame_colour(Frame("e1000_clean", "module", "e1000"))
    assert e1000 == frame_colour(Frame("e1000_clean", "module", "e1000"))
    assert module_hue("e1000") != module_hue("virtio_net") and 170 <= module_hue("8139cp") < 320
    assert module_hue("e1000") == pytest.approx(module_hue("e1000"))
    same_fn = {frame_colour(Frame("f", kind, "m")) for kind in ("kernel", "module", "user", "process", "unknown")}
    assert len(same_fn) == 5
    assert re.fullmatch(r"#[0-9a-f]{6}", e1000)


def test_names_are_escaped() -> None:
    nasty = 'operator<<(a&b, "c")'
    svg = render_svg({(Frame(nasty, "user", "lib<x>.so"),): 3}, title='<t&"i">')
    root = ET.fromstring(svg)
    frame = by_function(svg, nasty)
    assert frame.get("data-f") == nasty
    assert title_of(frame) == 'operator<<(a&b, "c") [user lib<x>.so]: 3 samples, 100.00%'
    assert next(c for c in root if c.tag.endswith("title")).text == '<t&"i">'
    assert "<<(" not in svg and 'a&b' not in svg
    ET.fromstring(render_svg({(Frame("bad\x01char"),): 1}))


def test_empty_input_renders_a_graph_that_says_so() -> None:
    svg = render_svg({})
    assert frames_of(svg) == [] and "no samples" in svg
    ET.fromstring(render_diff_svg({}, {}))


# --------------------------------------------------------------------------- script and CSP


def embedded_script(svg: str) -> str:
    scripts = [s for s in ET.fromstring(svg).iter() if s.tag.endswith("script")]
    assert len(scripts) == 1
    return scripts[0].text or ""


def test_csp_hash_matches_the_embedded_script_byte_for_byte(iperf: dict[Stack, int]) -> None:
    for svg in (render_svg(iperf), render_svg(iperf, inline=True, id_prefix="a-"),
                render_diff_svg(iperf, iperf, inline=True)):
        raw = re.search(r"<script><!\[CDATA\[(.*)\]\]></script>", svg, re.DOTALL)
        assert raw is not None and raw[1] == SCRIPT == embedded_script(svg)
        digest = base64.b64encode(hashlib.sha256(raw[1].encode()).digest()).decode()
        assert script_csp_source() == f"'sha256-{digest}'"
    assert "]]>" not in SCRIPT and "http" not in SCRIPT and "</" not in SCRIPT
    assert "<script" not in render_svg(iperf, with_script=False)


def test_script_finds_graphs_by_class_and_uses_what_the_svg_carries(iperf: dict[Stack, int]) -> None:
    root = ET.fromstring(render_svg(iperf, inline=True, id_prefix="z-"))
    assert root.get("class") == "lfg"
    for attr in ("data-total", "data-left", "data-plot", "data-cw"):
        assert attr in SCRIPT and root.get(attr)
    for cls in ("lfg-search", "lfg-clear", "lfg-reset", "lfg-matched", "lfg-root"):
        assert cls in SCRIPT and any(cls in (e.get("class") or "").split() for e in root.iter())
    assert "getElementById" not in SCRIPT  # ids are for the page; the script never depends on them


# --------------------------------------------------------------------------- differential


def diff_fixture() -> tuple[dict[Stack, int], dict[Stack, int]]:
    p = Frame("iperf3", "process")
    before = {(p, k("tcp_sendmsg"), Frame("e1000_xmit_frame", "module", "e1000")): 50,
              (p, k("tcp_recvmsg")): 30, (p, k("gone")): 20}
    after = {(p, k("tcp_sendmsg"), Frame("e1000_xmit_frame", "module", "e1000")): 400,  # 50% -> 80%
             (p, k("tcp_recvmsg")): 100}  # 30% -> 20%
    return before, after


def test_diff_colours_grew_red_shrank_blue_unchanged_neutral() -> None:
    before, after = diff_fixture()
    svg = render_diff_svg(before, after)
    grew, shrank = fill_of(by_function(svg, "e1000_xmit_frame")), fill_of(by_function(svg, "tcp_recvmsg"))
    assert grew[:3] == "#ff" and grew[3:5] == grew[5:7] and grew != "#ffffff"
    assert shrank[5:] == "ff" and shrank[1:3] == shrank[3:5]
    assert fill_of(by_function(svg, "iperf3")) == "#e4e4e4"  # 100% of both
    assert fill_of(by_function(svg, "tcp_sendmsg")) == grew  # the largest change: full intensity
    assert grew == "#ff0000"
    assert int(shrank[1:3], 16) > 0  # a third of the largest change: paler
    assert {g.get("data-f") for g in frames_of(svg)} == {"all", "iperf3", "tcp_sendmsg", "e1000_xmit_frame",
                                                        "tcp_recvmsg"}
    assert title_of(by_function(svg, "tcp_recvmsg")) == ("tcp_recvmsg [kernel]: after 100 samples (20.00%), "
                                                         "before 30 (30.00%), -10.00 points")


def test_diff_normalises_by_each_side_and_states_what_vanished() -> None:
    before, after = diff_fixture()
    doubled = {s: 2 * n for s, n in after.items()}
    assert {fill_of(g) for g in frames_of(render_diff_svg(after, doubled))[1:]} == {"#e4e4e4"}  # same shares
    notes = notes_of(render_diff_svg(before, after))
    assert notes[1] == ("before: 20 of 100 samples (20.00%) are on paths after lacks and not drawn; "
                        "largest: gone (20)")
    assert notes_of(render_diff_svg(after, after))[1] == "before: every path also occurs in after"
    assert notes_of(render_diff_svg({}, after))[1] == "before: no samples"


def test_diff_is_deterministic_and_searchable() -> None:
    before, after = diff_fixture()
    svg = render_diff_svg(before, after, inline=True, id_prefix="d-")
    assert svg == render_diff_svg(dict(reversed(list(before.items()))), after, inline=True, id_prefix="d-")
    assert embedded_script(svg) == SCRIPT and 'id="d-search"' in svg
