#!/usr/bin/env python3
"""Time ``labctl drgn`` and ``labctl dump`` on a one-guest lab (512 MiB, TCG here), against what a
user would do without them (QMP dump-guest-memory to an ELF file, then ``drgn -c``).

Usage: python benchmarks/drgn.py [--runs N] [--json] [--max-seconds S] [--max-pause S]

Brings the lab up in a private state directory and takes it down after. Measured, each the
median of ``--runs``:

* ``labctl drgn LAB a -c 'print(prog["init_net"].loopback_dev.name)'`` end to end (a fresh
  Python process, as a user runs it), and where its time goes: labctl's own ``--json`` figures
  (the monitor's RAM map, finding VMCOREINFO, loading the debug info of the kernel and its
  modules) and Python starting and importing labctl; the first session on a guest (which asks
  the guest over SSH where its VMCOREINFO is) separately;
* the pause of ``--pause -c ...`` (from before QMP ``stop`` is sent until ``cont`` is answered,
  as labctl reports it);
* ``labctl dump`` (kdump): its time, how long QEMU paused the guest, the file's size; and once
  ``--format elf``;
* the alternative: QMP ``dump-guest-memory`` (ELF, what ``virsh dump --memory-only`` does) into a
  file, then ``drgn -q -c FILE -s vmlinux.debug -e ...``: the guest is paused for the whole dump.

Exits 1 when the median ``labctl drgn -c`` takes longer than ``--max-seconds`` (default 5) or
the median pause longer than ``--max-pause`` (default 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.backends.monitor import dump_guest_memory
from labctl.kernel.cached import Kernel

LAB = "drgnbench"
LAB_YAML = (f"name: {LAB}\nnetworks: {{lan: {{}}}}\nguests:\n"
            "  a: {memory: 512, nics: [{name: eth1, model: e1000, network: lan, ip: 10.91.0.1/24}]}\n")
CODE = 'print(prog["init_net"].loopback_dev.name)'


def labctl(env: dict[str, str], *args: str, timeout: float = 600) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    took = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"labctl {' '.join(args)} failed ({res.returncode}): {res.stderr}")
    return took, res


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=True, timeout=600)
    return time.monotonic() - t0


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def first_session(env: dict[str, str], state: dict[str, Any]) -> dict[str, Any]:
    """A session that asks the guest over SSH where its VMCOREINFO is (as the first one after up does)."""
    (Path(state["guests"]["a"]["dir"]) / "vmcoreinfo.json").unlink(missing_ok=True)
    took, _ = labctl(env, "drgn", LAB, "a", "-c", CODE)
    facts = json.loads(labctl(env, "drgn", LAB, "a", "--json")[1].stdout)  # from the cache now
    (Path(state["guests"]["a"]["dir"]) / "vmcoreinfo.json").unlink()
    first = json.loads(labctl(env, "drgn", LAB, "a", "--json")[1].stdout)
    assert (facts["vmcoreinfo_from"], first["vmcoreinfo_from"]) == ("cache", "ssh")
    return {"drgn_c_seconds": round(took, 3), "note_seconds": first["seconds"]["note"]}


def measure(env: dict[str, str], state: dict[str, Any], tmp: Path, runs: int) -> dict[str, Any]:
    first = first_session(env, state)
    ends, phases, pauses, dumps = [], [], [], []
    for _ in range(runs):
        took, res = labctl(env, "drgn", LAB, "a", "-c", CODE)
        assert "lo" in res.stdout, res.stdout
        ends.append(took)
        phases.append(json.loads(labctl(env, "drgn", LAB, "a", "--json")[1].stdout)["seconds"])
        _, res = labctl(env, "drgn", LAB, "a", "--pause", "-c", CODE)
        m = re.search(r"paused for ([0-9.]+) s", res.stderr)
        assert m, res.stderr
        pauses.append(float(m.group(1)))
        _, res = labctl(env, "dump", LAB, "a", "-o", str(tmp / "a.vmcore"), "--json")
        dumps.append(json.loads(res.stdout))
    startup = [timed([sys.executable, "-c", "import labctl.cli.main, labctl.inspect"]) for _ in range(runs)]
    _, res = labctl(env, "dump", LAB, "a", "-o", str(tmp / "a.elf"), "--format", "elf", "--json")
    elf = json.loads(res.stdout)
    core_ends = [labctl(env, "drgn", "--core", str(tmp / "a.vmcore"), "-c", CODE)[0] for _ in range(runs)]
    return {
        "first": first,
        "drgn_c_seconds": median(ends), "drgn_c_runs": [round(x, 3) for x in ends],
        "phases_seconds": {k: median([p[k] for p in phases]) for k in phases[0]},
        "python_import_seconds": median(startup),
        "pause_seconds": median(pauses), "pause_runs": pauses,
        "dump": {"seconds": median([d["seconds"] for d in dumps]),
                 "paused_seconds": median([d["paused_seconds"] for d in dumps]),
                 "size_mib": round(statistics.median(d["size"] for d in dumps) / (1 << 20), 1)},
        "dump_elf": {"seconds": round(elf["seconds"], 3), "paused_seconds": round(elf["paused_seconds"], 3),
                     "size_mib": round(elf["size"] / (1 << 20), 1)},
        "drgn_core_c_seconds": median(core_ends),
        "alternative": alternative(state, tmp, runs),
    }


def alternative(state: dict[str, Any], tmp: Path, runs: int) -> dict[str, Any]:
    """What a user does without labctl drgn: dump-guest-memory (ELF) to a file, then drgn -c on it."""
    drgn = shutil.which("drgn") or str(Path(sys.executable).with_name("drgn"))
    vmlinux = Kernel.at(state["kernels"]["a"]).vmlinux_debug
    dumps, reads = [], []
    for _ in range(runs):
        path = tmp / "alt.elf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            t0 = time.monotonic()
            dump_guest_memory(state["guests"]["a"]["qmp"], fd, "elf")
            dumps.append(time.monotonic() - t0)
        finally:
            os.close(fd)
        reads.append(timed([drgn, "-q", "-c", str(path), "-s", str(vmlinux), "--no-default-symbols", "-e", CODE]))
    return {"dump_seconds": median(dumps), "guest_paused_seconds": median(dumps), "drgn_c_seconds": median(reads),
            "total_seconds": median([a + b for a, b in zip(dumps, reads)]),
            "size_mib": round((tmp / "alt.elf").stat().st_size / (1 << 20), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=5.0)
    ap.add_argument("--max-pause", type=float, default=1.5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="drgnbench-") as d:
        tmp = Path(d)
        (tmp / "state").mkdir(mode=0o700)
        env = {**os.environ, "LABCTL_STATE_DIR": str(tmp / "state")}
        env.pop("XDG_RUNTIME_DIR", None)
        (tmp / "lab.yaml").write_text(LAB_YAML)
        labctl(env, "up", str(tmp / "lab.yaml"))
        try:
            state = json.loads((tmp / "state" / "labs" / LAB / "state.json").read_text())
            figures = measure(env, state, tmp, args.runs)
        finally:
            subprocess.run([sys.executable, "-m", "labctl", "down", LAB], cwd=ROOT, env=env, capture_output=True,
                           timeout=300, check=False)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        p, alt = figures["phases_seconds"], figures["alternative"]
        print(f"labctl drgn -c: {figures['drgn_c_seconds']} s end to end (median of {args.runs}; "
              f"python + imports {figures['python_import_seconds']} s; monitor {p['monitor']} s, "
              f"VMCOREINFO {p['note']} s, debug info {p['debug_info']} s); the first after up "
              f"{figures['first']['drgn_c_seconds']} s (VMCOREINFO's place over SSH {figures['first']['note_seconds']} s)")
        print(f"--pause: guest paused {figures['pause_seconds']} s")
        dmp, elf = figures["dump"], figures["dump_elf"]
        print(f"labctl dump: {dmp['seconds']} s, guest paused {dmp['paused_seconds']} s, {dmp['size_mib']} MiB "
              f"(elf: {elf['seconds']} s, {elf['size_mib']} MiB); drgn --core -c: {figures['drgn_core_c_seconds']} s")
        print(f"instead, dump-guest-memory (elf) + drgn -c: {alt['total_seconds']} s, guest paused "
              f"{alt['guest_paused_seconds']} s, {alt['size_mib']} MiB")
    ok = figures["drgn_c_seconds"] <= args.max_seconds and figures["pause_seconds"] <= args.max_pause
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
