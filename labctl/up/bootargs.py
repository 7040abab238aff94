"""The guest kernel command line: the image's needs + labctl's boot policy.

Every flag below was measured under TCG on a 2-core host (see
benchmarks/boot.py); together they take a guest from ~11 s to ~6 s.
"""

from __future__ import annotations

from labctl.image import Image
from labctl.kernel import Kernel
from labctl.lab import Guest

CONSOLE = ["console=ttyS0"]
POLICY = [
    "quiet", "loglevel=4",
    # Reboot at once on panic; QEMU runs with -no-reboot, so it exits and
    # labctl reports the console. Addresses match vmlinux for gdb/oops decoding.
    "panic=-1", "nokaslr",
]
SPEED = [
    # PCI interrupt routing from the BIOS table instead of ACPI AML, which is
    # slow to interpret under TCG (~2 s).
    "acpi=noirq",
    # No LSMs (~1 s), no crypto self-tests (~0.6 s), no speculation fixes.
    "apparmor=0", "lsm=capability", "cryptomgr.notests", "initcall_blacklist=crypto_kdf108_init",
    "mitigations=off",
    # No PS/2 probing, no CPU hot-patching, trust the TSC and the CPU's RNG.
    "i8042.noaux", "i8042.nokbd", "i8042.nopnp", "noreplace-smp", "no_timer_check",
    "tsc=reliable", "random.trust_cpu=on",
]


def kernel_args(image: Image, guest: Guest, kernel: Kernel, extra: tuple[str, ...] = (),
                tsc_khz: int | None = None) -> tuple[str, ...]:
    """The full command line; the lab's and the user's arguments come last and win.

    ``labctl.modules=vdb`` tells labctl's initramfs where the kernel's modules disk is;
    ``tsc_khz`` (TCG on this host, see :mod:`labctl.up.tsc`) spares the guest a calibration
    that a busy host spoils.
    """
    mods = ["labctl.modules=vdb"] if kernel.modules_img else []
    tsc = [f"tsc_early_khz={tsc_khz}"] if tsc_khz else []
    # The bonding driver makes a bond0 of its own when it loads (or boots built in), which a lab's
    # bond of that name would then clash with: the lab's bonds are all the guest has.
    bonds = ["bonding.max_bonds=0"] if guest.bonds else []
    return (*CONSOLE, *image.boot_args, *mods, *POLICY, *SPEED, *tsc, *bonds, *guest.kernel_args, *extra)
