"""The symbolizer against a tiny hand-built vmlinux/.ko and a fake addr2line (no 633 MB file needed)."""

from __future__ import annotations

import lzma
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from labctl.debug.oops import Frame, parse_oopses
from labctl.debug.symbolize import (
    ModuleIndex,
    ResultCache,
    SourceLocation,
    Symbolizer,
    SymbolTable,
    is_real_system_map,
    normalize_path,
    parse_addr2line_output,
    parse_location,
    read_elf,
)
from labctl.errors import HostError, ImageError

AX, WA = 0x6, 0x3  # section flags: alloc+exec, write+alloc
KERNEL_INIT = 0xFFFFFFFF81A49110
BUILD = "debian/build/build_amd64_none_amd64"


def write_elf(path: Path, sections: list[tuple[str, int, int, int]], symbols: list[tuple[str, int, int, str, int]],
              etype: int = 2, dwarf: bool = True) -> Path:
    """A minimal ELF64 file: section headers and a symbol table, no code.

    ``sections``: (name, address, size, flags); ``symbols``: (name, value, size, section, STT type).
    """
    names = [s[0] for s in sections] + ([".debug_info"] if dwarf else []) + [".symtab", ".strtab", ".shstrtab"]
    shstr, name_off = b"\0", {}
    for n in names:
        name_off[n], shstr = len(shstr), shstr + n.encode() + b"\0"
    strtab, symtab = b"\0", bytes(24)
    index = {n: i + 1 for i, n in enumerate(names)}
    for name, value, size, section, stt in symbols:
        symtab += struct.pack("<IBBHQQ", len(strtab), (1 << 4) | stt, 0, index[section], value, size)
        strtab += name.encode() + b"\0"
    blobs = {".symtab": symtab, ".strtab": strtab, ".shstrtab": shstr}
    data, offsets = b"", {}
    for n, blob in blobs.items():
        offsets[n], data = 64 + len(data), data + blob
    headers = [bytes(64)]
    for name, addr, size, flags in sections:
        headers.append(struct.pack("<IIQQQQIIQQ", name_off[name], 1, flags, addr, 0, size, 0, 0, 16, 0))
    if dwarf:
        headers.append(struct.pack("<IIQQQQIIQQ", name_off[".debug_info"], 1, 0, 0, 0, 0, 0, 0, 1, 0))
    headers.append(struct.pack("<IIQQQQIIQQ", name_off[".symtab"], 2, 0, 0, offsets[".symtab"], len(symtab),
                               index[".strtab"], 1, 8, 24))
    for n in (".strtab", ".shstrtab"):
        headers.append(struct.pack("<IIQQQQIIQQ", name_off[n], 3, 0, 0, offsets[n], len(blobs[n]), 0, 0, 1, 0))
    shoff = 64 + len(data)
    header = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, bytes(7), etype, 62, 1, 0, 0, shoff,
                         0, 64, 0, 0, 64, len(headers), index[".shstrtab"])
    path.write_bytes(header + data + b"".join(headers))
    return path


FAKE_ADDR2LINE = """#!{python}
import os, sys
argv = sys.argv[1:]
addrs = [l.strip() for l in sys.stdin if l.strip()]
with open(os.environ["FAKE_A2L_LOG"], "a") as log:
    log.write(" ".join(argv) + "|" + " ".join(addrs) + "\\n")
section = argv[argv.index("-j") + 1] if "-j" in argv else None
top = "drivers/net/" + section.strip(".") if section else "kernel"
for a in addrs:
    v = int(a, 16)
    print(f"0x{{v:016x}}")
    if v == {kernel_init}:
        print("kernel_init"); print("{build}/init/main.c:1500")
    elif v == 0xffffffff81000777:
        print("??"); print("??:0")
    elif v % 2:
        print("inner_fn"); print(f"{build}/./include/linux/inner.h:{{v & 0xfff}}")
        print("outer_fn"); print(f"{build}/{{top}}/outer.c:{{(v >> 4) & 0xfff}} (discriminator 2)")
    else:
        print(f"fn_{{v:x}}"); print(f"{build}/{{top}}/f.c:{{v & 0xfff}}")
"""


@dataclass
class FakeKernel:
    """A fake vmlinux, a modules tree with one .ko, and an addr2line that logs its calls."""

    vmlinux: Path
    modules: Path
    addr2line: Path
    log: Path

    def calls(self) -> list[tuple[list[str], list[int]]]:
        """(argv, addresses) of every addr2line run so far."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            argv, addrs = line.split("|")
            out.append((argv.split(), [int(a, 16) for a in addrs.split()]))
        return out


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    text = (0xFFFFFFFF81000000, 0x1000000)
    vmlinux = write_elf(tmp_path / "vmlinux", [(".text", *text, AX), (".data", 0xFFFFFFFF82A00000, 0x1000, WA)], [
        ("alpha", 0xFFFFFFFF81000100, 0x30, ".text", 2),
        ("beta", 0xFFFFFFFF81000140, 0x10, ".text", 2),  # kallsyms size 0x20 (padding up to gamma)
        ("gamma", 0xFFFFFFFF81000160, 0x40, ".text", 2),
        ("dup", 0xFFFFFFFF81000200, 0x10, ".text", 2),  # size 0x20
        ("dup", 0xFFFFFFFF81000220, 0x10, ".text", 2),  # size 0x40
        ("entry_label", 0xFFFFFFFF81000260, 0, ".text", 0),  # an asm label (NOTYPE)
        ("holey", 0xFFFFFFFF81000700, 0x100, ".text", 2),
        ("kernel_init", KERNEL_INIT, 0x130, ".text", 2),
        ("some_data", 0xFFFFFFFF82A00010, 0x8, ".data", 1),  # an object: not a code symbol
    ])
    ko_dir = tmp_path / "debug-modules" / "kernel" / "drivers" / "net"
    ko_dir.mkdir(parents=True)
    write_elf(ko_dir / "fake-nic.ko", [(".text", 0, 0x3000, AX), (".text.unlikely", 0, 0x200, AX),
                                       (".init.text", 0, 0x40, AX)], [
        ("fn_xmit", 0x2B80, 0x400, ".text", 2),
        ("fn_poll", 0x100, 0x400, ".text", 2),
        ("fn_poll.cold", 0x20, 0x30, ".text.unlikely", 2),
        ("fake_init", 0x0, 0x40, ".init.text", 2),
    ], etype=1)
    log = tmp_path / "a2l.log"
    a2l = tmp_path / "bin" / "addr2line"
    a2l.parent.mkdir()
    a2l.write_text(FAKE_ADDR2LINE.format(python=sys.executable, kernel_init=KERNEL_INIT, build=BUILD))
    a2l.chmod(0o755)
    monkeypatch.setenv("FAKE_A2L_LOG", str(log))
    return FakeKernel(vmlinux, tmp_path / "debug-modules", a2l, log)


LOG = """\
[  1.0] BUG: kernel NULL pointer dereference, address: 0000000000000010
[  1.1] Oops: 0000 [#1] PREEMPT SMP NOPTI
[  1.2] RIP: 0010:fn_xmit+0x4e/0x891 [fake_nic]
[  1.3] Call Trace:
[  1.4]  <IRQ>
[  1.5]  alpha+0x11/0x40
[  1.6]  ? beta+0x5/0x20
[  1.7]  fn_poll.cold+0xa/0x1e0 [fake_nic]
[  1.8]  dup+0x10/0x40
[  1.9]  no_such_function+0x1/0x10
[  2.0]  other+0x1/0x10 [not_here]
[  2.1]  </IRQ>
[  2.2]  <TASK>
[  2.3]  entry_label+0x3/0x20
[  2.4] RIP: 0010:gamma+0x8/0x40
[  2.5]  holey+0x78/0x100
[  2.6]  </TASK>
[  2.7] ---[ end trace 0000000000000000 ]---
[  3.0] WARNING: CPU: 0 PID: 1 at kernel/x.c:1 gamma+0x21/0x40
[  3.1] RIP: 0010:gamma+0x21/0x40
[  3.2] Call Trace:
[  3.3]  alpha+0x11/0x40
"""


def symbolizer(fake: FakeKernel, cache: Path | None) -> Symbolizer:
    return Symbolizer(fake.vmlinux, fake.modules, cache=cache, addr2line=str(fake.addr2line))


# -- ELF symbols and tables ----------------------------------------------------------

def test_read_elf_keeps_code_symbols_only(fake: FakeKernel) -> None:
    info = read_elf(fake.vmlinux)
    names = {s.name for s in info.symbols}
    assert "entry_label" in names and "some_data" not in names
    assert info.has_dwarf
    assert [s.name for s in info.sections][:3] == ["", ".text", ".data"]


def test_kallsyms_sizes_and_picking_among_same_named_symbols(fake: FakeKernel) -> None:
    table = SymbolTable.from_elf(read_elf(fake.vmlinux))
    assert table.lookup("beta") == (("beta", 0xFFFFFFFF81000140, 0x20, ".text"))
    assert [s.size for s in table.candidates("dup")] == [0x20, 0x40]
    assert table.lookup("dup", 0x40).address == 0xFFFFFFFF81000220  # type: ignore[union-attr]
    assert table.lookup("dup", 0x20).address == 0xFFFFFFFF81000200  # type: ignore[union-attr]
    assert table.lookup("kernel_init").size == 0xFFFFFFFF82000000 - KERNEL_INIT  # type: ignore[union-attr]
    assert table.lookup("missing") is None
    ko = SymbolTable.from_elf(read_elf(fake.modules / "kernel" / "drivers" / "net" / "fake-nic.ko"))
    assert ko.lookup("fn_xmit") == ("fn_xmit", 0x2B80, 0x3000 - 0x2B80, ".text")  # up to the end of .text
    assert ko.lookup("fn_poll.cold") == ("fn_poll.cold", 0x20, 0x200 - 0x20, ".text.unlikely")


def test_read_elf_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("not an ELF file at all")
    with pytest.raises(ImageError):
        read_elf(tmp_path / "x")
    with pytest.raises(ImageError):
        read_elf(tmp_path / "missing")


def test_system_map(tmp_path: Path) -> None:
    placeholder = tmp_path / "System.map"
    placeholder.write_text("ffffffffffffffff B The real System.map is in the linux-image-<version>-dbg package\n")
    assert not is_real_system_map(placeholder)
    real = tmp_path / "System.map-real"
    real.write_text("".join(f"{0xFFFFFFFF81000000 + 0x10 * i:016x} t fn{i}\n" for i in range(400)) + "ffffffff82a00000 D data\n")
    assert is_real_system_map(real)
    table = SymbolTable.from_system_map(real)
    assert table.lookup("fn1") == ("fn1", 0xFFFFFFFF81000010, 0x10, "")
    assert table.lookup("data") is None


# -- addr2line output and paths ------------------------------------------------------

def test_parse_addr2line_output() -> None:
    out = ("0xffffffff81000010\nfoo\na/b.c:12 (discriminator 3)\nbar\na/c.c:7\n"
           "0x0000000000000004\n??\n??:0\n0x0000000000000008\nbaz\nx.S:?\n")
    chains = parse_addr2line_output(out, 3)
    assert chains[0] == (SourceLocation("foo", "a/b.c", 12), SourceLocation("bar", "a/c.c", 7))
    assert chains[1] == (SourceLocation(None, None, None),)
    assert chains[2] == (SourceLocation("baz", "x.S", None),)
    with pytest.raises(ImageError):
        parse_addr2line_output(out, 4)


def test_parse_location() -> None:
    assert parse_location("f", "drivers/tty/sysrq.c:155") == SourceLocation("f", "drivers/tty/sysrq.c", 155)
    assert parse_location("f", "??:?") == SourceLocation("f", None, None)
    assert parse_location("f", "x.c:0") == SourceLocation("f", "x.c", None)


@pytest.mark.parametrize(("path", "base", "expected"), [
    (f"{BUILD}/drivers/tty/sysrq.c", f"{BUILD}/", "drivers/tty/sysrq.c"),
    (f"{BUILD}/./include/linux/skbuff.h", f"{BUILD}/", "include/linux/skbuff.h"),
    (f"{BUILD}/drivers/tty/sysrq.c", None, "drivers/tty/sysrq.c"),
    ("/build/reproducible-path/linux-6.1.192/arch/x86/entry/entry_64.S", f"{BUILD}/", "arch/x86/entry/entry_64.S"),
    ("/home/me/kernel/linux/net/core/dev.c", "/home/me/kernel/linux/", "net/core/dev.c"),
    ("net/core/dev.c", None, "net/core/dev.c"),
    ("/usr/include/stdio.h", None, "include/stdio.h"),
    ("odd/place/file.c", None, "odd/place/file.c"),
])
def test_normalize_path(path: str, base: str | None, expected: str) -> None:
    assert normalize_path(path, base) == expected


def test_result_cache_round_trip(tmp_path: Path, fake: FakeKernel) -> None:
    c = ResultCache(tmp_path, fake.vmlinux, None)
    c.update({0x10: (SourceLocation("f", "a.c", 1), SourceLocation("g", "b.c", None))})
    c.save()
    assert ResultCache(tmp_path, fake.vmlinux, None).entries == c.entries
    assert ResultCache(tmp_path, fake.vmlinux, ".text").entries == {}
    assert ResultCache(None, fake.vmlinux, None).path is None


# -- modules -------------------------------------------------------------------------

def test_module_index_matches_dashes_and_underscores_and_unpacks_xz(tmp_path: Path) -> None:
    root = tmp_path / "mods" / "kernel" / "net"
    root.mkdir(parents=True)
    (root / "nf-conntrack.ko").write_bytes(b"ko")
    (root / "veth.ko.xz").write_bytes(lzma.compress(b"veth ko"))
    idx = ModuleIndex(tmp_path / "mods", tmp_path / "cache")
    assert idx.find("nf_conntrack") == root / "nf-conntrack.ko"
    veth = idx.find("veth")
    assert veth is not None and veth.read_bytes() == b"veth ko" and veth.parent == tmp_path / "cache"
    assert idx.find("e1000") is None
    assert ModuleIndex(None).find("veth") is None
    assert ModuleIndex(tmp_path / "mods", None).find("veth") is None  # .xz needs somewhere to unpack


# -- decoding ------------------------------------------------------------------------

def test_one_addr2line_per_object_and_section_with_pc_minus_one(fake: FakeKernel, tmp_path: Path) -> None:
    decoded = symbolizer(fake, tmp_path / "cache").decode(parse_oopses(LOG))
    calls = fake.calls()
    by_target = {(" ".join(a for a in argv if a.startswith(".")) or "vmlinux"): addrs for argv, addrs in calls}
    assert len(calls) == 3, calls  # vmlinux, the .ko's .text, the .ko's .text.unlikely
    assert by_target[".text"] == [0x2B80 + 0x4E]  # RIP: exact
    assert by_target[".text.unlikely"] == [0x20 + 0xA - 1]  # return address: pc-1
    assert sorted(by_target["vmlinux"]) == sorted({
        0xFFFFFFFF81000100 + 0x11 - 1, 0xFFFFFFFF81000140 + 0x5 - 1, 0xFFFFFFFF81000220 + 0x10 - 1,
        0xFFFFFFFF81000260 + 0x3 - 1, 0xFFFFFFFF81000160 + 0x8, 0xFFFFFFFF81000700 + 0x78 - 1,
        0xFFFFFFFF81000160 + 0x21, KERNEL_INIT})  # every oops in one run; regs and RIP exact
    bug, warn = decoded
    assert bug.rip is not None and bug.rip.section == ".text" and bug.rip.address == 0x2BCE
    assert bug.rip.file == "drivers/net/text/f.c"  # build prefix learnt from kernel_init, then stripped
    alpha = bug.frames[0]
    assert alpha.address == 0xFFFFFFFF81000111 and alpha.lookup_address == 0xFFFFFFFF81000110
    assert (alpha.file, alpha.line, alpha.source_func) == ("kernel/f.c", 0x110, "fn_ffffffff81000110")
    cold = bug.frames[2]
    assert cold.section == ".text.unlikely" and cold.source_func == "inner_fn"
    assert cold.file == "include/linux/inner.h"  # "./include" normalised
    assert cold.inlined == (SourceLocation("outer_fn", "drivers/net/text.unlikely/outer.c", 0x2),)
    notes = {f.frame.func: f.note for f in bug.frames if f.note}
    assert notes == {"no_such_function": "no_such_function is not in vmlinux's symbol table",
                     "other": f"module not_here: no .ko with debug info under {fake.modules}"}
    assert [f.frame.kind for f in bug.frames if f.frame.func == "gamma"] == ["regs"]
    assert warn.rip is not None and warn.rip.lookup_address == 0xFFFFFFFF81000181


def test_second_decode_uses_the_cache_only(fake: FakeKernel, tmp_path: Path) -> None:
    first = symbolizer(fake, tmp_path / "cache")
    one = [d.to_json() for d in first.decode(parse_oopses(LOG))]
    assert len(first.runs) == 3
    second = symbolizer(fake, tmp_path / "cache")
    two = [d.to_json() for d in second.decode(parse_oopses(LOG))]
    assert second.runs == [] and len(fake.calls()) == 3
    assert one == two
    uncached = symbolizer(fake, None)
    uncached.decode(parse_oopses(LOG))
    assert len(uncached.runs) == 3


def test_unresolvable_address_and_json_shape(fake: FakeKernel, tmp_path: Path) -> None:
    [d] = symbolizer(fake, None).decode(parse_oopses("BUG: x\nRIP: 0010:holey+0x77/0x100\n"))
    assert d.rip is not None and d.rip.file is None and d.rip.locations == (SourceLocation(None, None, None),)
    j = d.to_json()
    assert set(j) >= {"title", "kind", "rip", "frames"}
    assert set(j["rip"]) >= {"func", "offset", "size", "module", "reliable", "address", "file", "line", "inlined"}
    assert j["rip"]["address"] == "0xffffffff81000777"


def test_ambiguous_symbols_are_noted(fake: FakeKernel, tmp_path: Path) -> None:
    text = LOG.replace("dup+0x10/0x40", "dup+0x10/0x99")  # neither size matches: the closest is used
    bug = symbolizer(fake, None).decode(parse_oopses(text))[0]
    assert [f.address for f in bug.frames if f.frame.func == "dup"] == [0xFFFFFFFF81000230]


def test_missing_vmlinux_debug_info_or_tool(fake: FakeKernel, tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="vmlinux not found"):
        Symbolizer(tmp_path / "nope", cache=None)
    stripped = write_elf(tmp_path / "vmlinux-nodebug", [(".text", 0xFFFFFFFF81000000, 0x1000, AX)],
                         [("alpha", 0xFFFFFFFF81000100, 0x30, ".text", 2)], dwarf=False)
    with pytest.raises(ImageError, match="no DWARF"):
        Symbolizer(stripped, cache=None).decode(parse_oopses("BUG: x\nRIP: 0010:alpha+0x1/0x30\n"))
    with pytest.raises(HostError, match="not installed"):
        Symbolizer(fake.vmlinux, cache=None, addr2line=str(tmp_path / "no-addr2line")).decode(
            parse_oopses("BUG: x\nRIP: 0010:alpha+0x1/0x40\n"))


def test_symbol_for_frame(fake: FakeKernel) -> None:
    s = symbolizer(fake, None)
    assert s.symbol_for(Frame("dup", 0x1, 0x40)).address == 0xFFFFFFFF81000220  # type: ignore[union-attr]
    assert s.symbol_for(Frame("fn_xmit", 0x1, 0x480, "fake_nic")).section == ".text"  # type: ignore[union-attr]
    assert s.symbol_for(Frame("x", 0x1, 0x10, "not_here")) is None


def test_module_trees_are_searched_in_order(tmp_path: Path) -> None:
    """``oops decode --modules DIR``: DIR first, then the image's debug modules
    (an in-tree driver such as 8139cp is only in the latter)."""
    mine, image = tmp_path / "mine", tmp_path / "image"
    (mine / "extra").mkdir(parents=True)
    (image / "kernel" / "drivers").mkdir(parents=True)
    (mine / "extra" / "buggy_nf.ko").write_bytes(b"mine")
    (image / "kernel" / "drivers" / "buggy_nf.ko").write_bytes(b"image's")
    (image / "kernel" / "drivers" / "8139cp.ko").write_bytes(b"in-tree")
    idx = ModuleIndex([mine, image])
    assert idx.find("buggy_nf") == mine / "extra" / "buggy_nf.ko"
    assert idx.find("8139cp") == image / "kernel" / "drivers" / "8139cp.ko"
    assert ModuleIndex(mine).find("8139cp") is None
