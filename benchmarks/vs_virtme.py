#!/usr/bin/env python3
"""labctl against virtme-ng on the same kernel, in the same run: boot, run `true`, be gone.

Usage: python benchmarks/vs_virtme.py --vng PATH [--pairs N] [--accel auto|kvm|tcg] [--json]

virtme-ng is what a kernel engineer would otherwise reach for to run one
command on a kernel. Each pair times, one right after the other, on the
kernel labctl's default image boots (Debian's, as prepared in labctl's cache):

- ``vng --verbose --run KERNEL --exec true`` (``--disable-kvm`` under TCG), its wall time
  (``--verbose``: its console tells whether ``true`` ran, see :func:`vng_once`);
- ``labctl up LAB`` + ``labctl exec LAB g0 -- true`` + ``labctl down LAB`` of a
  one-guest lab, as a user types them (each a new process), warm (restored from
  the lab's post-boot snapshot) and, with ``--cold``, ``up --cold`` too.

virtme-ng loads the kernel's modules (9p, virtio) from /lib/modules/RELEASE on
the host. When that directory lacks them (Debian's kernel headers package makes
only its ``build`` and ``source`` links), this benchmark links the modules that
labctl prepared for the kernel into it for the run and removes its links
afterwards. Install virtme-ng with ``python3 -m venv /tmp/vng && /tmp/vng/bin/pip
install virtme-ng`` (it also wants busybox: ``apt-get install busybox-static``).
Prints medians and ranges and each labctl figure as a fraction of virtme-ng's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labctl.image.store import ImageStore
from labctl.kernel.cached import BOOT, MODULES_IMG, Kernel
from labctl.lab import load_lab_text
from labctl.pipeline import prepare_kernels

LAB = "name: bench-vng\nnetworks: {lan: {}}\nguests:\n  g0:\n    nics: [{name: eth1, model: virtio-net-pci, network: lan, ip: 10.51.0.1/24}]\n"


@contextmanager
def host_modules(kernel: Kernel) -> Iterator[None]:
    """/lib/modules/RELEASE holding the kernel's modules for virtme-ng while this runs (links to
    a copy taken out of labctl's modules disk); only the links this made are removed again."""
    target = Path("/lib/modules") / kernel.release
    if (target / "modules.dep").exists():
        yield
        return
    made: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="vng-mods-") as tmp:
        subprocess.run(["debugfs", "-R", f"rdump /{kernel.release} {tmp}", str(kernel.dir / MODULES_IMG)],
                       check=True, capture_output=True, timeout=600)
        target.mkdir(parents=True, exist_ok=True)
        try:
            for entry in sorted((Path(tmp) / kernel.release).iterdir()):
                link = target / entry.name
                if not link.exists() and not link.is_symlink():
                    link.symlink_to(entry)
                    made.append(link)
            yield
        finally:
            for link in made:
                link.unlink(missing_ok=True)


def timed(argv: list[str], timeout: float = 300.0) -> float:
    t0 = time.monotonic()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    took = time.monotonic() - t0
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).decode(errors="replace")[-800:]
        raise SystemExit(f"{' '.join(argv[:3])}... exited {done.returncode}:\n{tail}")
    return took


def vng_once(vng: str, kernel: Kernel, tcg: bool) -> float:
    env_path = f"{Path(vng).parent}:{os.environ.get('PATH', '')}"  # vng runs virtme-run beside it
    argv = ["env", f"PATH={env_path}", vng, "--verbose", *(["--disable-kvm"] if tcg else []),
            "--run", str(kernel.dir / BOOT), "--exec", "true"]
    t0 = time.monotonic()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=300, check=False)
    took = time.monotonic() - t0
    out = (done.stdout + done.stderr).decode(errors="replace")
    # Without udev on the host, virtme-ng-init finds no virtio-serial ports for the command's I/O
    # and runs it on the console: vng then exits 255 whatever the command did, and only --verbose
    # shows the console. It ran when its init says the script exited with 0.
    if done.returncode != 0 and "script exited with code 0" not in out:
        raise SystemExit(f"vng exited {done.returncode}:\n{out[-800:]}")
    return took


PHASES: dict[str, list[float]] = {"up": [], "exec": [], "down": []}  # the warm runs' commands, each


def labctl_once(lab: Path, accel: str, cold: bool) -> float:
    labctl = [sys.executable, "-m", "labctl"]
    t0 = time.monotonic()
    took = {"up": timed([*labctl, "up", str(lab), "--accel", accel, *(["--cold"] if cold else [])]),
            "exec": timed([*labctl, "exec", "bench-vng", "g0", "--", "true"]),
            "down": timed([*labctl, "down", "bench-vng"])}
    if not cold:
        for k, v in took.items():
            PHASES[k].append(v)
    return time.monotonic() - t0


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vng", required=True, help="virtme-ng's vng executable")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--accel", default="tcg", choices=["auto", "kvm", "tcg"])
    ap.add_argument("--cold", action="store_true", help="time labctl's up --cold too")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("busybox") is None:
        raise SystemExit("virtme-ng needs busybox on the host: apt-get install busybox-static")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set: each labctl command compiles labctl anew "
              "(about 0.15 s more each; unset it to time labctl as installed)", file=sys.stderr)
    image = ImageStore().require("debian-12")
    with tempfile.TemporaryDirectory(prefix="bench-vng-") as tmp:
        lab_file = Path(tmp) / "lab.yaml"
        lab_file.write_text(LAB)
        kernel = prepare_kernels(load_lab_text(LAB, str(lab_file)), image)["g0"]
        tcg = args.accel == "tcg"
        runs: dict[str, list[float]] = {"vng": [], "labctl_warm": [], "labctl_cold": []}
        with host_modules(kernel):
            vng_once(args.vng, kernel, tcg)  # page cache warm for both
            labctl_once(lab_file, args.accel, cold=False)  # the lab's post-boot snapshot exists
            for v in PHASES.values():
                v.clear()
            for _ in range(args.pairs):
                runs["vng"].append(vng_once(args.vng, kernel, tcg))
                runs["labctl_warm"].append(labctl_once(lab_file, args.accel, cold=False))
                if args.cold:
                    runs["labctl_cold"].append(labctl_once(lab_file, args.accel, cold=True))
    out: dict[str, object] = {"kernel": kernel.release, "accel": args.accel, "pairs": args.pairs,
                              **{k: summary(v) for k, v in runs.items() if v}}
    base = statistics.median(runs["vng"])
    out["ratio"] = {k: round(statistics.median(v) / base, 2) for k, v in runs.items() if v and k != "vng"}
    out["labctl_warm_commands"] = {k: summary(v) for k, v in PHASES.items()}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"boot + `true` + gone, kernel {kernel.release}, {args.accel}, {args.pairs} pairs (median, min-max):")
    for k, label in (("vng", "vng --run KERNEL --exec true"), ("labctl_warm", "labctl up + exec true + down (warm)"),
                     ("labctl_cold", "labctl up --cold + exec true + down")):
        if runs[k]:
            s = summary(runs[k])
            ratio = "" if k == "vng" else f"  {s['median'] / base:.2f}x virtme-ng's"
            print(f"  {label:40s} {s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f}){ratio}")
    print("  the warm runs' commands: " + ", ".join(
        f"{k} {summary(v)['median']:.2f} s" for k, v in PHASES.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
