"""Module section addresses from sysfs, and the add-symbol-file commands built from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labctl.debug.modsyms import (
    SECTIONS_COMMAND,
    add_symbol_file_command,
    add_symbol_file_commands,
    module_sections,
    parse_sections,
)

# ``grep -r -H . /sys/module/*/sections`` in a guest (trimmed), including a
# module whose name has an underscore where its file has a dash.
GREP_OUTPUT = """\
/sys/module/e1000/sections/.text:0xffffffffc035e000
/sys/module/e1000/sections/.text.unlikely:0xffffffffc037047c
/sys/module/e1000/sections/.data:0xffffffffc037d0c0
/sys/module/e1000/sections/.bss:0xffffffffc037f840
/sys/module/e1000/sections/.rodata:0xffffffffc0372060
/sys/module/e1000/sections/.init.text:0xffffffffc0387000
/sys/module/e1000/sections/.symtab:0xffffffffc03a9000
/sys/module/e1000/sections/.strtab:0xffffffffc03ab000
/sys/module/e1000/sections/__param:0xffffffffc03773b0
/sys/module/failover/sections/.text:0xffffffffc0387000
/sys/module/failover/sections/.data:0xffffffffc0389030
/sys/module/crc32c_generic/sections/.text:0xffffffffc0010000
/sys/module/nf_conntrack_ftp/sections/.text:0xffffffffc0400000
/sys/module/odd/sections/.text:not-a-number
garbage line
/sys/module/x/holders/y:0x1
"""


@dataclass
class FakeResult:
    stdout: bytes
    status: int = 0


class FakeSession:
    def __init__(self, output: str) -> None:
        self.output = output
        self.commands: list[str] = []

    def run(self, command: str, timeout: float = 60.0) -> FakeResult:
        self.commands.append(command)
        return FakeResult(self.output.encode())


def test_parse_sections() -> None:
    sections = parse_sections(GREP_OUTPUT)
    assert set(sections) == {"e1000", "failover", "crc32c_generic", "nf_conntrack_ftp"}
    assert sections["e1000"][".text"] == 0xFFFFFFFFC035E000
    assert sections["e1000"]["__param"] == 0xFFFFFFFFC03773B0
    assert sections["failover"] == {".text": 0xFFFFFFFFC0387000, ".data": 0xFFFFFFFFC0389030}


def test_one_ssh_command_reads_every_module() -> None:
    session = FakeSession(GREP_OUTPUT)
    sections = module_sections(session)
    assert session.commands == [SECTIONS_COMMAND]
    assert "/sys/module/*/sections" in SECTIONS_COMMAND
    assert sections["e1000"][".data"] == 0xFFFFFFFFC037D0C0
    assert module_sections(FakeSession("")) == {}


def _debug_modules(root: Path) -> Path:
    for rel in ("kernel/drivers/net/ethernet/intel/e1000/e1000.ko", "kernel/net/core/failover.ko",
                "kernel/net/netfilter/nf-conntrack-ftp.ko", "kernel/drivers/net/unused.ko"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\x7fELF")
    return root


def test_commands_for_loaded_modules_with_debug_files(tmp_path: Path) -> None:
    root = _debug_modules(tmp_path / "debug-modules")
    cmds = add_symbol_file_commands(parse_sections(GREP_OUTPUT), root)
    # crc32c_generic has no .ko here; unused.ko is not loaded; '-' and '_' match.
    assert [c.split()[1].rsplit("/", 1)[1] for c in cmds] == ["e1000.ko", "failover.ko", "nf-conntrack-ftp.ko"]
    e1000 = cmds[0].split()
    assert e1000[:3] == ["add-symbol-file", str(root / "kernel/drivers/net/ethernet/intel/e1000/e1000.ko"),
                         "0xffffffffc035e000"]
    pairs = dict(zip(e1000[4::3], e1000[5::3], strict=True))
    assert all(w == "-s" for w in e1000[3::3])
    assert pairs == {".bss": "0xffffffffc037f840", ".data": "0xffffffffc037d0c0", ".rodata": "0xffffffffc0372060",
                     ".text.unlikely": "0xffffffffc037047c", "__param": "0xffffffffc03773b0"}


def test_freed_init_sections_and_kallsyms_tables_are_not_placed() -> None:
    # e1000's .init.text was freed and its address now holds failover's .text:
    # placing it would make gdb name e1000 init code for failover's functions.
    cmd = add_symbol_file_command(Path("/m/e1000.ko"), parse_sections(GREP_OUTPUT)["e1000"])
    assert cmd is not None
    assert ".init.text" not in cmd and ".symtab" not in cmd and ".strtab" not in cmd


def test_no_text_no_command(tmp_path: Path) -> None:
    assert add_symbol_file_command(Path("/m/x.ko"), {".data": 1}) is None


def test_only_some_modules(tmp_path: Path) -> None:
    root = _debug_modules(tmp_path / "debug-modules")
    cmds = add_symbol_file_commands(parse_sections(GREP_OUTPUT), root, only=["nf_conntrack-ftp"])
    assert len(cmds) == 1 and "nf-conntrack-ftp.ko" in cmds[0]


def test_missing_debug_modules_dir_gives_no_commands(tmp_path: Path) -> None:
    assert add_symbol_file_commands(parse_sections(GREP_OUTPUT), tmp_path / "nope") == []
    assert add_symbol_file_commands(parse_sections(GREP_OUTPUT), None) == []


def test_paths_with_spaces_are_quoted_for_gdb(tmp_path: Path) -> None:
    root = _debug_modules(tmp_path / "debug modules")
    cmd = add_symbol_file_commands(parse_sections(GREP_OUTPUT), root, only=["failover"])[0]
    assert cmd.startswith(f'add-symbol-file "{root}/kernel/net/core/failover.ko" 0xffffffffc0387000')
