"""A guest's virtual clock (QEMU's ``QEMU_CLOCK_VIRTUAL``) read from outside, through the monitor.

QEMU's ``filter-dump`` stamps frames with that clock plus the second the
filter was created, so captures need it to get real times. No QMP command
returns it, but two devices of every ``pc`` machine count it and the human
monitor can read them without touching the guest:

* the ACPI PM timer (``i /w 0x608``, the PIIX4 PM base SeaBIOS programs):
  ``vm_clock * 3.579545 MHz`` modulo 2^24, exact but wrapping every 4.69 s;
* the HPET main counter (``xp /1gx 0xfed000f0``): ``vm_clock`` at 100 MHz,
  64 bits, but counting only from the moment the guest kernel enabled the
  HPET, about a second after the machine started.

Together: ``vm_clock = hpet + ((pm - hpet) mod 4.69 s)``, provided the guest
enabled its HPET less than 4.69 s after the machine started (Linux does it
in ``time_init``, measured 0.95 s here under TCG). Both count only while
the guest runs, so the result stays right after a gdb session paused it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

PM_TIMER_PORT = 0x608
PM_TIMER_HZ = 3_579_545
PM_TIMER_WRAP = 1 << 24
HPET_COUNTER = 0xFED000F0
HPET_HZ = 100_000_000
PM_COMMAND = f"i /w {PM_TIMER_PORT:#x}"
HPET_COMMAND = f"xp /1gx {HPET_COUNTER:#x}"

_PORT = re.compile(r"port\w\[0x[0-9a-f]+\]\s*=\s*(0x[0-9a-f]+)", re.IGNORECASE)
_XP = re.compile(r"[0-9a-f]+:\s*(0x[0-9a-f]+)", re.IGNORECASE)


class VmClockError(ValueError):
    """The monitor's answers do not give the virtual clock (no PM timer or HPET, or a guest that disabled it)."""


@dataclass(frozen=True)
class ClockSample:
    """The virtual clock ``vm`` (seconds since the machine started, pauses excluded) at wall time ``wall``."""

    wall: float
    vm: float

    @property
    def origin(self) -> float:
        """The wall time at which the virtual clock would read 0 if the guest had never been paused."""
        return self.wall - self.vm


def parse_port(text: str) -> int:
    """The value in HMP ``i`` output (``portl[0x0608] = 0x00bfde9c``).

    :raise VmClockError: for anything else.
    """
    return _hex_answer(_PORT, PM_COMMAND, text)


def parse_xp(text: str) -> int:
    """The value in HMP ``xp`` output (``00000000fed000f0: 0x000000009b02a904``).

    :raise VmClockError: for anything else.
    """
    return _hex_answer(_XP, HPET_COMMAND, text)


def _hex_answer(pattern: re.Pattern[str], command: str, text: str) -> int:
    """The hex number ``pattern``'s group 1 finds in the monitor's answer ``text`` to ``command``."""
    m = pattern.search(text)
    if m is None:
        raise VmClockError(f"unexpected answer to '{command}': {text.strip()[:80]!r}")
    return int(m[1], 16)


def vm_seconds(pm: int, hpet: int, pm_lead: float = 0.0) -> float:
    """The virtual clock in seconds at the HPET read, from a PM timer value read ``pm_lead``
    seconds earlier and the HPET counter.

    :raise VmClockError: when the PM timer reads as all ones (not enabled) or the HPET is not counting.
    """
    if pm >= PM_TIMER_WRAP:
        raise VmClockError(f"the ACPI PM timer reads {pm:#x}: it is not enabled")
    if hpet == 0:
        raise VmClockError("the HPET counter reads 0: the guest has not enabled its HPET")
    wrap = PM_TIMER_WRAP / PM_TIMER_HZ
    hpet_s = hpet / HPET_HZ
    pm_s = pm / PM_TIMER_HZ + pm_lead  # the PM timer moved on while the HPET was read
    enabled_at = (pm_s - hpet_s) % wrap  # the virtual clock when the HPET started counting
    return hpet_s + enabled_at


def _one(hmp: Callable[[str], str], now: Callable[[], float]) -> tuple[float, ClockSample]:
    """(uncertainty in seconds, sample) of one PM timer + HPET reading."""
    t0 = now()
    pm = parse_port(hmp(PM_COMMAND))
    t1 = now()
    hpet = parse_xp(hmp(HPET_COMMAND))
    t2 = now()
    pm_at, hpet_at = (t0 + t1) / 2, (t1 + t2) / 2
    return (t2 - t0) / 2, ClockSample(hpet_at, vm_seconds(pm, hpet, hpet_at - pm_at))


def sample(hmp: Callable[[str], str], now: Callable[[], float] = time.time, tries: int = 3) -> ClockSample:
    """Read the virtual clock through ``hmp`` (one human-monitor command, its output): the
    quickest of ``tries`` readings, whose wall time is the least uncertain (each monitor
    round trip takes a few ms, more on a busy host).

    :raise VmClockError: when the guest's timers do not give it.
    :raise labctl.errors.MachineError: from ``hmp`` when the monitor is unreachable.
    """
    return min((_one(hmp, now) for _ in range(max(1, tries))), key=lambda r: r[0])[1]
