"""Decoding real oopses against the image's real vmlinux.debug and module .ko files.

The oracle is the kernel's own ``scripts/decode_stacktrace.sh`` from the
matching ``linux-source`` package (downloaded once with ``apt-get download``
and cached under ``<labctl cache>/decode_stacktrace/<version>/``), run on the
same frames, vmlinux and modules: every frame must get the same file:line
chain. Two things differ on purpose and are handled here:

* decode_stacktrace.sh looks return addresses up as they are, labctl at
  pc-1 (the call instruction), so the script is given ``offset - 1`` for
  call-trace frames;
* decode_stacktrace.sh takes the *first* ``nm`` symbol of a name, labctl the
  one whose size matches; frames with same-named symbols are compared apart.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from labctl.debug import Symbolizer, parse_oopses
from labctl.debug.symbolize import DecodedFrame, DecodedOops
from labctl.image import apt
from labctl.kernel.cached import Kernel
from labctl.paths import cache_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oops"
REAL = ["sysrq-crash.console.log", "cp-start-xmit.console.log", "virtio-net-irq.console.log"]
ALL = [*REAL, "handmade-mixed.console.log", "synthetic-50.console.log"]


@pytest.fixture(scope="module")
def dbg(kernel: Kernel) -> Kernel:
    """The image's default kernel with its debug files (no QEMU needed)."""
    if not kernel.vmlinux_debug.is_file():
        pytest.fail("the default kernel has no vmlinux.debug: run 'labctl image build'")
    if shutil.which("addr2line") is None:
        pytest.fail("addr2line is missing: apt-get install binutils")
    return kernel


@pytest.fixture(scope="module")
def symbolizer(dbg: Kernel, tmp_path_factory: pytest.TempPathFactory) -> Symbolizer:
    return Symbolizer(dbg.vmlinux_debug, dbg.debug_modules, cache=tmp_path_factory.mktemp("oops-cache"))


def decode(sym: Symbolizer, name: str) -> list[DecodedOops]:
    return sym.decode(parse_oopses((FIXTURES / name).read_text()))


def all_frames(d: DecodedOops) -> list[DecodedFrame]:
    return ([d.rip] if d.rip else []) + d.frames


# -- the real crashes ----------------------------------------------------------------

def test_sysrq_crash_resolves_into_sysrq_c(symbolizer: Symbolizer) -> None:
    [d] = decode(symbolizer, "sysrq-crash.console.log")
    by_func = {f.frame.func: f for f in d.frames}
    crash = by_func["sysrq_handle_crash"]
    assert crash.file == "drivers/tty/sysrq.c" and crash.line is not None and 140 <= crash.line <= 170
    assert crash.source_func == "sysrq_handle_crash"
    # panic+0x118 returns from dump_stack(): pc-1 is the call's line, the return address is 18 lines on.
    assert (by_func["panic"].file, by_func["panic"].line) == ("kernel/panic.c", 339)
    assert by_func["__handle_sysrq.cold"].file == "drivers/tty/sysrq.c"
    assert by_func["proc_reg_write"].inlined[0].func == "proc_reg_write"  # pde_write inlined into it
    assert by_func["entry_SYSCALL_64_after_hwframe"].file == "arch/x86/entry/entry_64.S"
    assert all(f.file for f in d.frames), [f.frame.symbol for f in d.frames if not f.file]


def test_warning_rips_land_on_the_warn_line_the_kernel_printed(symbolizer: Symbolizer) -> None:
    checked = 0
    for name in ("cp-start-xmit.console.log", "virtio-net-irq.console.log", "handmade-mixed.console.log"):
        for d in decode(symbolizer, name):
            m = re.search(r" at (\S+):(\d+)", d.oops.headline)
            if d.oops.kind in ("warning", "bug") and m and d.rip:
                assert (d.rip.file, d.rip.line) == (m.group(1), int(m.group(2))), d.oops.title
                checked += 1
    assert checked == 4  # 8139cp and virtio_net WARNs (real), 8139cp BUG and e1000 WARN (ud2 sites)


def test_module_frames_resolve_in_their_ko(symbolizer: Symbolizer) -> None:
    warn, gpf = decode(symbolizer, "virtio-net-irq.console.log")
    receive = warn.frames[0]
    assert receive.frame.module == "virtio_net" and receive.section == ".text"
    assert receive.file == "drivers/net/virtio_net.c" and receive.source_func == "receive_mergeable"
    ring = next(f for f in warn.frames if f.frame.module == "virtio_ring")
    assert ring.file is None and ring.note and "virtio_ring" in ring.note
    assert gpf.rip is not None and gpf.rip.source_func == "skb_get_queue_mapping"
    assert gpf.rip.inlined[-1].func == "start_xmit" and gpf.rip.inlined[-1].file == "drivers/net/virtio_net.c"
    kbug = decode(symbolizer, "handmade-mixed.console.log")[0]
    assert kbug.rip is not None and kbug.rip.source_func == "cp_tx"  # inlined into cp_interrupt
    assert kbug.rip.inlined[0].func == "cp_interrupt"


@pytest.mark.parametrize("name", ALL)
def test_every_frame_size_matches_its_symbol(symbolizer: Symbolizer, name: str) -> None:
    """The sizes computed from ELF symbols equal what kallsyms printed after the '/'."""
    for d in decode(symbolizer, name):
        for f in all_frames(d):
            sym = symbolizer.symbol_for(f.frame)
            if sym is not None:
                assert sym.size == f.frame.size, f.frame.symbol


def test_one_batched_addr2line_per_object(dbg: Kernel, tmp_path: Path) -> None:
    sym = Symbolizer(dbg.vmlinux_debug, dbg.debug_modules, cache=tmp_path)
    text = "\n".join((FIXTURES / n).read_text() for n in REAL)
    first = [d.to_json() for d in sym.decode(parse_oopses(text))]
    objects = [(obj.name, section) for obj, section, _ in sym.runs]
    assert sorted(objects) == sorted({("vmlinux.debug", None), ("8139cp.ko", ".text"), ("virtio_net.ko", ".text")})
    again = Symbolizer(dbg.vmlinux_debug, dbg.debug_modules, cache=tmp_path)
    assert [d.to_json() for d in again.decode(parse_oopses(text))] == first
    assert again.runs == []


def test_fifty_frames_decode_in_one_batch_per_object(dbg: Kernel, tmp_path: Path) -> None:
    """Fifty frames, every one to a source line, with one addr2line run for vmlinux
    (how fast that is: benchmarks/oops_decode.py; tests never time anything)."""
    sym = Symbolizer(dbg.vmlinux_debug, dbg.debug_modules, cache=tmp_path)
    [d] = decode(sym, "synthetic-50.console.log")
    assert len(d.frames) == 50 and all(f.file for f in all_frames(d))
    objects = [(obj.name, section) for obj, section, _ in sym.runs]
    assert ("vmlinux.debug", None) in objects and len(objects) == len(set(objects)), objects  # one run each


# -- against scripts/decode_stacktrace.sh ---------------------------------------------

def _source_package(dbg: Kernel) -> tuple[str, str]:
    """(``linux-source-6.1``, Debian version) matching the image's kernel."""
    release = dbg.release  # 6.1.0-56-amd64
    major_minor = ".".join(release.split(".")[:2])
    return f"linux-source-{major_minor}", str(dbg.manifest["debian"]["version"])


@pytest.fixture(scope="module")
def decode_stacktrace(dbg: Kernel) -> Path:
    """scripts/decode_stacktrace.sh from the matching linux-source package, cached."""
    package, version = _source_package(dbg)
    target = cache_dir() / "decode_stacktrace" / version / "decode_stacktrace.sh"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="linux-source-") as tmp:
        dl = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=tmp, capture_output=True, text=True,
                            timeout=600, check=False)
        debs = list(Path(tmp).glob("*.deb"))
        if dl.returncode != 0 and version not in apt.versions(package):
            pytest.skip(f"the archive no longer carries {package} {version}, the image kernel's source")
        if dl.returncode != 0 or not debs:
            pytest.fail(f"apt-get download {package}={version} failed: {dl.stderr.strip()[-500:]}")
        member = f"{package}/scripts/decode_stacktrace.sh"
        # tar stops after the first match (--occurrence); the writers upstream then get SIGPIPE.
        pipeline = (f"dpkg-deb --fsys-tarfile {debs[0].name} | tar -xO ./usr/src/{package}.tar.xz"
                    f" | xz -dc -T0 | tar -x --occurrence=1 -C . {member}")
        subprocess.run(["bash", "-c", pipeline], cwd=tmp, capture_output=True, timeout=900, check=False)
        script = Path(tmp) / member
        if not script.is_file():
            pytest.fail(f"{member} not found in {debs[0].name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(script, target)
    return target


def _nm_shim(dbg: Kernel, bindir: Path) -> None:
    """An ``nm`` that answers ``nm vmlinux`` from a file: the script runs it once per symbol name."""
    listing = bindir / "vmlinux.nm"
    with open(listing, "wb") as f:
        subprocess.run(["nm", str(dbg.vmlinux_debug)], stdout=f, check=True, timeout=300)
    shim = bindir / "nm"
    real_nm = shutil.which("nm")
    shim.write_text(f'#!/bin/sh\nif [ "$#" = 1 ] && [ "$1" = "{dbg.vmlinux_debug}" ]; then exec cat "{listing}"; '
                    f'fi\nexec "{real_nm}" "$@"\n')
    shim.chmod(0o755)


def _script_input(frames: list[DecodedFrame]) -> str:
    """One line per frame, ``F<i> func+0xOFF/0xSIZE [module]``, return addresses moved back one byte."""
    lines = []
    for i, f in enumerate(frames):
        off = f.frame.offset - 1 if f.frame.is_return_address else f.frame.offset
        mod = f" [{f.frame.module}]" if f.frame.module else ""
        lines.append(f"F{i} {f.frame.func}+{off:#x}/{f.frame.size:#x}{mod}")
    return "\n".join(lines) + "\n"


_OUT = re.compile(r"^F(?P<i>\d+) (?P<func>\S+) \((?P<code>.*)\)\s*(?P<mod>\S*)$")


def _parse_script_output(text: str) -> dict[int, list[str]]:
    """``F3 func (a.c:1 (discriminator 2) b.h:7) mod`` -> {3: ["a.c:1", "b.h:7"]}."""
    out = {}
    for line in text.splitlines():
        m = _OUT.match(line)
        if m:
            code = re.sub(r" \(discriminator \d+\)", "", m.group("code"))
            out[int(m.group("i"))] = code.split()
    return out


def _same_place(ours: str, theirs: str) -> bool:
    """Equal, or ``theirs`` is an absolute path ending in ours (assembly files keep their build path)."""
    (of, _, ol), (tf, _, tl) = ours.rpartition(":"), theirs.rpartition(":")
    return ol == tl and (of == os.path.normpath(tf) or tf.endswith("/" + of))


def test_same_lines_as_decode_stacktrace(dbg: Kernel, symbolizer: Symbolizer, decode_stacktrace: Path,
                                         tmp_path: Path) -> None:
    seen: dict[tuple[str, int, int, str | None, bool], DecodedFrame] = {}
    for name in [*REAL, "handmade-mixed.console.log"]:  # ~120 distinct frames; the script takes ~0.5 s for each
        for d in decode(symbolizer, name):
            for f in all_frames(d):
                key = (f.frame.func, f.frame.offset, f.frame.size, f.frame.module, f.frame.is_return_address)
                resolved = f.locations and all(loc.file and loc.line for loc in f.locations)
                if resolved and f.section in (None, ".text"):  # the script ignores sections: .text only
                    seen.setdefault(key, f)
    unique = [f for f in seen.values() if len(symbolizer.symbols(f.frame.module).candidates(f.frame.func)) == 1]
    twins = [f for f in seen.values() if f not in unique]
    assert len(unique) > 100 and len(twins) <= 3, (len(unique), [f.frame.symbol for f in twins])
    _nm_shim(dbg, tmp_path)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    halves = [unique[::2], unique[1::2]]  # two scripts in parallel: it runs addr2line once per frame
    procs = [subprocess.Popen(["bash", str(decode_stacktrace), str(dbg.vmlinux_debug), "auto",
                               str(dbg.debug_modules)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in halves]
    outputs = [p.communicate(_script_input(h), timeout=600)[0] for p, h in zip(procs, halves)]
    weak = _weak_symbols(tmp_path / "vmlinux.nm")
    mismatches, undecoded = [], []
    for half, out in zip(halves, outputs):
        theirs = _parse_script_output(out)
        for i, f in enumerate(half):
            ours = [f"{loc.file}:{loc.line}" for loc in f.locations]
            t = theirs.get(i)
            if t is None and f.frame.module is None and f.frame.func in weak:
                undecoded.append(f.frame.func)  # the script only looks at nm's t/T symbols, not W
            elif t is None or len(t) != len(ours) or not all(map(_same_place, ours, t)):
                mismatches.append((f.frame.symbol, f.frame.module, ours, t))
    assert not mismatches, mismatches
    assert len(undecoded) <= 2, undecoded


def _weak_symbols(nm_listing: Path) -> set[str]:
    return {parts[2] for parts in (line.split() for line in nm_listing.read_text().splitlines())
            if len(parts) == 3 and parts[1] in ("W", "w")}
