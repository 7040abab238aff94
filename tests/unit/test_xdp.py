"""XDP programs on a NIC as data (labctl.lab.xdp, the build in labctl.lab.bpfbuild), how they are
attached (labctl.up.xdpload) and what xdpdump and the programs' counters say (labctl.trace.xdpverdicts);
the lab file's problems are golden too (tests/labs/invalid/xdp-problems)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from labctl.errors import LabFileError
from labctl.lab import load_lab
from labctl.lab.bpfbuild import include_problem
from labctl.lab.xdp import Xdp
from labctl.trace.xdpverdicts import counter_values, filter_status, parse_dump, rows
from labctl.up.xdpload import command, tc_command

ROOT = Path(__file__).resolve().parents[2]
needs_clang = pytest.mark.skipif(shutil.which("clang") is None, reason="no clang on this host")


def _lab(tmp_path: Path, xdp: str, model: str = "virtio") -> Path:
    shutil.copy(ROOT / "labs" / "xdp-drop.c", tmp_path / "drop.c")
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"name: x\nnetworks: {{n: {{}}}}\nguests:\n  g:\n    nics:\n"
                   f"      - {{name: eth1, model: {model}, network: n, xdp: {xdp}}}\n")
    return lab


@needs_clang
def test_a_source_is_built_and_its_mode_is_the_drivers_best(tmp_path: Path) -> None:
    nic = load_lab(_lab(tmp_path, "{source: drop.c, counters: xdp_stats}")).guests["g"].nics[0]
    assert nic.xdp is not None and nic.xdp.mode == "native" and nic.xdp.object.startswith(b"\x7fELF")
    assert nic.to_dict()["xdp"]["summary"] == "XDP drop.c (native)"
    again = Xdp.from_dict(nic.to_dict()["xdp"])
    assert again.object == nic.xdp.object and again.counters == "xdp_stats"
    e1000 = load_lab(_lab(tmp_path, "{source: drop.c}", "e1000")).guests["g"].nics[0]
    assert e1000.xdp is not None and e1000.xdp.mode == "generic"


def test_native_xdp_on_a_driver_without_it_is_refused_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(LabFileError) as info:
        load_lab(_lab(tmp_path, "{source: drop.c, mode: native}", "rtl8139"))
    (p,) = info.value.problems
    assert (p.line, p.path) == (6, "guests.g.nics[0].xdp.mode") and "rtl8139's driver (8139cp/8139too)" in p.message


@needs_clang
def test_a_source_that_does_not_compile_is_the_compilers_message(tmp_path: Path) -> None:
    lab = _lab(tmp_path, "{source: bad.c}")
    (tmp_path / "bad.c").write_text("#include <linux/bpf.h>\nint f(struct xdp_md *c) { return nope; }\n")
    with pytest.raises(LabFileError) as info:
        load_lab(lab)
    (p,) = info.value.problems
    assert p.line == 6 and "bad.c:2:" in p.message and "undeclared identifier 'nope'" in p.message
    assert str(tmp_path) not in p.message


@pytest.mark.parametrize(("text", "why"), [
    ('#include "/etc/passwd"\n', "a relative name"),
    ('#include "../up.h"\n', "a relative name"),
    ("#include <stdio.h>\n", "no libc"),
    ("#define H <linux/bpf.h>\n#include H\n", "literally"),
    ("%:include </etc/shadow>\n", "a relative name"),
    ('#include \\\n "/etc/shadow"\n', "a relative name"),
    ('asm(".incbin \\"/etc/shadow\\"");\n', "incbin"),
    ("#if __has_include(</etc/shadow>)\n#endif\n", "__has_include"),
])
def test_an_include_of_a_host_file_is_refused_before_clang_runs(tmp_path: Path, text: str, why: str) -> None:
    assert why in (include_problem(text, "p.c", tmp_path) or "")


def test_includes_of_the_labs_files_and_the_allowed_headers_pass(tmp_path: Path) -> None:
    (tmp_path / "h.h").write_text("#include <bpf/bpf_helpers.h>\n")
    assert include_problem('#include <linux/bpf.h>\n#include "h.h"\n', "p.c", tmp_path) is None
    (tmp_path / "h.h").write_text('#include "/etc/passwd"\n')
    assert "h.h:1:" in (include_problem('#include "h.h"\n', "p.c", tmp_path) or "")


def test_attach_commands_per_mode_and_kind() -> None:
    src = command("eth1", Xdp("native", source="drop.c", object=b"\x7fELF"))
    assert "ip link set dev eth1 xdpdrv obj /run/labctl-xdp/eth1.o sec xdp" in src
    gen = command("eth2", Xdp("generic", source="drop.c", object=b"\x7fELF"))
    assert "xdpgeneric obj" in gen
    flt = command("eth3", Xdp("generic", ports=(9, 53), ips=("10.0.0.1",)))
    assert "xdp-filter load -m skb -p allow eth3" in flt
    assert "xdp-filter port 9 && xdp-filter port 53 && xdp-filter ip -m src 10.0.0.1" in flt


DUMP = """\
listening on eth2, ingress XDP program ID 15 func drop_all, capture mode exit, capture size 262144 bytes
1796172840.763023040: drop_all()@exit[DROP]: packet size 60 bytes, captured 60 bytes on if_index 2, rx queue 0, id 1
  0x0000:  ff ff ff ff ff ff 52 54 00 6c 99 aa 08 06 00 01  ......RT.l......
  0x0010:  08 00                                            ..
1796172841.776451751: drop_all()@exit[PASS]: packet size 60 bytes, captured 60 bytes on if_index 2, rx queue 0, id 2
1796172842.800084460: drop_all()@exit[DROP]: packet size 60 bytes, captured 60 bytes on if_index 2, rx queue 0, id 3

3 packets captured
1 packets dropped by perf ring
"""


def test_xdpdumps_verdicts_and_losses_are_parsed() -> None:
    d = parse_dump(DUMP)
    assert [v.action for v in d.verdicts] == ["DROP", "PASS", "DROP"] and d.captured == 3 and d.lost == 1
    assert d.verdicts[0].data[:6] == b"\xff" * 6 and len(d.verdicts[0].data) == 18 and d.verdicts[1].data == b""


def test_counters_of_a_per_cpu_map_and_xdp_filter_and_the_rows() -> None:
    dump = ('[{"formatted":{"key":1,"values":[{"cpu":0,"value":7},{"cpu":1,"value":3}]}},'
            '{"formatted":{"key":2,"values":[{"cpu":0,"value":4}]}}]')
    assert counter_values(dump) == {"DROP": 10, "PASS": 4}
    assert counter_values("not json") == {}
    assert filter_status("  XDP_ABORTED   0 pkts   0 KiB\n  XDP_DROP   12 pkts   1 KiB\n") == {"ABORTED": 0, "DROP": 12}
    (r,) = rows("b", "eth2", "drop.c", "generic", parse_dump(DUMP), {"DROP": 5}, {"DROP": 7})
    assert (r.action, r.count, r.own, r.lost, r.where) == ("DROP", 2, 2, 1, "XDP drop.c (drop_all, generic) on eth2")
    assert r.as_dict()["reason"] == "XDP_DROP" and r.as_dict()["xdp"]["own_count"] == 2


def _frame() -> bytes:
    ip = bytes.fromhex("4500001c1234400040010000") + bytes([10, 9, 1, 1, 10, 9, 1, 2])
    return b"\xff" * 6 + b"\x52\x54\x00\x00\x00\x01" + b"\x08\x00" + ip + bytes.fromhex("0800f7ff00010001")


def test_a_journey_lost_at_an_xdp_nic_ends_at_the_programs_verdict(tmp_path: Path) -> None:
    import json

    from labctl.trace.hops import parse_frame
    from labctl.trace.pathmodel import End, Hop, Journey
    from labctl.trace.xdphops import XDP_FILE, apply_step

    header = parse_frame(_frame())
    assert header is not None
    lost = Journey(header, [Hop("a", "xmit", "net_dev_start_xmit", "eth1", 1_000_000)],
                   End("lost", "a", "lost on the wire a.eth1 → b.eth1"))
    hexdump = "".join(f"  0x{i:04x}:  {' '.join(f'{b:02x}' for b in _frame()[i:i + 16])}\n"
                      for i in range(0, len(_frame()), 16))
    text = ("0.001100: xdp_drop_icmp()@exit[DROP]: packet size 42 bytes, captured 42 bytes on if_index 2, rx queue 0, "
            f"id 1\n{hexdump}")
    (tmp_path / XDP_FILE.format(guest="b")).write_text(json.dumps(
        {"wall_minus_mono": 0, "nics": {"eth1": {"program": "xdp-drop.c", "mode": "native", "text": text}}}))
    other = Journey(header, [], End("delivered", "b", "delivered"))
    apply_step(tmp_path, ["a", "b"], [lost, other])
    assert lost.end.text == "dropped on b by XDP program xdp_drop_icmp (xdp-drop.c, native) on eth1: XDP_DROP"
    assert (lost.end.kind, lost.end.reason, lost.end.guest) == ("dropped", "XDP_DROP", "b")
    xdp = lost.hops[-1]
    assert (xdp.guest, xdp.point, xdp.dev, xdp.note, xdp.t) == ("b", "xdp", "eth1", "DROP", 1_100_000)
    assert other.end.kind == "delivered" and other.hops == []  # a delivered packet met no XDP verdict


@needs_clang
def test_compare_names_a_nics_xdp_program_that_differs(tmp_path: Path) -> None:
    from labctl.report.comparison import _net_differences

    def manifest(xdp: str) -> dict[str, object]:
        lab = load_lab(_lab(tmp_path, xdp))
        return {"lab": {"resolved": lab.to_dict()}}

    diff = _net_differences(manifest("{source: drop.c}"), manifest("{filter: {ports: [9]}}"))
    ((what, a, b),) = diff
    assert what == "XDP of g.eth1" and a.startswith("XDP drop.c (native) sha256 ") and b == "XDP xdp-filter allow ports 9 (native)"
    assert _net_differences(manifest("{source: drop.c}"), manifest("{source: drop.c}")) == []


def test_the_graph_and_status_show_a_nics_program() -> None:
    from labctl.cli.status_cmd import _net_marks
    from labctl.net.graph.nodes import _nic_row

    nic = {"name": "eth1", "model": "e1000", "network": "n", "ip": "10.0.0.1/24", "addresses": ["10.0.0.1/24"],
           "xdp": {"summary": "XDP drop.c (generic)"}}
    assert _nic_row(nic, {}).address_text == "10.0.0.1/24 · XDP drop.c (generic)"
    assert _net_marks("g", nic, set()) == "XDP drop.c (generic)"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_source_or_header_another_user_could_change_is_not_trusted(tmp_path: Path) -> None:
    lab = _lab(tmp_path, "{source: drop.c}")
    os.chown(tmp_path / "drop.c", 65534, 65534)
    with pytest.raises(LabFileError) as info:
        load_lab(lab)
    assert "XDP source" in str(info.value) and "is not trusted (labctl builds it and a guest runs it)" in str(info.value)
    os.chown(tmp_path / "drop.c", 0, 0)
    (tmp_path / "drop.c").write_text('#include "h.h"\n' + (tmp_path / "drop.c").read_text())
    (tmp_path / "h.h").write_text("\n")
    os.chown(tmp_path / "h.h", 65534, 65534)
    with pytest.raises(LabFileError) as info:
        load_lab(lab)
    assert 'drop.c:1: #include "h.h":' in str(info.value) and "is not trusted" in str(info.value)


@needs_clang
def test_a_tc_program_is_built_checked_and_attached_on_clsact(tmp_path: Path) -> None:
    from labctl.lab.xdp import Tc

    shutil.copy(ROOT / "labs" / "tc-drop.c", tmp_path / "tc-drop.c")
    lab = tmp_path / "lab.yaml"
    lab.write_text("name: x\nnetworks: {n: {}}\nguests:\n  g:\n    nics:\n"
                   "      - {name: eth1, model: e1000, network: n, tc: {source: tc-drop.c, direction: egress}}\n"
                   "      - {name: eth2, model: e1000, network: n, tc: {source: tc-drop.c, direction: up}}\n")
    with pytest.raises(LabFileError) as info:
        load_lab(lab)
    (p,) = info.value.problems
    assert (p.line, p.path) == (7, "guests.g.nics[1].tc.direction") and "unknown direction 'up'" in p.message
    lab.write_text("\n".join(lab.read_text().splitlines()[:-1]) + "\n")
    tc = load_lab(lab).guests["g"].nics[0].tc
    assert tc is not None and tc.object.startswith(b"\x7fELF") and tc.summary() == "tc tc-drop.c (egress)"
    assert Tc.from_dict(tc.to_dict()).object == tc.object
    cmd = tc_command("eth1", tc)
    assert "tc qdisc replace dev eth1 clsact" in cmd
    assert "tc filter replace dev eth1 egress pref 49152 handle 1 bpf direct-action obj /run/labctl-xdp/eth1-tc.o sec tc" in cmd
