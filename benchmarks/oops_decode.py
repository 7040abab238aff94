#!/usr/bin/env python3
"""Time ``labctl oops decode`` on a 50-frame oops against the image's 633 MB vmlinux.debug.

Usage: python benchmarks/oops_decode.py [--runs N] [--drop-page-cache] [--max-seconds S]
                                        [--regenerate] [--json]

The oops is ``tests/fixtures/oops/synthetic-50.console.log``: real symbols
(42 vmlinux functions spread over .text, 8 frames of 8139cp, e1000 and
virtio_net), in <IRQ> and <TASK> sections, with some ``?`` frames.
``--regenerate`` rewrites it from the current image.

Measured, each as the median of ``--runs``:

* cold: empty labctl oops cache (vmlinux's ELF symbol table is parsed, every
  address goes to addr2line), in-process (Symbolizer + parse + decode);
* warm: the same with the cache filled by the cold run (no addr2line at all);
* CLI cold / warm: the whole command in a fresh Python process, as a user runs it.

``--drop-page-cache`` (root only; it slows down everything else on the
machine for a while) also empties the kernel's page cache before each cold
run, so vmlinux.debug is read from disk. Exits 1 when a cold decode takes
longer than ``--max-seconds`` (default 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.debug import Symbolizer, parse_oopses
from labctl.debug.symbolize import SymbolTable
from labctl.image.recipe import load_recipe
from labctl.image.store import ImageStore
from labctl.kernel import default_kernel
from labctl.kernel.cached import Kernel

FIXTURE = ROOT / "tests" / "fixtures" / "oops" / "synthetic-50.console.log"
MODULE_FRAMES = [("8139cp", "cp_rx_poll"), ("8139cp", "cp_interrupt"), ("e1000", "e1000_clean"),
                 ("e1000", "e1000_clean_rx_irq"), ("e1000", "e1000_xmit_frame"), ("virtio_net", "virtnet_poll"),
                 ("virtio_net", "receive_buf"), ("virtio_net", "start_xmit")]



def spread_symbols(table: SymbolTable, count: int) -> list[tuple[str, int]]:
    """``count`` unambiguous .text functions of vmlinux, evenly spread by address: (name, size)."""
    syms = sorted((s for name, entries in table.by_name.items() if len(entries) == 1
                   for s in table.candidates(name)
                   if s.section == ".text" and s.size >= 0x80 and s.name.isidentifier()),
                  key=lambda s: s.address)
    step = len(syms) // count
    return [(s.name, s.size) for s in syms[step // 2::step][:count]]


def synthetic_oops(sym: Symbolizer, frames: int = 50) -> str:
    """A console log with one NULL-pointer oops of ``frames`` frames, from real symbols."""
    lines = ["BUG: kernel NULL pointer dereference, address: 0000000000000010",
             "#PF: supervisor read access in kernel mode", "Oops: 0000 [#1] PREEMPT SMP NOPTI",
             "CPU: 0 PID: 0 Comm: swapper/0 Not tainted 6.1.0-56-amd64 #1  Debian 6.1.192-2"]
    cp = sym.symbols("8139cp")
    assert cp is not None, "8139cp.ko is missing from the image's debug modules"
    start = cp.lookup("cp_start_xmit")
    assert start is not None
    lines += [f"RIP: 0010:cp_start_xmit+0x4e/{start.size:#x} [8139cp]", "Call Trace:", " <IRQ>"]
    mods: list[str] = []
    for mod, name in MODULE_FRAMES:
        table = sym.symbols(mod)
        s = table.lookup(name) if table else None
        assert s is not None, f"{mod}.ko has no {name}"
        mods.append(f"{name}+{s.size // 3:#x}/{s.size:#x} [{mod}]")
    vml = [f"{name}+{size // 2:#x}/{size:#x}" for name, size in spread_symbols(sym.table, frames - len(mods))]
    order = [mods.pop(0) if i % 6 == 0 and mods else vml.pop(0) for i in range(frames)]
    for i, e in enumerate(order):
        if i == len(order) // 2:
            lines += [" </IRQ>", " <TASK>"]
        lines.append(f" {'? ' if i % 7 == 3 else ''}{e}")
    lines += [" </TASK>", "---[ end trace 0000000000000000 ]---"]
    return "".join(f"[  {100 + i * 0.000113:10.6f}] {l}\n" for i, l in enumerate(lines))


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def decode_once(img: Kernel, cache: Path) -> tuple[float, Symbolizer, int]:
    """Seconds for Symbolizer + parse + decode, the symbolizer, and the frame count."""
    t0 = time.perf_counter()
    sym = Symbolizer(img.vmlinux_debug, img.debug_modules, cache=cache)
    decoded = sym.decode(parse_oopses(FIXTURE.read_text()))
    return time.perf_counter() - t0, sym, sum(len(d.frames) for d in decoded)


def cli_once(img: Kernel, cache_root: Path) -> float:
    env = dict(os.environ, LABCTL_CACHE_DIR=str(cache_root), PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "labctl", "oops", "decode", str(FIXTURE), "--vmlinux", str(img.vmlinux_debug),
            "--modules", str(img.debug_modules)]
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def measure(img: Kernel, runs: int, drop: bool) -> dict[str, object]:
    cold, warm, cli_cold, cli_warm = [], [], [], []
    frames, processes = 0, []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="oops-bench-") as tmp:
            if drop:
                drop_page_cache()
            seconds, sym, frames = decode_once(img, Path(tmp) / "oops")
            cold.append(seconds)
            processes = [f"{obj.name}{' ' + sec if sec else ''}: {n} addresses" for obj, sec, n in sym.runs]
            warm.append(decode_once(img, Path(tmp) / "oops")[0])
        with tempfile.TemporaryDirectory(prefix="oops-bench-cli-") as tmp:
            if drop:
                drop_page_cache()
            cli_cold.append(cli_once(img, Path(tmp)))
            cli_warm.append(cli_once(img, Path(tmp)))
    return {"frames": frames, "vmlinux_mb": round(img.vmlinux_debug.stat().st_size / 1e6),
            "addr2line_processes": processes, "page_cache_dropped": drop, "runs": runs,
            "cold_s": statistics.median(cold), "warm_s": statistics.median(warm),
            "cli_cold_s": statistics.median(cli_cold), "cli_warm_s": statistics.median(cli_warm)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--drop-page-cache", action="store_true", help="root only: read vmlinux.debug from disk")
    ap.add_argument("--max-seconds", type=float, default=2.0)
    ap.add_argument("--regenerate", action="store_true", help=f"rewrite {FIXTURE.name} from the image")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    image = ImageStore().require("debian-12")
    img = default_kernel(image, load_recipe(image.name))  # the kernel whose debug files decode
    if args.regenerate or not FIXTURE.exists():
        FIXTURE.write_text(synthetic_oops(Symbolizer(img.vmlinux_debug, img.debug_modules)))
    r = measure(img, args.runs, args.drop_page_cache)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"oops decode: {r['frames']}-frame oops + RIP, vmlinux.debug {r['vmlinux_mb']} MB, "
              f"median of {r['runs']}{', page cache dropped before cold runs' if r['page_cache_dropped'] else ''}")
        print(f"  cold (no cache)   {r['cold_s']:.2f} s   in-process   CLI {r['cli_cold_s']:.2f} s")
        print(f"  warm (cached)     {r['warm_s']:.2f} s   in-process   CLI {r['cli_warm_s']:.2f} s")
        print("  addr2line processes (cold): " + "; ".join(r["addr2line_processes"]))  # type: ignore[arg-type]
    slow = max(float(r["cold_s"]), float(r["cli_cold_s"])) > args.max_seconds  # type: ignore[arg-type]
    if slow:
        print(f"SLOW: a cold decode took longer than {args.max_seconds} s", file=sys.stderr)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
