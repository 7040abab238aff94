"""A kernel's configuration: ``.config`` text parsed (:func:`parse_config`), and the
configuration embedded in a kernel image with ``CONFIG_IKCONFIG``
(:func:`extract_ikconfig`). What a lab needs from it is :mod:`labctl.kernel.requirements`'.
"""

from __future__ import annotations

import bz2
import lzma
import re
import struct
import zlib
from collections.abc import Iterator, Mapping

__all__ = ["KConfig", "extract_ikconfig", "parse_config"]

# --------------------------------------------------------------------------
# Reading configurations
# --------------------------------------------------------------------------

_SET = re.compile(r"CONFIG_([A-Za-z0-9_]+)=(.*)")
_UNSET = re.compile(r"# CONFIG_([A-Za-z0-9_]+) is not set")
_RELEASE = re.compile(r"# Linux/\S+ (\S+) Kernel Configuration")


def _name(option: str) -> str:
    """Option name without the ``CONFIG_`` prefix."""
    return option.removeprefix("CONFIG_")


class KConfig(Mapping[str, str]):
    """A kernel configuration: option name (without ``CONFIG_``) -> value.

    Values are as written in ``.config``: ``'y'``, ``'m'``, ``'n'`` (from
    ``# CONFIG_X is not set``), numbers as their text and strings unquoted.
    Lookups accept names with or without the ``CONFIG_`` prefix. An option
    the file does not mention was not visible (its dependencies are unmet),
    which for the helpers is the same as ``'n'``.
    """

    def __init__(self, values: Mapping[str, str], release: str | None = None) -> None:
        self._values = {_name(k): v for k, v in values.items()}
        self.release = release
        """The kernel release from the header (``# Linux/x86 6.1.0 Kernel Configuration``), if any."""

    def __getitem__(self, option: str) -> str:
        return self._values[_name(option)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"KConfig({len(self)} options, release={self.release!r})"

    def state(self, option: str) -> str:
        """The option's value, ``'n'`` when the configuration does not mention it."""
        return self._values.get(_name(option), "n")

    def builtin(self, option: str) -> bool:
        """True when ``option`` is ``y`` (built into the kernel)."""
        return self.state(option) == "y"

    def module(self, option: str) -> bool:
        """True when ``option`` is ``m`` (built as a module)."""
        return self.state(option) == "m"

    def enabled(self, option: str) -> bool:
        """True when ``option`` is ``y`` or ``m``."""
        return self.state(option) in ("y", "m")


def _unquote(value: str) -> str:
    """A ``.config`` string value without its quotes and backslash escapes."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def parse_config(text: str) -> KConfig:
    """Parse ``.config`` text (as written by Kconfig, or ``/proc/config.gz`` unpacked).

    Lines other than ``CONFIG_X=value`` and ``# CONFIG_X is not set`` are
    ignored; text with none gives an empty configuration. A later line for
    the same option wins, as in Kconfig.
    """
    values: dict[str, str] = {}
    release = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _SET.fullmatch(line):
            values[m.group(1)] = _unquote(m.group(2))
        elif m := _UNSET.fullmatch(line):
            values[m.group(1)] = "n"
        elif release is None and (m := _RELEASE.fullmatch(line)):
            release = m.group(1)
    return KConfig(values, release)


# Embedded configuration (CONFIG_IKCONFIG, kernel/configs.c): "IKCFG_ST",
# the gzip of .config, "IKCFG_ED". The marker is searched with the gzip
# magic after it, as scripts/extract-ikconfig does.
_IKCFG_START = b"IKCFG_ST\x1f\x8b\x08"
_IKCFG_END = b"IKCFG_ED"
_MAX_OUTPUT = 1 << 30  # no kernel image decompresses to more than 1 GiB
_GZIP, _XZ, _BZIP2, _LZMA = b"\x1f\x8b\x08", b"\xfd7zXZ\x00", b"BZh", b"\x5d\x00\x00"
_SCAN_LIMIT = 64  # candidate positions tried per compression format


def _gunzip(data: bytes) -> bytes | None:
    """The first gzip member of ``data`` (trailing bytes ignored), or None."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, _MAX_OUTPUT)
    except zlib.error:
        return None
    return out if d.eof else None


def _unxz(data: bytes, fmt: int = lzma.FORMAT_XZ) -> bytes | None:
    d = lzma.LZMADecompressor(format=fmt)
    try:
        out = d.decompress(data, _MAX_OUTPUT)
    except lzma.LZMAError:
        return None
    # The kernel's legacy .lzma payload declares no size: it is accepted when
    # it decompressed to an ELF, even if the stream end was not seen.
    return out if d.eof or (fmt == lzma.FORMAT_ALONE and out.startswith(b"\x7fELF")) else None


def _bunzip2(data: bytes) -> bytes | None:
    d = bz2.BZ2Decompressor()
    try:
        out = d.decompress(data, _MAX_OUTPUT)
    except (OSError, ValueError):
        return None
    return out if d.eof else None


def _decompress(data: bytes) -> bytes | None:
    """Decompress ``data`` by its magic: gzip, xz, bzip2 or legacy lzma; None otherwise."""
    if data.startswith(_GZIP):
        return _gunzip(data)
    if data.startswith(_XZ):
        return _unxz(data)
    if data.startswith(_BZIP2):
        return _bunzip2(data)
    if data.startswith(_LZMA):
        return _unxz(data, lzma.FORMAT_ALONE)
    return None  # zstd, lz4, lzo: not in the standard library


def _ikconfig_in(blob: bytes) -> str | None:
    """The configuration embedded in an uncompressed image or object, or None."""
    start = blob.find(_IKCFG_START)
    while start != -1:
        body = start + len(b"IKCFG_ST")
        end = blob.find(_IKCFG_END, body)
        text = _gunzip(blob[body:end] if end != -1 else blob[body:])
        if text is not None:
            return text.decode("utf-8", "replace")
        start = blob.find(_IKCFG_START, start + 1)
    return None


def _bzimage_payload(data: bytes) -> bytes | None:
    """The compressed kernel of an x86 bzImage, from its setup header (boot protocol >= 2.08)."""
    if len(data) < 0x250 or data[0x202:0x206] != b"HdrS":
        return None
    (version,) = struct.unpack_from("<H", data, 0x206)
    if version < 0x208:
        return None
    setup_sects = data[0x1F1] or 4
    offset, length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + offset
    payload = data[start:start + length]
    return payload if len(payload) == length and length else None


def extract_ikconfig(data: bytes) -> str | None:
    """The ``.config`` text a kernel image carries (``CONFIG_IKCONFIG``), or None.

    ``data`` may be an ELF ``vmlinux`` (or ``configs.ko`` when IKCONFIG=m),
    or a compressed image: an x86 bzImage whose payload is gzip, xz, bzip2
    or lzma (found through its setup header), or any blob holding such a
    stream (found by scanning for the formats' magic numbers, as
    ``scripts/extract-ikconfig`` does). zstd, lz4 and lzo payloads need
    decompressors the standard library lacks: such images give None, as do
    images built without IKCONFIG.
    """
    found = _ikconfig_in(data)
    if found is not None:
        return found
    payload = _bzimage_payload(data)
    if payload is not None:
        kernel = _decompress(payload)
        if kernel is not None:
            return _ikconfig_in(kernel)
    for magic in (_GZIP, _XZ, _BZIP2):
        pos = data.find(magic)
        for _ in range(_SCAN_LIMIT):
            if pos == -1:
                break
            kernel = _decompress(data[pos:])
            if kernel is not None and (found := _ikconfig_in(kernel)) is not None:
                return found
            pos = data.find(magic, pos + 1)
    return None


