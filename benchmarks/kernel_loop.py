#!/usr/bin/env python3
"""A kernel developer's loop and a new Debian kernel's first use, timed.

Usage: python benchmarks/kernel_loop.py [--tree PATH] [--debian SPEC] [--skip-tree] [--skip-debian]
                                        [--accel auto|kvm|tcg] [--json]

Tree (default: the test kernel scripts/test-kernel.sh built): a one-guest
lab (e1000 + virtio NICs) on the tree is brought up on the prepared kernel
(the floor: a cold boot only; and once more restored from the snapshot the
first boot took, as ``up`` does when nothing changed); then a change to a module (e1000_main.c) and a
change to the kernel itself (net/core/dev.c) are each made, built with
``make vmlinux modules`` and brought up again. For each, the figures are
make, labctl's preparation of the rebuilt kernel (hash, copy, modules
disk), and ``up`` to SSH-ready: the loop costs the build, the boot and the
preparation, and the preparation is what labctl adds. The tree is restored
and rebuilt at the end.

Debian (default debian:6.1.0-54-amd64): the one-time preparation of a
kernel no lab has used (each phase timed, into a scratch kernel cache; the
packages come from labctl's download cache when they are there, and the
figures say whether they were), then ``up`` on it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labctl.events import NullReporter
from labctl.image.apt import apt_download, downloads_dir
from labctl.image.recipe import load_recipe
from labctl.image.store import ImageStore
from labctl.kernel import debian_packages, kernel_options, prepare_kernel
from labctl.lab import TREE, KernelSpec, debian_kernel, load_lab_text
from labctl.paths import cache_dir
from labctl.up import remove_lab_snapshots
from labctl.up.lifecycle import UpOptions, up
from labctl.up.teardown import down

ROOT = Path(__file__).resolve().parents[1]
LAB = """\
name: bench-kernel
networks: {lan: {}}
guests:
  g:
    nics:
      - {name: eth1, model: e1000, network: lan, ip: 10.72.0.1/24}
      - {name: eth2, model: virtio-net-pci, network: lan, ip: 10.72.0.2/24}
"""
CHANGES = {  # what a developer edits: a module, and the kernel proper
    "module": "drivers/net/ethernet/intel/e1000/e1000_main.c",
    "kernel": "net/core/dev.c",
}


def default_tree() -> Path | None:
    found = sorted((cache_dir() / "test-kernel").glob("*/linux/.built"))
    return found[-1].parent if found else None


def make(tree: Path) -> float:
    t0 = time.monotonic()
    subprocess.run(["make", "-s", f"-j{os.cpu_count()}", "vmlinux", "modules"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def bring_up(spec: KernelSpec, accel: str, cold: bool = False) -> dict[str, float | str]:
    """Prepare ``spec`` (timed), then up a one-guest lab on it to SSH-ready (timed), then down.

    As ``labctl up`` does by default: a kernel no snapshot was taken on boots
    (and the snapshot is taken); ``cold`` boots even where one exists.
    """
    image = ImageStore().require("debian-12")
    recipe = load_recipe("debian-12")
    reporter = NullReporter()
    t0 = time.monotonic()
    kernel = prepare_kernel(spec, kernel_options(recipe), reporter)
    prepared = time.monotonic() - t0
    lab = load_lab_text(LAB, "bench-kernel.yaml")
    t1 = time.monotonic()
    state = up(lab, image, {"g": kernel}, UpOptions(accel=accel, cold=cold))
    booted = time.monotonic() - t1
    down(lab.name)
    return {"prepare_s": round(prepared, 2), "up_s": round(booted, 2), "accel": state.accel,
            "release": kernel.release, "key": kernel.key,
            "phases_s": {k: round(v, 2) for k, v in reporter.durations.items()}}


def tree_loop(tree: Path, accel: str) -> dict[str, object]:
    spec = KernelSpec(TREE, tree=tree)
    result: dict[str, object] = {"tree": str(tree)}
    # Bring the tree up to date first, so that the figures below are the edits' own: an update
    # of the host's headers (libelf-dev, linux-libc-dev) rebuilds objtool, and with it every
    # object of the kernel (seen here: a one-file edit became a 20-minute rebuild).
    result["catch_up_make_s"] = round(make(tree), 1)
    bring_up(spec, accel)  # make sure the unchanged tree is prepared and has its snapshot
    result["unchanged"] = bring_up(spec, accel, cold=True)  # the floor: a boot and nothing else
    result["unchanged_warm"] = bring_up(spec, accel)  # the same kernel again: restored
    originals = {name: (tree / rel).read_text() for name, rel in CHANGES.items()}
    try:
        for n, (name, rel) in enumerate(CHANGES.items(), 1):
            path = tree / rel
            marker = f"labctl_bench_{name}_{os.getpid()}_{n}"
            path.write_text(path.read_text() + f"\nint {marker}(void);\nint {marker}(void) {{ return {n}; }}\n")
            built = make(tree)
            result[f"changed_{name}"] = {"file": rel, "make_s": round(built, 1), **bring_up(spec, accel)}
    finally:
        for name, rel in CHANGES.items():
            (tree / rel).write_text(originals[name])
        make(tree)  # the tree as it was (tests use it)
    return result


def debian_first_use(spec_text: str, accel: str) -> dict[str, object]:
    spec = debian_kernel(spec_text)
    package, dbg = debian_packages(spec)
    real_downloads = downloads_dir()
    cached = {p: any(real_downloads.glob(f"{p}_*.deb")) for p in (package, dbg)}
    real_cache = cache_dir()
    with tempfile.TemporaryDirectory(prefix="lb-kcache-") as scratch:
        # Kernels are prepared into a scratch cache; the rest (image, downloads, the KVM verdict) is
        # shared, so a second run does not fetch 1 GB again.
        for entry in real_cache.iterdir():
            if entry.name != "kernels":
                (Path(scratch) / entry.name).symlink_to(entry)
        os.environ["LABCTL_CACHE_DIR"] = scratch
        t0 = time.monotonic()
        for p in (package, dbg):
            apt_download(p)
        downloaded = time.monotonic() - t0
        figures = bring_up(spec, accel)
    os.environ.pop("LABCTL_CACHE_DIR", None)
    return {"kernel": spec_text, "downloads_were_cached": cached, "download_s": round(downloaded, 1), **figures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, help="a built kernel tree (default: scripts/test-kernel.sh's)")
    ap.add_argument("--debian", default="debian:6.1.0-54-amd64", help="a Debian kernel no lab has used yet")
    ap.add_argument("--skip-tree", action="store_true")
    ap.add_argument("--skip-debian", action="store_true")
    ap.add_argument("--accel", default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    report: dict[str, object] = {"host_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="lb-") as state_dir:
        os.environ["LABCTL_STATE_DIR"] = state_dir
        remove_lab_snapshots("bench-kernel")  # one per kernel it booted, ~90 MB each
        try:
            if not args.skip_tree:
                tree = args.tree or default_tree()
                if tree is None:
                    print("no built tree: pass --tree, or run scripts/test-kernel.sh", file=sys.stderr)
                    return 2
                report["tree"] = tree_loop(tree.resolve(), args.accel)
            if not args.skip_debian:
                report["debian"] = debian_first_use(args.debian, args.accel)
        finally:
            remove_lab_snapshots("bench-kernel")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"labctl kernel loop benchmark ({os.cpu_count()} host CPUs)")
    if "tree" in report:
        t = report["tree"]
        assert isinstance(t, dict)
        floor = t["unchanged"]
        print(f"  tree {t['tree']}")
        print(f"    unchanged tree: prepare (cache hit) {floor['prepare_s']} s, boot to SSH-ready {floor['up_s']} s "
              f"({floor['accel']}); warm (restored) {t['unchanged_warm']['up_s']} s")
        for name in CHANGES:
            c = t[f"changed_{name}"]
            extra = c["prepare_s"] + c["up_s"] - floor["up_s"]
            print(f"    changed {name} ({c['file']}): make {c['make_s']} s, prepare {c['prepare_s']} s, "
                  f"up {c['up_s']} s -> labctl adds {extra:.1f} s to the boot")
            print("      prepare phases: " + ", ".join(f"{k} {v} s" for k, v in c["phases_s"].items()))
    if "debian" in report:
        d = report["debian"]
        assert isinstance(d, dict)
        cached = ", ".join(f"{p} {'cached' if c else 'fetched'}" for p, c in d["downloads_were_cached"].items())
        print(f"  new Debian kernel {d['kernel']}: download {d['download_s']} s ({cached}), "
              f"prepare {d['prepare_s']} s, up {d['up_s']} s")
        print("    prepare phases: " + ", ".join(f"{k} {v} s" for k, v in d["phases_s"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
