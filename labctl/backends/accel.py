"""Choose the accelerator: KVM when a real probe boot works, TCG otherwise.

``/dev/kvm`` can exist and still be unusable (e.g. nested virtualisation
where a guest hangs right after the real-mode setup, or ``-cpu host``
aborting), so the probe boots the image's kernel under KVM with a short
timeout and waits for its first console line. The verdict is cached per
host boot and QEMU binary.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from labctl.backends.qemu.argv import SANDBOX
from labctl.errors import UsageError
from labctl.paths import atomic_write, cache_dir
from labctl.proc import kill_group, spawn_tied

PROBE_TIMEOUT = 6.0
PROBE_CPU_LIMIT = 60  # seconds of CPU time, enforced by the kernel
QEMU = "qemu-system-x86_64"


@dataclass(frozen=True)
class AccelChoice:
    accel: str  # "kvm" | "tcg"
    warning: str | None  # set when KVM was wanted but is not usable


def probe_kvm(kernel: Path, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """Boot ``kernel`` under KVM until its first console line; (usable, reason)."""
    if not os.path.exists("/dev/kvm"):
        return False, "/dev/kvm does not exist"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "no read/write access to /dev/kvm"
    with tempfile.TemporaryDirectory(prefix="labctl-kvm-") as tmp:
        console = Path(tmp) / "console"
        argv = [QEMU, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-sandbox", SANDBOX,
                "-machine", "pc", "-accel", "kvm", "-cpu", "host", "-m", "256",
                "-kernel", str(kernel), "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1",
                "-serial", f"file:{console}"]
        # Where KVM is broken the probe hangs for good: it dies with labctl and
        # has a CPU-time limit of its own, besides the timeout below.
        proc = spawn_tied(argv, Path(tmp) / "qemu.log", cpu_seconds=PROBE_CPU_LIMIT)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if console.exists() and b"Linux version" in console.read_bytes():
                    return True, "a probe guest booted under KVM"
                if proc.poll() is not None:
                    try:
                        out = (Path(tmp) / "qemu.log").read_text(errors="replace")
                    except OSError:
                        out = ""
                    last = out.strip().splitlines()[-1] if out.strip() else f"exit status {proc.returncode}"
                    return False, f"QEMU failed under KVM: {last}"
                time.sleep(0.05)
            return False, f"a probe guest printed nothing under KVM within {timeout:.0f} s"
        finally:
            kill_group(proc, grace=0.5)


def _probe_key(kernel: Path) -> str:
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "?"
    qemu = shutil.which(QEMU) or QEMU
    try:
        qemu_mtime = str(os.stat(qemu).st_mtime_ns)
    except OSError:
        qemu_mtime = "?"
    return f"{boot_id}:{qemu}:{qemu_mtime}:{kernel}"


def kvm_usable(kernel: Path) -> tuple[bool, str]:
    """Cached :func:`probe_kvm` (cached per host boot, QEMU binary and kernel: one verdict per
    kernel, those of this boot and QEMU kept)."""
    cache = cache_dir() / "accel-probe.json"
    key = _probe_key(kernel)
    probes: dict[str, dict[str, object]] = {}
    try:
        data = json.loads(cache.read_text())
        probes = {k: v for k, v in data.get("probes", {}).items() if isinstance(v, dict)}
        if key in probes:
            return bool(probes[key]["usable"]), str(probes[key]["reason"])
    except (OSError, ValueError, KeyError, AttributeError):
        probes = {}
    usable, reason = probe_kvm(kernel)
    here = key.rsplit(":", 1)[0] + ":"  # this boot and QEMU: older verdicts are dropped
    probes = {k: v for k, v in probes.items() if k.startswith(here)} | {key: {"usable": usable, "reason": reason}}
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, json.dumps({"probes": probes}))
    return usable, reason


def choose_accel(requested: str, kernel: Path) -> AccelChoice:
    """Resolve ``auto``/``kvm``/``tcg`` into the accelerator to use.

    :raise UsageError: for an unknown name. ``kvm`` is honoured as asked
        (the user forces it); ``auto`` falls back to TCG with a warning.
    """
    if requested == "tcg":
        return AccelChoice("tcg", None)
    if requested == "kvm":
        return AccelChoice("kvm", None)
    if requested != "auto":
        raise UsageError(f"unknown accelerator '{requested}'", hint="use auto, kvm or tcg")
    usable, reason = kvm_usable(kernel)
    if usable:
        return AccelChoice("kvm", None)
    return AccelChoice("tcg", f"KVM is not usable here ({reason}); using TCG, which is slower. "
                              "Pass --accel tcg to skip this check.")


def choose_accels(requested: str, boots: Mapping[str, Path]) -> tuple[dict[str, str], list[str]]:
    """Each guest's accelerator from its own kernel (``boots``: guest -> its kernel's boot image; each
    distinct kernel probed once), and the warnings, each once.

    :raise UsageError: as :func:`choose_accel`.
    """
    by_boot: dict[Path, AccelChoice] = {}
    for boot in boots.values():
        if boot not in by_boot:
            by_boot[boot] = choose_accel(requested, boot)
    warnings = list(dict.fromkeys(c.warning for c in by_boot.values() if c.warning))
    return {g: by_boot[b].accel for g, b in boots.items()}, warnings


def lab_accel(accels: Mapping[str, str]) -> str:
    """The lab's accelerator, as its state and reports say it: ``kvm`` only when every guest runs under KVM."""
    return "kvm" if accels and all(a == "kvm" for a in accels.values()) else "tcg"
