"""Module symbols for gdb: where each loaded module's sections sit in the guest.

A kernel module is relocatable: gdb only knows where its code and data are
once it is told every section's load address. The guest publishes them in
``/sys/module/<name>/sections/<section>`` (readable by root)::

    sections = module_sections(session)          # one SSH command
    cmds = add_symbol_file_commands(sections, image.debug_modules)
    # ['add-symbol-file /…/e1000.ko 0xffffffffc035e000 -s .data 0x… -s .bss 0x… …', …]

The ``.text`` address is given positionally, which every gdb since 8.x
accepts (gdb 13 also takes ``-s .text ADDR``). Modules without a ``.ko``
under the debug modules directory (those outside ``kernel/drivers/net`` and
``kernel/net``) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from labctl.debug.symbolize import ModuleIndex
from labctl.paths import cache_dir

SYSFS_GLOB = "/sys/module/*/sections"
# One command for all modules: every section file printed as PATH:VALUE.
SECTIONS_COMMAND = f"grep -r -H . {SYSFS_GLOB} 2>/dev/null; true"

# Sections the kernel lists in sysfs that are not the .ko's loadable
# sections (kallsyms' copies of the symbol tables) and must not be relocated.
_NOT_RELOCATED = frozenset({".symtab", ".strtab"})
# Init sections are freed once the module is loaded and their addresses are
# reused (by the next module's .text, typically): placing them would make gdb
# name the wrong function.
_FREED_PREFIX = ".init"


class _Runner(Protocol):
    def run(self, command: str, timeout: float = ...) -> object: ...


# The guest writes these names; only plain ones reach gdb's command line.
_MODULE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SECTION_NAME = re.compile(r"\.?[A-Za-z0-9_.$]{1,64}")


def parse_sections(text: str) -> dict[str, dict[str, int]]:
    """Parse ``grep -r -H . /sys/module/*/sections`` output.

    Lines look like ``/sys/module/e1000/sections/.text:0xffffffffc035e000``.
    Returns ``{module: {section: address}}``; malformed lines are skipped,
    and so are module or section names that are not plain (the text comes
    from the guest and the names go into gdb commands).
    """
    result: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        path, sep, value = line.rpartition(":")
        parts = path.split("/")
        if not sep or len(parts) != 6 or parts[1:3] != ["sys", "module"] or parts[4] != "sections":
            continue
        if not _MODULE_NAME.fullmatch(parts[3]) or not _SECTION_NAME.fullmatch(parts[5]):
            continue
        try:
            addr = int(value.strip(), 16)
        except ValueError:
            continue
        if not 0 <= addr < 1 << 64:
            continue
        result.setdefault(parts[3], {})[parts[5]] = addr
    return result


def module_sections(session: _Runner, timeout: float = 30.0) -> dict[str, dict[str, int]]:
    """Every loaded module's section addresses, read in one SSH command.

    :param session: a :class:`labctl.ssh.Session` (logged in as root).
    :raise GuestError: when the command cannot run.
    """
    res = session.run(SECTIONS_COMMAND, timeout=timeout)
    stdout = getattr(res, "stdout", b"")
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else str(stdout)
    return parse_sections(text)


def _quote(path: Path) -> str:
    """A file name as gdb's argument splitter reads it."""
    s = str(path)
    if not any(c in s for c in " \t'\"\\"):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def add_symbol_file_command(ko: Path, sections: Mapping[str, int]) -> str | None:
    """``add-symbol-file KO TEXT -s SECTION ADDR ...`` for one module, or
    None when the module has no ``.text`` address."""
    text = sections.get(".text")
    if text is None:
        return None
    words = ["add-symbol-file", _quote(ko), hex(text)]
    for name in sorted(sections):
        if name != ".text" and name not in _NOT_RELOCATED and not name.startswith(_FREED_PREFIX):
            words += ["-s", name, hex(sections[name])]
    return " ".join(words)


def add_symbol_file_commands(sections: Mapping[str, Mapping[str, int]], debug_modules_dir: Path | None,
                             only: Iterable[str] | None = None) -> list[str]:
    """gdb commands loading the debug ``.ko`` of every loaded module found under
    ``debug_modules_dir`` (``-`` and ``_`` in names are equivalent), sorted by
    module name. ``only`` restricts them to some modules."""
    index = ModuleIndex(debug_modules_dir, cache_dir() / "gdb" / "ko")  # .ko.xz are unpacked there
    wanted = {m.replace("-", "_") for m in only} if only is not None else None
    cmds: list[str] = []
    for module in sorted(sections):
        if wanted is not None and module.replace("-", "_") not in wanted:
            continue
        ko = index.find(module)
        if ko is None:
            continue
        cmd = add_symbol_file_command(ko, sections[module])
        if cmd:
            cmds.append(cmd)
    return cmds
