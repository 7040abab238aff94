"""The host's TSC rate, told to TCG guests (``tsc_early_khz=``).

Under TCG a guest's TSC is the host's (QEMU reads it with ``rdtsc``), but the
guest kernel calibrates it at boot against the PIT or the HPET over a few
milliseconds, and a vCPU thread descheduled on a busy host spoils that: 20%
and 13x errors were measured here on a loaded 2-core host, the guest clock
then ran that much fast and every ftrace/perf timestamp (sched_clock) with
it. Told the rate, the kernel skips the early calibration; its later refined
calibration (over a second, against the HPET, with filtered reads) still
applies when within 1% of it.

Measured once per host boot (a 0.2 s window against CLOCK_MONOTONIC_RAW,
the median of three, rounded to the MHz so that snapshot keys stay stable)
and kept in ``<cache>/host-tsc.json``. ``rdtsc`` is run from a few bytes of
machine code in an executable mapping; where that is not allowed (or not
x86-64) nothing is told and the guest calibrates as before.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import platform
import statistics
import time
from pathlib import Path

from labctl.paths import atomic_write, cache_dir

# rdtsc; shl rdx, 32; or rax, rdx; ret
_RDTSC = bytes([0x0F, 0x31, 0x48, 0xC1, 0xE2, 0x20, 0x48, 0x09, 0xD0, 0xC3])
WINDOW = 0.2


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _measure() -> int | None:
    """The TSC rate in kHz (rounded to the MHz), or None when it cannot be read."""
    if platform.machine() != "x86_64":
        return None
    try:
        buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return None
    try:
        buf.write(_RDTSC)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        rdtsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(addr)
        rates = []
        for _ in range(3):
            t0, c0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW), rdtsc()
            time.sleep(WINDOW)
            t1, c1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW), rdtsc()
            rates.append((c1 - c0) / ((t1 - t0) / 1e6))  # ticks per ms = kHz
        del rdtsc
        khz = statistics.median(rates)
        return round(khz / 1000.0) * 1000 if khz > 100_000 else None
    except Exception:  # noqa: BLE001 - no rate: the guest calibrates itself, as without this module
        return None
    finally:
        try:
            buf.close()
        except BufferError:
            pass


def host_tsc_khz() -> int | None:
    """The host's TSC rate in kHz (cached per host boot), or None when unknown."""
    memo = cache_dir() / "host-tsc.json"
    boot = _boot_id()
    try:
        data = json.loads(memo.read_text())
        if data.get("boot_id") == boot and boot:
            return int(data["khz"]) if data.get("khz") else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    khz = _measure()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(memo, json.dumps({"boot_id": boot, "khz": khz}) + "\n")
    except OSError:
        pass
    return khz
