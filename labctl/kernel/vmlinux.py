"""A kernel image as labctl boots it: the uncompressed ELF out of a bzImage, its version and build id.

Booting the ELF directly (PVH) skips decompression, which is slow under
TCG (kernel to init 6.2 s from a bzImage, 2.6 s from the ELF). Debian's
amd64 and rt kernels are xz-compressed; its cloud kernel is lz4, which the
standard library cannot unpack: the ``lz4`` tool is used when it is
installed, else the bzImage is booted as it is.
"""

from __future__ import annotations

import lzma
import re
import shutil
import struct
from pathlib import Path

from labctl.errors import ImageError
from labctl.proc import run

_ELF = b"\x7fELF"
_XZ_MAGIC = b"\xfd7zXZ\x00"


def extract_vmlinux(bzimage: Path, out: Path) -> None:
    """Write the uncompressed ELF kernel held in an xz-compressed bzImage.

    :raise ImageError: when no xz payload yielding an ELF is found.
    """
    data = bzimage.read_bytes()
    start = data.find(_XZ_MAGIC)
    while start != -1:
        try:
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
        except lzma.LZMAError:
            elf = b""
        if elf.startswith(b"\x7fELF"):
            out.write_bytes(elf)
            return
        start = data.find(_XZ_MAGIC, start + 1)
    raise ImageError(f"{bzimage}: no xz-compressed ELF kernel found")


_LZ4_MAGIC = b"\x02\x21\x4c\x18"  # the legacy lz4 frame the kernel's boot uses


def boot_image(kernel: Path, out: Path) -> str:
    """Write the file QEMU boots for ``kernel`` (an ELF vmlinux, or a bzImage) to ``out``.

    An ELF is copied as it is; a bzImage's xz (or, with the ``lz4`` tool,
    lz4) payload is unpacked to its ELF; anything else is copied and booted
    as a bzImage. Returns how: ``elf``, ``elf from xz``, ``elf from lz4`` or
    ``bzimage``.
    """
    head = kernel.read_bytes()[:4]
    if head == _ELF:
        shutil.copyfile(kernel, out)
        return "elf"
    try:
        extract_vmlinux(kernel, out)
        return "elf from xz"
    except ImageError:
        pass
    if shutil.which("lz4") and _unlz4(kernel, out):
        return "elf from lz4"
    shutil.copyfile(kernel, out)
    return "bzimage"


def _unlz4(bzimage: Path, out: Path) -> bool:
    """The ELF in a bzImage's lz4 payload, through the ``lz4`` tool (True when that worked)."""
    data = bzimage.read_bytes()
    start = data.find(_LZ4_MAGIC)
    if start < 0:
        return False
    payload = out.with_suffix(".lz4")
    payload.write_bytes(data[start:])
    try:
        # lz4 stops at the payload's end and complains about the trailing bytes: the ELF is whole.
        run(["lz4", "-d", "-f", "-q", str(payload), str(out)], timeout=120, check=False)
    finally:
        payload.unlink(missing_ok=True)
    return out.is_file() and out.read_bytes()[:4] == _ELF


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == _ELF


_BANNER = re.compile(rb"Linux version (\d[^\0\n]{0,400})")


def banner(path: Path) -> str | None:
    """The kernel's ``Linux version ...`` string (as ``/proc/version`` shows it), from its ELF."""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            m = _BANNER.search(chunk)
            if m:
                return "Linux version " + m.group(1).decode(errors="replace").strip()
    return None


def build_id(path: Path) -> str | None:
    """The GNU build id of an ELF kernel (hex), from its ``.note`` sections; None when it has none."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if ident[:4] != _ELF or ident[4] != 2:  # 64-bit ELF only
            return None
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", ident, 0x3A)
        f.seek(shoff)
        headers = f.read(shentsize * shnum)
        for i in range(shnum):
            sh_type, = struct.unpack_from("<I", headers, i * shentsize + 4)
            if sh_type != 7:  # SHT_NOTE
                continue
            off, size = struct.unpack_from("<QQ", headers, i * shentsize + 0x18)
            f.seek(off)
            notes = f.read(size)
            pos = 0
            while pos + 12 <= len(notes):
                namesz, descsz, ntype = struct.unpack_from("<III", notes, pos)
                name_end = pos + 12 + ((namesz + 3) & ~3)
                desc = notes[name_end:name_end + descsz]
                if ntype == 3 and notes[pos + 12:pos + 12 + namesz].rstrip(b"\0") == b"GNU":
                    return desc.hex()
                pos = name_end + ((descsz + 3) & ~3)
    return None


def has_dwarf(path: Path) -> bool:
    """True when ``path`` is a 64-bit ELF file (a module, a vmlinux) with a ``.debug_info`` section."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != _ELF or ident[4] != 2:
                return False
            shoff, = struct.unpack_from("<Q", ident, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
            f.seek(shoff)
            headers = f.read(shentsize * shnum)
            names_off, names_size = struct.unpack_from("<QQ", headers, shstrndx * shentsize + 0x18)
            f.seek(names_off)
            names = f.read(min(names_size, 1 << 20))
        for i in range(shnum):
            name_off, = struct.unpack_from("<I", headers, i * shentsize)
            if names[name_off:names.find(b"\0", name_off)] in (b".debug_info", b".zdebug_info"):
                return True
    except (OSError, struct.error):
        return False
    return False
