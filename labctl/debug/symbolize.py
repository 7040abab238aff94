"""Turn parsed oops frames into ``file:line`` with inline chains, in batches.

How a frame ``func+0xOFF/0xSIZE [module]`` becomes source lines:

1. **Symbol -> address.** vmlinux symbols come from its ELF symbol table
   (parsed here, cached per file under ``<cache>/oops/``), or from a real
   ``System.map`` when one is given. Debian's image ships a placeholder
   System.map, so the ELF table is the default. Several static functions
   may share a name: the one whose *kallsyms size* (the distance to the next
   symbol, which is what the kernel prints after ``/``; it includes padding,
   so it is often larger than the ELF ``st_size``) equals ``SIZE`` wins.
2. **Return addresses.** Call-trace frames hold return addresses, which point
   at the instruction *after* the call; it may belong to the next source
   line or, after a ``noreturn`` call, even to the next function. They are
   looked up at ``address - 1``. The ``RIP:`` frame and saved-register IPs
   inside a trace are exact and are looked up as they are.
3. **Modules.** A module frame is resolved in the module's ``.ko`` (found by
   name under the debug modules directory, ``-`` and ``_`` being equal): the
   symbol's value in the relocatable ``.ko`` is an offset into its section
   (``.text``, ``.text.unlikely`` for ``.cold`` parts, ...), and
   ``addr2line -j SECTION`` takes section-relative addresses.
4. **One process per object.** Every address for vmlinux goes to a single
   ``addr2line -a -f -i -e vmlinux`` through stdin, and one more runs per
   ``.ko`` section needed; they run in parallel. Results are cached per
   object file (keyed by path, size and mtime), so a repeated decode starts
   no process at all.
5. **Paths.** DWARF names files as the build saw them
   (``debian/build/build_amd64_none_amd64/drivers/tty/sysrq.c``, and
   absolute ``/build/.../linux-6.1.192/arch/x86/entry/entry_64.S`` for
   assembly); they are shown relative to the source tree.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import pickle
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict

from labctl import proc
from labctl.debug.elf import Symbol, SymbolTable, is_real_system_map, read_elf
from labctl.debug.oops import Frame, Oops
from labctl.errors import HostError, ImageError, ProcessError
from labctl.paths import atomic_write, cache_dir

CACHE_VERSION = 1
ADDR2LINE_TIMEOUT = 300.0

# -- caches --------------------------------------------------------------------------

def default_cache_dir() -> Path:
    """``<labctl cache>/oops``: symbol tables and addr2line answers per object file."""
    return cache_dir() / "oops"


def _file_key(path: Path, *extra: str) -> str:
    st = path.stat()
    ident = "|".join([str(path.resolve()), str(st.st_size), str(st.st_mtime_ns), *extra])
    return hashlib.sha1(ident.encode()).hexdigest()[:20]


def _write_atomic(path: Path, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


def load_vmlinux_symbols(vmlinux: Path, cache: Path | None) -> tuple[SymbolTable, bool]:
    """vmlinux's symbol table and whether it has DWARF, from the cache when possible."""
    cached = cache / f"{_file_key(vmlinux, sys.version)}.syms.pickle" if cache else None
    if cached and cached.exists():
        try:
            with open(cached, "rb") as f:
                version, has_dwarf, state = pickle.load(f)
            if version == CACHE_VERSION:
                return SymbolTable(*state), has_dwarf
        except (OSError, ValueError, TypeError, EOFError, pickle.UnpicklingError):
            pass
    info = read_elf(vmlinux)
    table = SymbolTable.from_elf(info)
    if cached:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cached, pickle.dumps((CACHE_VERSION, info.has_dwarf,
                                               (table.by_name, table.values, table.ends)),
                                              protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            pass  # a cache that cannot be written only costs time
    return table, info.has_dwarf


class ResultCache:
    """addr2line answers for one object file (and section), kept as JSON."""

    def __init__(self, directory: Path | None, obj: Path, section: str | None) -> None:
        self.path = self.path_for(directory, obj, section)
        self.entries: dict[int, tuple[SourceLocation, ...]] = {}
        self.dirty = False
        if self.path and self.path.exists():
            try:
                raw = json.loads(self.path.read_text())
                if raw.get("version") == CACHE_VERSION:
                    self.entries = {int(k, 16): tuple(SourceLocation(*loc) for loc in v)
                                    for k, v in raw["entries"].items()}
            except (OSError, ValueError, TypeError, KeyError):
                self.entries = {}

    @staticmethod
    def path_for(directory: Path | None, obj: Path, section: str | None) -> Path | None:
        """The cache file for ``obj`` (and ``section``), or ``None`` without a cache directory."""
        return directory / f"{_file_key(obj, section or '')}.a2l.json" if directory else None

    def update(self, results: dict[int, tuple[SourceLocation, ...]]) -> None:
        self.entries.update(results)
        self.dirty = self.dirty or bool(results)

    def save(self) -> None:
        if not self.path or not self.dirty:
            return
        data = {"version": CACHE_VERSION,
                "entries": {f"{a:#x}": [[l.func, l.file, l.line] for l in locs] for a, locs in self.entries.items()}}
        try:
            _write_atomic(self.path, json.dumps(data, separators=(",", ":")))
        except OSError:
            pass  # a cache that cannot be written only costs time


# -- addr2line -----------------------------------------------------------------------

@dataclass(frozen=True)
class SourceLocation:
    """One entry of addr2line's inline chain: the function and where in the source."""

    func: str | None
    file: str | None
    line: int | None


_LOCATION = re.compile(r"^(?P<file>.*?):(?P<line>\d+|\?)(?: \(discriminator \d+\))?$")


def parse_location(func: str, where: str) -> SourceLocation:
    """``func`` and ``file:line (discriminator N)`` as addr2line prints them; ``??`` is unknown."""
    m = _LOCATION.match(where.strip())
    file = m.group("file") if m else where.strip()
    line = int(m.group("line")) if m and m.group("line").isdigit() else None
    return SourceLocation(None if func == "??" else func,
                          None if file in ("??", "") else file,
                          line or None)


def parse_addr2line_output(text: str, count: int) -> list[tuple[SourceLocation, ...]]:
    """Split ``addr2line -a -f -i`` output into one inline chain per input address, in order."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("0x"):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    if len(blocks) != count:
        raise ImageError(f"addr2line answered {len(blocks)} addresses of {count}")
    return [tuple(parse_location(b[i], b[i + 1]) for i in range(0, len(b) - 1, 2)) for b in blocks]


class Addr2line:
    """One ``addr2line -a -f -i`` process for an object file, fed every address at once.

    It starts at once, so that it loads the object's tables while the caller
    is still working out which addresses to ask for.
    """

    def __init__(self, obj: Path, section: str | None = None, tool: str = "addr2line") -> None:
        argv = [tool, "-a", "-f", "-i", "-e", os.fspath(obj), *(["-j", section] if section else [])]
        self.obj, self.section = obj, section
        try:
            self.proc = proc.start_piped(argv)
        except HostError as exc:
            raise HostError(f"'{tool}' is not installed", hint="install binutils: apt-get install binutils") from exc

    def resolve(self, addresses: Sequence[int]) -> dict[int, tuple[SourceLocation, ...]]:
        """The inline chain of every address; the process ends afterwards."""
        stdin = "".join(f"{a:#x}\n" for a in addresses).encode()
        try:
            out, err = self.proc.communicate(stdin, timeout=ADDR2LINE_TIMEOUT)
        except proc.TimeoutExpired as exc:
            raise ProcessError(f"addr2line on {self.obj} timed out after {ADDR2LINE_TIMEOUT:.0f} s") from exc
        finally:
            self.close()
        if self.proc.returncode != 0:
            raise ProcessError(f"addr2line on {self.obj} exited with status {self.proc.returncode}",
                               output=err.decode(errors="replace")[-2000:])
        return dict(zip(addresses, parse_addr2line_output(out.decode(errors="replace"), len(addresses))))

    def close(self) -> None:
        """Stop the process if it still runs (unused, or on an error)."""
        if self.proc.poll() is None:
            proc.kill_group(self.proc, grace=0.5)


def run_addr2line(obj: Path, addresses: Sequence[int], section: str | None = None,
                  tool: str = "addr2line") -> dict[int, tuple[SourceLocation, ...]]:
    """Symbolize all ``addresses`` in ``obj`` with one addr2line process fed through stdin."""
    return Addr2line(obj, section, tool).resolve(addresses) if addresses else {}


# -- source paths --------------------------------------------------------------------

_TOPDIRS = frozenset({"arch", "block", "certs", "crypto", "drivers", "fs", "include", "init", "io_uring",
                      "ipc", "kernel", "lib", "mm", "net", "rust", "samples", "scripts", "security",
                      "sound", "virt",
                      "guest"})  # labctl's own out-of-tree modules: guest/modules/NAME/*.c


def normalize_path(path: str, base: str | None = None) -> str:
    """A DWARF file name relative to the kernel source tree.

    ``base`` is the build directory prefix when known (learnt from where
    ``kernel_init`` lives: ``<base>/init/main.c``); otherwise everything
    before the first top-level kernel directory is dropped.
    """
    if base and path.startswith(base):
        path = path[len(base):]
    else:
        parts = path.split("/")
        if parts[0] not in _TOPDIRS:
            for i, part in enumerate(parts[:-1]):
                if part in _TOPDIRS:
                    path = "/".join(parts[i:])
                    break
    return os.path.normpath(path)


# -- decoded frames ------------------------------------------------------------------

class InlinedJson(TypedDict):
    func: str | None
    file: str | None
    line: int | None


class DecodedFrameJson(TypedDict):
    """A :class:`DecodedFrame` as ``oops --json`` and ``oops-decoded.json`` give it."""

    func: str
    offset: int
    size: int
    module: str | None
    reliable: bool
    kind: str
    context: str | None
    stack: str | None
    address: str | None  # 0x...
    section: str | None
    file: str | None
    line: int | None
    source_func: str | None
    inlined: list[InlinedJson]
    note: str | None


class DecodedOopsJson(TypedDict):
    """A :class:`DecodedOops` as ``oops --json`` and ``oops-decoded.json`` give it."""

    title: str
    kind: str
    headline: str
    line: int
    panic: str | None
    cpu: int | None
    pid: int | None
    comm: str | None
    rip: DecodedFrameJson | None
    frames: list[DecodedFrameJson]


@dataclass
class DecodedFrame:
    """A parsed frame with its address and source locations (innermost first)."""

    frame: Frame
    address: int | None = None  # runtime address (vmlinux); offset into ``section`` of the .ko (modules)
    section: str | None = None  # module frames: the .ko section the address is relative to
    obj: Path | None = None  # the vmlinux or .ko the frame was looked up in
    locations: tuple[SourceLocation, ...] = ()
    note: str | None = None

    @property
    def lookup_address(self) -> int | None:
        """The address given to addr2line: one byte back for return addresses."""
        if self.address is None:
            return None
        return self.address - 1 if self.frame.is_return_address else self.address

    @property
    def file(self) -> str | None:
        return self.locations[0].file if self.locations else None

    @property
    def line(self) -> int | None:
        return self.locations[0].line if self.locations else None

    @property
    def source_func(self) -> str | None:
        """The function the innermost location belongs to (an inlined one, or ``frame.func``)."""
        return self.locations[0].func if self.locations else None

    @property
    def inlined(self) -> tuple[SourceLocation, ...]:
        """The callers the innermost location was inlined into, innermost first."""
        return self.locations[1:]

    def to_json(self) -> DecodedFrameJson:
        f = self.frame
        return {
            "func": f.func, "offset": f.offset, "size": f.size, "module": f.module, "reliable": f.reliable,
            "kind": f.kind, "context": f.context or None, "stack": f.stack or None,
            "address": f"{self.address:#x}" if self.address is not None else None, "section": self.section,
            "file": self.file, "line": self.line, "source_func": self.source_func,
            "inlined": [{"func": l.func, "file": l.file, "line": l.line} for l in self.inlined],
            "note": self.note,
        }


@dataclass
class DecodedOops:
    """An :class:`Oops` with every frame decoded."""

    oops: Oops
    rip: DecodedFrame | None
    frames: list[DecodedFrame] = field(default_factory=list)

    def to_json(self) -> DecodedOopsJson:
        o = self.oops
        return {
            "title": o.title, "kind": o.kind, "headline": o.headline, "line": o.line_no, "panic": o.panic,
            "cpu": o.cpu, "pid": o.pid, "comm": o.comm,
            "rip": self.rip.to_json() if self.rip else None,
            "frames": [f.to_json() for f in self.frames],
        }


# -- the decoder ---------------------------------------------------------------------

class ModuleIndex:
    """Finds a module's ``.ko`` (``.ko.xz`` too) by name under one or more
    directory trees, searched in order (the first tree that has it wins)."""

    def __init__(self, root: Path | Sequence[Path] | None, cache: Path | None = None) -> None:
        self.roots = [root] if isinstance(root, Path) else list(root or [])
        self.cache = cache
        self._index: dict[str, Path] | None = None

    @staticmethod
    def _key(name: str) -> str:
        return name.replace("-", "_")

    def find(self, module: str) -> Path | None:
        """The .ko file for ``module``, decompressed into the cache when it is ``.ko.xz``."""
        if self._index is None:
            self._index = {}
            for root in self.roots:
                if not root.is_dir():
                    continue
                for p in sorted(root.rglob("*.ko*")):
                    stem = p.name.split(".ko")[0]
                    if p.name.endswith((".ko", ".ko.xz")):
                        self._index.setdefault(self._key(stem), p)
        path = self._index.get(self._key(module))
        return self._decompressed(path) if path and path.name.endswith(".xz") else path

    def _decompressed(self, path: Path) -> Path | None:
        if self.cache is None:
            return None
        out = self.cache / f"{_file_key(path)}-{path.name[:-3]}"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(out, lzma.decompress(path.read_bytes()))
        return out


Key = tuple[Path, str | None]  # an object file and, for a .ko, the section addresses are relative to


class Symbolizer:
    """Decodes :class:`Oops` reports against one vmlinux and its modules' ``.ko`` files.

    :param vmlinux: the vmlinux with DWARF (Debian: the -dbg package's).
    :param modules_dir: a tree holding the modules' ``.ko`` files with debug info, or
        several, searched in order.
    :param system_map: a System.map to read symbols from instead of vmlinux's ELF table
        (ignored when it is Debian's placeholder).
    :param cache: where to keep symbol tables and addr2line answers (default:
        :func:`default_cache_dir`); ``None`` for no cache.
    :raise ImageError: when vmlinux is missing; later, on first use, when it has no
        symbols or no DWARF.
    """

    def __init__(self, vmlinux: Path, modules_dir: Path | Sequence[Path] | None = None, *,
                 system_map: Path | None = None,
                 cache: Path | None | Literal["default"] = "default", addr2line: str = "addr2line") -> None:
        if cache == "default":
            cache = default_cache_dir()
        if not vmlinux.is_file():
            raise ImageError(f"vmlinux not found: {vmlinux}",
                             hint="build the image (labctl image build) or pass --vmlinux PATH")
        self.vmlinux = vmlinux
        self.system_map = system_map
        self.cache = cache
        self.addr2line = addr2line
        self.modules = ModuleIndex(modules_dir, cache)
        self._table: SymbolTable | None = None
        self._module_tables: dict[Path, SymbolTable] = {}
        self.runs: list[tuple[Path, str | None, int]] = []  # (object, section, addresses) per addr2line run

    @property
    def table(self) -> SymbolTable:
        """vmlinux's symbol table (loaded on first use).

        :raise ImageError: when vmlinux has no symbol table or no DWARF.
        """
        if self._table is None:
            self._table = self._load_vmlinux_table()
        return self._table

    def _load_vmlinux_table(self) -> SymbolTable:
        if self.system_map is not None and is_real_system_map(self.system_map):
            table = SymbolTable.from_system_map(self.system_map)
            has_dwarf = read_elf(self.vmlinux, symbols=False).has_dwarf
        else:
            table, has_dwarf = load_vmlinux_symbols(self.vmlinux, self.cache)
        if not table.by_name:
            raise ImageError(f"{self.vmlinux} has no symbol table")
        if not has_dwarf:
            raise ImageError(f"{self.vmlinux} has no DWARF debug info",
                             hint="use the vmlinux from the kernel's -dbg package (the image's vmlinux.debug)")
        return table

    def decode(self, oopses: Sequence[Oops]) -> list[DecodedOops]:
        """Every report with its frames located; all addresses are symbolized in one batch."""
        early = self._start_vmlinux_addr2line(oopses)
        try:
            decoded = [DecodedOops(o, self._locate(o.rip) if o.rip else None, [self._locate(f) for f in o.frames])
                       for o in oopses]
            frames = [f for d in decoded for f in ([d.rip] if d.rip else []) + d.frames]
            base = self._symbolize(frames, early)
        finally:
            if early is not None:
                early.close()
        for f in frames:
            f.locations = tuple(SourceLocation(l.func, normalize_path(l.file, base) if l.file else None, l.line)
                                for l in f.locations)
            if f.address is not None and not f.locations and f.note is None:
                f.note = "no line information for this address"
        return decoded

    def _start_vmlinux_addr2line(self, oopses: Sequence[Oops]) -> Addr2line | None:
        """addr2line for vmlinux, started before the symbol table is read when it will surely be needed.

        It is needed when a frame is in vmlinux and no answers are cached
        for this vmlinux yet (the first decode, or no cache at all).
        """
        in_vmlinux = any(f.module is None for o in oopses for f in ([o.rip] if o.rip else []) + o.frames)
        cached = ResultCache.path_for(self.cache, self.vmlinux, None)
        if not in_vmlinux or (cached is not None and cached.exists()):
            return None
        return Addr2line(self.vmlinux, None, self.addr2line)

    def _locate(self, frame: Frame) -> DecodedFrame:
        """The frame's address, from vmlinux's or its module's symbol table."""
        if frame.module is None:
            return self._place(DecodedFrame(frame, obj=self.vmlinux), self.table, "vmlinux", section=None)
        ko = self.modules.find(frame.module)
        if ko is None:
            where = ", ".join(map(str, self.modules.roots)) or "(no debug modules directory)"
            return DecodedFrame(frame, note=f"module {frame.module}: no .ko with debug info under {where}")
        return self._place(DecodedFrame(frame, obj=ko), self._module_table(ko), ko.name, section="")

    @staticmethod
    def _place(d: DecodedFrame, table: SymbolTable, what: str, section: str | None) -> DecodedFrame:
        sym = table.lookup(d.frame.func, d.frame.size)
        if sym is None:
            d.obj, d.note = None, f"{d.frame.func} is not in {what}'s symbol table"
            return d
        d.address = sym.address + d.frame.offset
        if section is not None:
            d.section = sym.section
        twins = [c for c in table.candidates(d.frame.func) if c.size == sym.size]
        if len(twins) > 1:
            d.note = f"ambiguous: {len(twins)} symbols {d.frame.func} of size {sym.size:#x}; using the first"
        return d

    def _module_table(self, ko: Path) -> SymbolTable:
        if ko not in self._module_tables:
            self._module_tables[ko] = SymbolTable.from_elf(read_elf(ko))
        return self._module_tables[ko]

    def symbols(self, module: str | None = None) -> SymbolTable | None:
        """vmlinux's symbol table, or ``module``'s (``None`` when its .ko is not available)."""
        if module is None:
            return self.table
        ko = self.modules.find(module)
        return self._module_table(ko) if ko else None

    def symbol_for(self, frame: Frame) -> Symbol | None:
        """The symbol a frame is resolved against (picked by name and size)."""
        table = self.symbols(frame.module)
        return table.lookup(frame.func, frame.size) if table else None

    def _symbolize(self, frames: list[DecodedFrame], early: Addr2line | None = None) -> str | None:
        """Fill ``locations`` for every placed frame; returns the build directory prefix if known."""
        groups: dict[Key, set[int]] = defaultdict(set)
        for f in frames:
            if f.obj is not None and f.lookup_address is not None:
                groups[(f.obj, f.section)].add(f.lookup_address)
        kernel_init = self.table.lookup("kernel_init")
        if kernel_init is not None:
            groups[(self.vmlinux, None)].add(kernel_init.address)
        results = self._run_groups(groups, {(self.vmlinux, None): early} if early else {})
        for f in frames:
            if f.obj is not None and f.lookup_address is not None:
                f.locations = results[(f.obj, f.section)].get(f.lookup_address, ())
        if kernel_init is not None:
            chain = results[(self.vmlinux, None)].get(kernel_init.address, ())
            file = chain[-1].file if chain else None
            if file and file.endswith("init/main.c"):
                return file[: -len("init/main.c")]
        return None

    def _run_groups(self, groups: dict[Key, set[int]], started: dict[Key, Addr2line]
                    ) -> dict[Key, dict[int, tuple[SourceLocation, ...]]]:
        """One addr2line per (object, section) for the addresses not cached yet, in parallel."""
        caches = {key: ResultCache(self.cache, *key) for key in groups}
        todo = {key: sorted(a for a in addrs if a not in caches[key].entries) for key, addrs in groups.items()}
        todo = {k: v for k, v in todo.items() if v}
        if todo:
            procs = {k: started.get(k) or Addr2line(k[0], k[1] or None, self.addr2line) for k in todo}
            try:
                with ThreadPoolExecutor(max_workers=len(procs)) as pool:
                    futures = {k: pool.submit(p.resolve, todo[k]) for k, p in procs.items()}
                    for key, fut in futures.items():
                        caches[key].update(fut.result())
                        self.runs.append((key[0], key[1], len(todo[key])))
            finally:
                for p in procs.values():
                    p.close()
        for c in caches.values():
            c.save()
        return {key: c.entries for key, c in caches.items()}
