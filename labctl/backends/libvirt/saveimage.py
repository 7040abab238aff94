"""libvirt's save-image header, read and rewritten for another domain (pure functions).

libvirt restores a saved machine only as the domain that saved it: the name
and UUID in the XML it keeps at the file's start must match any XML given to
``virDomainRestoreFlags``. One post-boot state can still start many
instances' domains: each gets a copy of the file whose header names it.

The layout is libvirt's ``qemu_saveimage.h`` (version 2, unchanged since
libvirt 3.x): 16 bytes of magic ``LibvirtQemudSave``, five little-endian
``uint32`` (version, ``data_len``, was_running, compression format,
``cookieOffset``), 14 unused ``uint32`` (92 bytes in all); then ``data_len``
bytes holding the domain XML and its NUL, libvirt's cookie and its NUL, and
zeros (libvirt leaves room so the XML can grow); then QEMU's migration
stream. A rewritten header keeps ``data_len``, so the stream stays where it is
and the copy is the original with its first ``92 + data_len`` bytes replaced.

What is rewritten is only a guest's identity: the instance's name in every
name and path (``labctl-<instance>-<guest>``, ``<instance>.net``), a new
UUID, and the SSH port of the management NIC. :func:`shape` says whether two
domains are otherwise the same machine (labctl's own XML for each, compared
with those taken out); only then is a state of one started as the other.
"""

from __future__ import annotations

import re
import struct
import uuid as uuidlib
from dataclasses import dataclass

MAGIC = b"LibvirtQemudSave"
VERSION = 2
HEAD = struct.Struct("<16s5I56x")  # magic, version, data_len, was_running, format, cookieOffset, unused
HEADER_SIZE = HEAD.size  # 92
READ_FIRST = 1 << 20  # what to read of a file to hold its header (libvirt pads the XML to 64 KiB or so)
_UUID = re.compile(r"<uuid>[^<]*</uuid>")
_HOSTFWD = re.compile(r"(hostfwd=tcp:127\.0\.0\.1:)(\d+)(-:22)")


class SaveImageError(ValueError):
    """Not a save image this module can rewrite (its words say why)."""


@dataclass(frozen=True)
class Header:
    """A save image's header, as read."""

    version: int
    data_len: int
    was_running: int
    format: int
    xml: str
    cookie: bytes

    @property
    def size(self) -> int:
        """Bytes from the file's start to QEMU's stream."""
        return HEADER_SIZE + self.data_len


def parse(blob: bytes) -> Header:
    """The header at the start of ``blob`` (at least :attr:`Header.size` bytes of the file).

    :raise SaveImageError: when it is not an uncompressed version-2 libvirt save image, or
        ``blob`` is too short.
    """
    if len(blob) < HEADER_SIZE:
        raise SaveImageError(f"{len(blob)} bytes: shorter than a save image's header")
    magic, version, data_len, was_running, fmt, cookie_at = HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise SaveImageError(f"not a complete libvirt save image (magic {magic!r})")
    if version != VERSION:
        raise SaveImageError(f"save image version {version}, not {VERSION}")
    if fmt != 0:
        raise SaveImageError(f"a compressed save image (format {fmt})")
    if len(blob) < HEADER_SIZE + data_len:
        raise SaveImageError(f"its header needs {HEADER_SIZE + data_len} bytes, {len(blob)} given")
    data = blob[HEADER_SIZE:HEADER_SIZE + data_len]
    if not 0 < cookie_at <= data_len or data[cookie_at - 1] != 0:
        raise SaveImageError(f"its cookie offset {cookie_at} does not follow the XML")
    xml = data[:cookie_at - 1].decode()
    cookie = data[cookie_at:].split(b"\0", 1)[0]
    return Header(version, data_len, was_running, fmt, xml, cookie)


def rewrite(header: Header, xml: str) -> bytes:
    """The first :attr:`Header.size` bytes of a copy of the image whose domain is ``xml``.

    :raise SaveImageError: when ``xml`` and the cookie do not fit in the room libvirt left.
    """
    body = xml.encode() + b"\0" + header.cookie + b"\0"
    if len(body) > header.data_len:
        raise SaveImageError(f"the new XML needs {len(body)} bytes, the image has room for {header.data_len}")
    head = HEAD.pack(MAGIC, header.version, header.data_len, header.was_running, header.format,
                     len(xml.encode()) + 1)
    return head + body + b"\0" * (header.data_len - len(body))


def shape(xml: str, ident: str) -> str:
    """``xml`` (labctl's own domain XML of an instance ``ident``) with its identity taken out:
    two guests of the same shape are the same machine, one can start from the other's state."""
    return _HOSTFWD.sub(r"\g<1>PORT\3", _UUID.sub("", xml.replace(ident, "{instance}")))


def retarget(xml: str, ident: str, new_ident: str, ssh_port: int, new_uuid: str | None = None) -> str:
    """``xml`` (a saved domain of instance ``ident``, as libvirt keeps it) as instance
    ``new_ident``'s: its names and paths, a new UUID and its SSH port.

    :raise SaveImageError: when ``xml`` does not name ``ident`` or has no SSH forward.
    """
    if f"labctl-{ident}-" not in xml:
        raise SaveImageError(f"the saved domain is not one of instance {ident}")
    if not _HOSTFWD.search(xml):
        raise SaveImageError("the saved domain has no SSH port forward")
    out = xml.replace(ident, new_ident)
    out = _UUID.sub(f"<uuid>{new_uuid or uuidlib.uuid4()}</uuid>", out, count=1)
    return _HOSTFWD.sub(rf"\g<1>{ssh_port}\3", out)
