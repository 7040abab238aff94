"""ELF symbol tables of vmlinux and modules, read with the standard library (``mmap`` + ``struct``),
and System.map as an alternative source of kernel symbols."""

from __future__ import annotations

import bisect
import mmap
import struct
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from labctl.errors import ImageError

_SHF_EXECINSTR = 0x4
_STT_NOTYPE, _STT_FUNC = 0, 2
_SHN_LORESERVE = 0xFF00


@dataclass(frozen=True)
class Section:
    """An ELF section header: name, address, size, flags."""

    name: str
    addr: int
    size: int
    flags: int


class ElfSymbol(NamedTuple):
    """A code symbol from an ELF symbol table."""

    name: str
    value: int  # address in vmlinux; offset into ``section`` in a relocatable .ko
    size: int  # ELF st_size (without padding)
    section: str


@dataclass(frozen=True)
class ElfInfo:
    """What the decoder needs from an ELF file: code symbols and section headers."""

    symbols: list[ElfSymbol]
    sections: list[Section]

    @property
    def has_dwarf(self) -> bool:
        return any(s.name in (".debug_info", ".zdebug_info") for s in self.sections)


def _read_sections(m: mmap.mmap) -> list[tuple[Section, tuple[int, ...]]]:
    """Section headers of an ELF64 little-endian file, with their raw fields."""
    shoff, = struct.unpack_from("<Q", m, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", m, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)]
    names_off = raw[shstrndx][4]

    def name(off: int) -> str:
        return m[names_off + off:m.find(b"\0", names_off + off)].decode(errors="replace")

    return [(Section(name(r[0]), r[3], r[5], r[2]), r) for r in raw]


def read_elf(path: Path, symbols: bool = True) -> ElfInfo:
    """Code symbols (functions and asm labels in executable sections) and sections of ``path``.

    With ``symbols=False`` only the section headers are read (cheap).

    :raise ImageError: when the file is missing or not a 64-bit little-endian ELF.
    """
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
                raise ImageError(f"{path} is not a 64-bit little-endian ELF file")
            sections = _read_sections(m)
            return ElfInfo(_code_symbols(m, sections) if symbols else [], [s for s, _ in sections])
    except (OSError, ValueError, struct.error) as exc:
        raise ImageError(f"cannot read symbols from {path}: {exc}") from exc


def _code_symbols(m: mmap.mmap, sections: list[tuple[Section, tuple[int, ...]]]) -> list[ElfSymbol]:
    symtabs = [raw for _, raw in sections if raw[1] == 2]  # SHT_SYMTAB
    if not symtabs:
        return []
    symtab = symtabs[0]
    strtab = sections[symtab[6]][1]
    strings = m[strtab[4]:strtab[4] + strtab[5]]
    code = {i: s.name for i, (s, _) in enumerate(sections) if s.flags & _SHF_EXECINSTR and 0 < i < _SHN_LORESERVE}
    out: list[ElfSymbol] = []
    for name, info, _other, shndx, value, size in struct.iter_unpack("<IBBHQQ", m[symtab[4]:symtab[4] + symtab[5]]):
        if shndx in code and name and info & 0xF in (_STT_NOTYPE, _STT_FUNC):
            out.append(ElfSymbol(strings[name:strings.index(b"\0", name)].decode(errors="replace"),
                                 value, size, code[shndx]))
    return out


class Symbol(NamedTuple):
    """A code symbol with its kallsyms-style size (distance to the next symbol)."""

    name: str
    address: int
    size: int
    section: str


class SymbolTable:
    """Code symbols by name; picks among same-named symbols by size.

    Sizes are computed on demand, like kallsyms does: the distance to the
    next higher symbol address in the same section (or to the section's end),
    but at least the ELF size.
    """

    def __init__(self, by_name: dict[str, list[tuple[int, int, str]]], values: dict[str, list[int]],
                 ends: dict[str, int]) -> None:
        self.by_name = by_name  # name -> [(address, ELF size, section)]
        self.values = values  # section -> sorted distinct symbol addresses
        self.ends = ends  # section -> end address

    @classmethod
    def from_entries(cls, entries: Iterable[tuple[str, int, int, str]], ends: dict[str, int]) -> SymbolTable:
        """From ``(name, address, ELF size, section)`` tuples and section end addresses."""
        by_name: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        values: dict[str, set[int]] = defaultdict(set)
        for name, value, size, section in entries:
            by_name[name].append((value, size, section))
            values[section].add(value)
        return cls(dict(by_name), {k: sorted(v) for k, v in values.items()},
                   {k: ends.get(k, max(v)) for k, v in values.items()})

    @classmethod
    def from_elf(cls, info: ElfInfo) -> SymbolTable:
        """The code symbols of an ELF file (vmlinux or a .ko)."""
        return cls.from_entries(info.symbols, {s.name: s.addr + s.size for s in info.sections})

    @classmethod
    def from_system_map(cls, path: Path) -> SymbolTable:
        """Text symbols (``t``/``T``/``w``/``W``) of a System.map."""
        entries: list[tuple[str, int, int, str]] = []
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] in ("t", "T", "w", "W"):
                entries.append((parts[2], int(parts[0], 16), 0, ""))
        return cls.from_entries(entries, {})

    def _size(self, address: int, elf_size: int, section: str) -> int:
        values = self.values[section]
        i = bisect.bisect_right(values, address)
        following = values[i] if i < len(values) else self.ends[section]
        return max(following - address, elf_size)

    def candidates(self, name: str) -> list[Symbol]:
        """Every symbol called ``name``, with its kallsyms size."""
        return [Symbol(name, a, self._size(a, size, sec), sec) for a, size, sec in self.by_name.get(name, ())]

    def lookup(self, name: str, size: int | None = None) -> Symbol | None:
        """The symbol ``name``; with several, the one whose size is ``size`` (else the closest)."""
        cands = self.candidates(name)
        if len(cands) <= 1 or size is None:
            return cands[0] if cands else None
        return min(cands, key=lambda s: (abs(s.size - size), s.address))


def is_real_system_map(path: Path) -> bool:
    """Debian's linux-image packages ship a one-line placeholder instead of System.map."""
    try:
        return path.stat().st_size > 4096
    except OSError:
        return False


