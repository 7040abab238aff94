"""The kernel's VMCOREINFO note: where it is (``/sys/kernel/vmcoreinfo``), the note itself, its fields.

The note is what drgn (and crash) need to read a kernel without its
``/proc/kcore``: the release, the build ID, ``swapper_pg_dir`` and
``phys_base`` (the page tables), the memory model. A running guest says where
its note lies in physical memory::

    $ cat /sys/kernel/vmcoreinfo
    0x000000001ef24000 1024          # physical address, size (both hex)

Everything here is read from the guest, so it is untrusted: sizes are
bounded, names checked, the text must be plain printable ASCII lines.
Pure functions (no I/O).
"""

from __future__ import annotations

import re
import struct

from labctl.errors import DebugError

SYSFS = "/sys/kernel/vmcoreinfo"
NOTE_NAME = b"VMCOREINFO"
MAX_NOTE = 64 << 10  # the kernel's is one page and two note headers (0x1024 bytes)
MAX_PHYS = 1 << 52  # x86-64's physical address space

_SYSFS_LINE = re.compile(r"(?:0x)?([0-9a-fA-F]{1,16}) (?:0x)?([0-9a-fA-F]{1,8})")
_FIELD = re.compile(r"[A-Za-z0-9_().-]+=[\x20-\x7e]*")


def parse_sysfs(text: str) -> tuple[int, int]:
    """``/sys/kernel/vmcoreinfo``'s ``ADDRESS SIZE`` (both hexadecimal) as numbers.

    :raise DebugError: for anything else, an address beyond x86-64's physical
        space or a size beyond :data:`MAX_NOTE`.
    """
    m = _SYSFS_LINE.fullmatch(text.strip()[:64])
    if m is None:
        raise DebugError(f"unexpected {SYSFS} in the guest: {text.strip()[:64]!r}")
    address, size = int(m.group(1), 16), int(m.group(2), 16)
    if not 0 < address < MAX_PHYS or not 12 < size <= MAX_NOTE:
        raise DebugError(f"the guest's {SYSFS} gives an implausible note: {size:#x} bytes at {address:#x}")
    return address, size


def parse_note(raw: bytes) -> bytes:
    """The descriptor of the ELF note at the start of ``raw`` (``namesz``, ``descsz``, ``type``,
    then the name and descriptor, each padded to 4 bytes), which must be ``VMCOREINFO``.

    :raise DebugError: when it is not that note, or does not fit in ``raw``, or its text is not
        ``KEY=VALUE`` lines of printable ASCII.
    """
    if len(raw) < 12:
        raise DebugError("the VMCOREINFO note is truncated")
    namesz, descsz, _type = struct.unpack_from("<III", raw)
    start = 12 + ((namesz + 3) & ~3)
    name = raw[12:12 + namesz].rstrip(b"\0")
    if name != NOTE_NAME or start + descsz > len(raw) or descsz > MAX_NOTE:
        raise DebugError(f"no VMCOREINFO note where the guest said (name {name[:16]!r}, {descsz} bytes)",
                         hint="the guest's memory changed meanwhile, or it is not a Linux kernel with kexec")
    desc = raw[start:start + descsz].rstrip(b"\0")
    check_text(desc)
    return desc


def check_text(desc: bytes) -> None:
    """Raise :class:`DebugError` unless ``desc`` is VMCOREINFO text: ``KEY=VALUE`` lines, printable ASCII."""
    try:
        text = desc.decode("ascii")
    except UnicodeDecodeError as exc:
        raise DebugError("the VMCOREINFO note is not ASCII text") from exc
    lines = text.splitlines()
    if not lines or not all(_FIELD.fullmatch(line) for line in lines):
        raise DebugError("the VMCOREINFO note is not KEY=VALUE lines")


def fields(desc: bytes) -> dict[str, str]:
    """``KEY=VALUE`` lines of a note's text as a dict (``OSRELEASE``, ``BUILD-ID``, ``SYMBOL(x)``...)."""
    out: dict[str, str] = {}
    for line in desc.decode("ascii", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out.setdefault(key, value)
    return out


def release(desc: bytes) -> str:
    """The kernel's ``uname -r`` from its note ('' when absent)."""
    return fields(desc).get("OSRELEASE", "")


def build_id(desc: bytes) -> str:
    """The kernel's GNU build ID (lower-case hex) from its note ('' when absent or not hex)."""
    value = fields(desc).get("BUILD-ID", "").lower()
    return value if re.fullmatch(r"[0-9a-f]{2,128}", value) else ""
