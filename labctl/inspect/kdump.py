"""QEMU's compressed vmcores made readable by drgn as well as crash.

QEMU 7.2 writes ``kdump-zlib`` in makedumpfile's *flattened* format (a
stream of ``offset, size, data`` records, so that it can go down a pipe):
crash reads it, libkdumpfile (drgn's reader) does not. :func:`reassemble`
writes each record at its offset, which gives the ordinary kdump
(``diskdump``) file that ``makedumpfile -R`` would. QEMU also leaves the
header's ``utsname`` empty but for ``machine``, and libkdumpfile then cannot
tell the architecture ("Key has no value"): :func:`set_utsname` fills it in
(``sysname`` ``Linux``, the release from the dump's own VMCOREINFO, the rest
from the kernel's ``init_uts_ns`` when it can be read).

The stream comes from QEMU and the guest's memory is in it: offsets and
sizes are bounded (``limit``), nothing in it is interpreted beyond the
headers. Layouts (makedumpfile's ``diskdump_mod.h``, ``makedumpfile.h``)::

    flattened:  "makedumpfile\\0..." type version (big-endian int64), padded to 4096;
                then records: offset size (big-endian int64) data; offset -1 ends it
    kdump:      "KDUMP   " header_version(i32) utsname(6 x 65) ... block_size(i32 @428);
                sub header at block_size: ... offset_vmcoreinfo(u64 @+32) size_vmcoreinfo(u64 @+40)
"""

from __future__ import annotations

import os
import struct

import labctl.inspect.vmcoreinfo as vmcoreinfo  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.errors import DebugError

FLAT_SIGNATURE = b"makedumpfile"
FLAT_HEADER = 4096
KDUMP_SIGNATURE = b"KDUMP   "
UTS_OFFSET, UTS_FIELD, UTS_FIELDS = 12, 65, 6
BLOCK_SIZE_OFFSET = 428
_CHUNK = 1 << 20


def _read_exact(fd: int, size: int) -> bytes:
    parts, left = [], size
    while left:
        data = os.read(fd, min(left, _CHUNK))
        if not data:
            raise DebugError("the flattened vmcore ends in the middle of a record")
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def reassemble(src: int, dst: int, limit: int) -> int:
    """Copy the flattened vmcore read from descriptor ``src`` (at its start) into ``dst`` as an
    ordinary kdump file; the number of records.

    :raise DebugError: when ``src`` is not a flattened vmcore, or a record lies beyond ``limit`` bytes.
    """
    head = _read_exact(src, FLAT_HEADER)
    if head[:len(FLAT_SIGNATURE)] != FLAT_SIGNATURE:
        raise DebugError("QEMU's dump is not a flattened kdump file")
    records = 0
    while True:
        offset, size = struct.unpack(">qq", _read_exact(src, 16))
        if offset == -1:
            return records
        if offset < 0 or size < 0 or offset + size > limit:
            raise DebugError(f"QEMU's dump has a record out of bounds ({size} bytes at {offset})")
        while size:
            data = _read_exact(src, min(size, _CHUNK))
            os.pwrite(dst, data, offset)
            offset += len(data)
            size -= len(data)
        records += 1


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise DebugError("the kdump file is truncated")
    return data


def note_of(fd: int) -> bytes:
    """The VMCOREINFO text of the kdump file ``fd`` (from its sub header).

    :raise DebugError: when it is not a kdump file or has no VMCOREINFO.
    """
    if _pread_exact(fd, 8, 0) != KDUMP_SIGNATURE:
        raise DebugError("not a kdump file")
    (block,) = struct.unpack("<i", _pread_exact(fd, 4, BLOCK_SIZE_OFFSET))
    if block not in (4096, 8192, 16384, 65536):
        raise DebugError(f"the kdump file has an odd block size ({block})")
    offset, size = struct.unpack("<QQ", _pread_exact(fd, 16, block + 32))
    if not 0 < size <= vmcoreinfo.MAX_NOTE:
        raise DebugError("the vmcore carries no VMCOREINFO",
                         hint="its QEMU ran without '-device vmcoreinfo', or the guest's fw_cfg driver "
                              "(qemu_fw_cfg) was not loaded")
    desc = _pread_exact(fd, size, offset).rstrip(b"\0")
    vmcoreinfo.check_text(desc)
    return desc


def _uts_field(value: bytes) -> bytes:
    return value[:UTS_FIELD - 1].ljust(UTS_FIELD, b"\0")


def set_utsname(fd: int, uts: bytes) -> None:
    """Write ``uts`` (a ``struct new_utsname``: six 65-byte fields) into the kdump header of ``fd``."""
    fields = [uts[i * UTS_FIELD:(i + 1) * UTS_FIELD].split(b"\0", 1)[0] for i in range(UTS_FIELDS)]
    os.pwrite(fd, b"".join(_uts_field(f) for f in fields), UTS_OFFSET)


def placeholder_utsname(release: str, machine: str = "x86_64") -> bytes:
    """A sane ``new_utsname`` for a header whose kernel's own cannot be read."""
    return b"".join(_uts_field(v.encode()) for v in ("Linux", "", release, "#?", machine, ""))


def uts_address(note: bytes) -> int | None:
    """Where the kernel's ``init_uts_ns.name`` is (a kernel virtual address), from VMCOREINFO."""
    f = vmcoreinfo.fields(note)
    try:
        return int(f["SYMBOL(init_uts_ns)"], 16) + int(f.get("OFFSET(uts_namespace.name)", "0"))
    except (KeyError, ValueError):
        return None
