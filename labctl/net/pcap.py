"""Packet captures: reading what QEMU's ``filter-dump`` writes, writing pcapng (and pcap).

QEMU writes classic pcap (microseconds, its own byte order, link type
Ethernet) with record timestamps of ``start_ts + vm_clock``: the second
the filter was created plus the guest's virtual clock, which counts from
the machine's start and stands still while it is paused. :class:`Retimer`
shifts them to real time (see :mod:`labctl.live.capture` for how the shift is
measured).

labctl hands out pcapng: one section, one interface named after the NIC
(``a.eth1``) with a description (model, network), the frames as Enhanced
Packet Blocks. Wireshark, tshark and ``tcpdump -r`` read it. Everything here
is pure: bytes in, bytes out; :class:`PcapReader` takes a file's bytes in
any pieces (a file still being written) and gives back whole frames only.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from labctl import __version__

PCAP_HEADER = 24
RECORD_HEADER = 16
PCAP_MAGIC = 0xA1B2C3D4  # microsecond timestamps
PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
SNAPLEN = 65535

_SHB = 0x0A0D0D0A
_IDB = 0x00000001
_EPB = 0x00000006
_BYTE_ORDER = 0x1A2B3C4D
_OPT_END, _OPT_COMMENT = 0, 1
_SHB_USERAPPL = 4
_IF_NAME, _IF_DESCRIPTION, _IF_TSRESOL = 2, 3, 9


class PcapError(ValueError):
    """Bytes that are not a pcap file labctl can read."""


@dataclass(frozen=True)
class Frame:
    """One captured frame: when (microseconds since the epoch), its bytes (maybe cut) and its length on the wire."""

    ts_us: int
    data: bytes
    length: int


class PcapReader:
    """Whole frames from a pcap byte stream fed in pieces (the global header first)."""

    def __init__(self) -> None:
        self._buf = b""
        self.endian: str | None = None
        self.nanoseconds = False
        self.snaplen = SNAPLEN
        self.linktype = LINKTYPE_ETHERNET
        self.frames = 0

    def feed(self, data: bytes) -> list[Frame]:
        """The frames that ``data`` completes (a partial record waits for the next piece).

        :raise PcapError: when the header is not a pcap header.
        """
        self._buf += data
        out: list[Frame] = []
        if self.endian is None:
            if len(self._buf) < PCAP_HEADER:
                return out
            self._header(self._buf[:PCAP_HEADER])
            self._buf = self._buf[PCAP_HEADER:]
        pos, buf, endian = 0, self._buf, self.endian
        assert endian is not None  # set by _header above
        while len(buf) - pos >= RECORD_HEADER:
            sec, frac, caplen, length = struct.unpack_from(endian + "IIII", buf, pos)
            if caplen > max(self.snaplen, SNAPLEN) + 64:
                raise PcapError(f"record of {caplen} bytes (snaplen {self.snaplen}): not a pcap stream")
            if len(buf) - pos - RECORD_HEADER < caplen:
                break
            start = pos + RECORD_HEADER
            us = sec * 1_000_000 + (frac // 1000 if self.nanoseconds else frac)
            out.append(Frame(us, buf[start:start + caplen], length))
            pos = start + caplen
        self._buf = buf[pos:]
        self.frames += len(out)
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete record held back."""
        return len(self._buf)

    def _header(self, head: bytes) -> None:
        for endian in ("<", ">"):
            magic = struct.unpack(endian + "I", head[:4])[0]
            if magic in (PCAP_MAGIC, PCAP_MAGIC_NS):
                self.endian, self.nanoseconds = endian, magic == PCAP_MAGIC_NS
                _, _, _, _, snaplen, linktype = struct.unpack(endian + "HHiIII", head[4:])
                self.snaplen, self.linktype = snaplen or SNAPLEN, linktype
                return
        raise PcapError("not a pcap file (bad magic number)")


@dataclass(frozen=True)
class Retimer:
    """Real time of QEMU's timestamps: ``real = raw - shift_us`` (shift None: kept as QEMU wrote them)."""

    shift_us: int | None

    def __call__(self, frame: Frame) -> Frame:
        if self.shift_us is None:
            return frame
        return Frame(frame.ts_us - self.shift_us, frame.data, frame.length)


_ETHERTYPES = {0x0800: "IPv4", 0x0806: "ARP", 0x86DD: "IPv6", 0x8100: "802.1Q", 0x8035: "RARP"}
_PROTOS = {1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6"}


def _mac(b: bytes) -> str:
    return ":".join(f"{x:02x}" for x in b)


def summary_line(frame: Frame) -> str:
    """One line for a frame: time, MAC addresses, EtherType, length (and IPv4 addresses and protocol)."""
    t = time.strftime("%H:%M:%S", time.localtime(frame.ts_us // 1_000_000)) + f".{frame.ts_us % 1_000_000:06d}"
    d = frame.data
    if len(d) < 14:
        return f"{t} runt frame of {frame.length} bytes"
    etype = struct.unpack_from("!H", d, 12)[0]
    line = f"{t} {_mac(d[6:12])} > {_mac(d[0:6])} {_ETHERTYPES.get(etype, f'0x{etype:04x}')} {frame.length}"
    if etype == 0x0800 and len(d) >= 34:
        proto, src, dst = d[23], d[26:30], d[30:34]
        frag = struct.unpack_from("!H", d, 20)[0]
        line += f": {'.'.join(map(str, src))} > {'.'.join(map(str, dst))} {_PROTOS.get(proto, f'proto {proto}')}"
        if frag & 0x3FFF:
            line += f" fragment offset {(frag & 0x1FFF) * 8}{' (more)' if frag & 0x2000 else ''}"
    return line


# --------------------------------------------------------------------------- pcapng

def _option(code: int, value: bytes) -> bytes:
    pad = (-len(value)) % 4
    return struct.pack("<HH", code, len(value)) + value + b"\0" * pad


def _block(kind: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("<II", kind, total) + body + struct.pack("<I", total)


def _text(value: str) -> bytes:
    return value.encode("utf-8", errors="replace")


def pcapng_header(if_name: str, description: str = "", snaplen: int = SNAPLEN,
                  linktype: int = LINKTYPE_ETHERNET) -> bytes:
    """A Section Header Block (written by labctl) and one Interface Description Block
    named ``if_name``, microsecond timestamps."""
    shb_opts = _option(_SHB_USERAPPL, _text(f"labctl {__version__}")) + _option(_OPT_END, b"")
    shb = _block(_SHB, struct.pack("<IHHq", _BYTE_ORDER, 1, 0, -1) + shb_opts)
    idb_opts = _option(_IF_NAME, _text(if_name))
    if description:
        idb_opts += _option(_IF_DESCRIPTION, _text(description))
    idb_opts += _option(_IF_TSRESOL, b"\x06") + _option(_OPT_END, b"")
    idb = _block(_IDB, struct.pack("<HHI", linktype, 0, snaplen) + idb_opts)
    return shb + idb


def pcapng_frame(frame: Frame) -> bytes:
    """One Enhanced Packet Block on interface 0."""
    ts = max(frame.ts_us, 0)
    head = struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(frame.data), frame.length)
    return _block(_EPB, head + frame.data + b"\0" * ((-len(frame.data)) % 4))


def pcap_header(snaplen: int = SNAPLEN, linktype: int = LINKTYPE_ETHERNET) -> bytes:
    """A classic pcap global header (little-endian, microseconds)."""
    return struct.pack("<IHHiIII", PCAP_MAGIC, 2, 4, 0, 0, snaplen, linktype)


def pcap_frame(frame: Frame) -> bytes:
    """One classic pcap record."""
    ts = max(frame.ts_us, 0)
    return struct.pack("<IIII", ts // 1_000_000, ts % 1_000_000, len(frame.data), frame.length) + frame.data


FORMATS = ("pcapng", "pcap")


@dataclass(frozen=True)
class Writer:
    """Bytes of a capture file in ``fmt`` (one of :data:`FORMATS`); pcap has no interface name."""

    fmt: str = "pcapng"

    def header(self, if_name: str, description: str = "", snaplen: int = SNAPLEN) -> bytes:
        if self.fmt == "pcap":
            return pcap_header(snaplen)
        return pcapng_header(if_name, description, snaplen)

    def frame(self, frame: Frame) -> bytes:
        return pcap_frame(frame) if self.fmt == "pcap" else pcapng_frame(frame)


@dataclass(frozen=True)
class NgFrame:
    """A frame read back from a pcapng file, with its interface's name."""

    interface: str
    ts_us: int
    caplen: int
    length: int


def read_pcapng(path: Path) -> Iterator[NgFrame]:
    """The frames of a pcapng file labctl wrote (one section, little-endian, microseconds).

    :raise PcapError: for anything else or a truncated file. :raise OSError: when it cannot be read.
    """
    data = path.read_bytes()
    pos = 0
    names: list[str] = []
    while pos < len(data):
        if len(data) - pos < 12:
            raise PcapError(f"{path}: truncated block at byte {pos}")
        kind, total = struct.unpack_from("<II", data, pos)
        if total < 12 or pos + total > len(data):
            raise PcapError(f"{path}: bad block length at byte {pos}")
        body = data[pos + 8:pos + total - 4]
        if kind == _SHB and struct.unpack_from("<I", body)[0] != _BYTE_ORDER:
            raise PcapError(f"{path}: not a little-endian pcapng section")
        if kind == _IDB:
            names.append(_if_name(body[8:]) or f"if{len(names)}")
        elif kind == _EPB:
            iface, hi, lo, caplen, length = struct.unpack_from("<IIIII", body)
            yield NgFrame(names[iface] if iface < len(names) else f"if{iface}", (hi << 32) | lo, caplen, length)
        pos += total


def _if_name(opts: bytes) -> str | None:
    pos = 0
    while pos + 4 <= len(opts):
        code, length = struct.unpack_from("<HH", opts, pos)
        if code == _OPT_END:
            return None
        if code == _IF_NAME:
            return opts[pos + 4:pos + 4 + length].decode("utf-8", errors="replace")
        pos += 4 + length + ((-length) % 4)
    return None
