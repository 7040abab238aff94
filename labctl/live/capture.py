"""Packet capture on a lab NIC: QEMU's ``filter-dump`` on the NIC's netdev, added and removed through QMP.

Why there: the filter sits between the NIC model and its link, so it sees
every frame the NIC sends and every frame that reaches it (also those the
NIC's MAC filter then drops), on a direct unix-dgram link, a switched
network or a UDP tunnel alike, on either backend, without touching the
guest. QEMU writes the frames to a file in a directory only the lab's owner
and QEMU's user reach (:meth:`Backend.capture_dir`); writing never waits
for a reader, so a slow reader cannot stall the guest, and labctl reads
the file as it grows (live capture) or once the step is over.

Lifecycle: every capture is recorded in ``<run dir>/captures/<id>.json``
(its QEMU object, file and owner's pid) *before* its filter is added.
:func:`stop` removes the filter, then the record. A labctl killed while
capturing leaves a record whose owner is dead; :func:`reap` (run by the
next capture and by every step run) removes that filter and its file, and
``down`` removes everything with the lab.

Timestamps: QEMU stamps a frame with the second the filter was created plus
the guest's virtual clock (:mod:`labctl.net.vmclock`), which is wrong by the
guest's uptime. The filter is added within one wall-clock second (QEMU's
second is known then), the virtual clock is read once through the monitor,
and every frame is shifted to real time (:class:`labctl.net.pcap.Retimer`).
A guest paused during the capture shifts the frames after the pause; that
is measured at the end and said.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import labctl.live.netctl as netctl  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import Backend, GuestRecord
from labctl.errors import LabctlError, MachineError
from labctl.lab import nic_addresses
from labctl.net import SNAPLEN, Frame, PcapError, PcapReader, Retimer, VmClockError, Writer, sample_vmclock
from labctl.paths import atomic_write, ensure_private_dir
from labctl.proc import pid_alive
from labctl.state import CAPTURES, LabState, active_captures
from labctl.state import Capture as Capture  # noqa: PLC0414 - the record is the state's (status reads it)

active = active_captures  # the captures recorded for a lab: the state's (status reads them)

log = logging.getLogger(__name__)

PREFIX = "labctl-cap"
WRITE_ERROR = "network dump write error"  # QEMU's message when the filter stops writing
ZONE = 900  # time zone offsets are whole quarters of an hour
CHUNK = 1 << 20
PAUSE_US = 250_000  # clock readings differ by a few ms (monitor round trips); a pause (gdb) by seconds
_SEQ = itertools.count(1)


def _registry(state: LabState) -> Path:
    return ensure_private_dir(state.path / CAPTURES)


def _save(state: LabState, cap: Capture) -> None:
    atomic_write(_registry(state) / f"{cap.id}.json", json.dumps(asdict(cap), indent=2) + "\n", 0o600)


def _hmp(backend: Backend, rec: GuestRecord) -> Callable[[str], str]:
    return lambda line: str(backend.qmp(rec, "human-monitor-command", {"command-line": line}))


def _qemu_start_second(wall: float) -> int:
    """The ``start_ts`` QEMU's dump code computes: ``mktime(gmtime(now))`` (local-time confusion included)."""
    return int(time.mktime(time.gmtime(int(wall))))


def start(state: LabState, backend: Backend, guest: str, nic: str, purpose: str = "live",
          maxlen: int = SNAPLEN) -> Capture:
    """Start capturing ``guest.nic`` (the first ``maxlen`` bytes of each frame): recorded, filter added,
    timestamps calibrated.

    :raise UsageError: for an unknown NIC. :raise HostError: when the guest runs where labctl
        cannot read captures. :raise MachineError: when QEMU refuses the filter.
    """
    reap(state, backend)
    netdev = netctl.netdev(state, guest, nic)
    rec = state.guests[guest]
    cid = f"{PREFIX}-{os.getpid()}-{next(_SEQ)}"
    qlog = backend.qemu_log(rec)
    cap = Capture(cid, guest, nic, netdev, str(backend.capture_dir(rec) / f"{cid}.pcap"), os.getpid(), purpose,
                  log=str(qlog) if qlog else None, log_offset=_size(qlog))
    _save(state, cap)  # recorded before QEMU has anything to remove
    args = {"qom-type": "filter-dump", "id": cid, "netdev": netdev, "file": cap.file, "maxlen": maxlen}
    try:
        for attempt in range(5):  # QEMU's second must be known: add the filter within one wall-clock second
            t0 = time.time()
            backend.qmp(rec, "object-add", args)
            t1 = time.time()
            if int(t0) == int(t1):
                break
            if attempt == 4:  # keep the last filter; its second is one of two
                cap.notes.append(f"{cap.label}: the capture's filter took {t1 - t0:.1f} s to add (a busy host); "
                                 "its timestamps may be off by up to that much")
                break
            backend.qmp(rec, "object-del", {"id": cid})
        cap.started, cap.second = t1, int(t0)
        cap.shift_us, note = _calibrate(backend, rec, cap.second)
    except BaseException:
        _remove(state, backend, cap)
        raise
    if note:
        cap.notes.append(note)
    _save(state, cap)
    return cap


def _calibrate(backend: Backend, rec: GuestRecord, second: int) -> tuple[int | None, str | None]:
    """QEMU's timestamp minus the real time, for a filter added in wall-clock second ``second``."""
    try:
        clock = sample_vmclock(_hmp(backend, rec))
    except (VmClockError, MachineError) as exc:
        return None, (f"timestamps are QEMU's own (the filter's start second plus the guest's uptime): "
                      f"its virtual clock could not be read ({getattr(exc, 'message', exc)})")
    return round((_qemu_start_second(second) - clock.origin) * 1e6), None


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0


def stop(state: LabState, backend: Backend, cap: Capture) -> list[str]:
    """Remove the capture's filter (its file stays for :func:`save`); what went wrong, as warnings."""
    warnings = list(cap.notes)
    rec = state.guests.get(cap.guest)
    if rec is not None and cap.shift_us is not None:
        try:
            later = _calibrate(backend, rec, cap.second or int(cap.started))[0]  # records written before 'second'
            if later is not None and abs(later - cap.shift_us) > PAUSE_US:
                warnings.append(f"{cap.label}: the guest was paused for {abs(later - cap.shift_us) / 1e6:.3f} s "
                                "during the capture; frames after the pause are stamped that much too early")
        except LabctlError:
            pass
    try:
        if rec is not None:
            backend.qmp(rec, "object-del", {"id": cap.id})
    except LabctlError as exc:
        warnings.append(f"{cap.label}: the capture could not be stopped cleanly: {exc.message}")
    if cap.log:
        warnings += _write_errors(Path(cap.log), cap.log_offset, cap.label)
    (state.path / CAPTURES / f"{cap.id}.json").unlink(missing_ok=True)
    return warnings


def _write_errors(path: Path, offset: int, label: str) -> list[str]:
    """QEMU's "network dump write error" since ``offset``: the filter stopped writing, frames are missing."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return []
    if WRITE_ERROR not in text:
        return []
    return [(f"{label}: QEMU could not write the capture ({WRITE_ERROR}, disk full?): it stopped there "
             "and every later frame is missing")]


def _remove(state: LabState, backend: Backend, cap: Capture) -> None:
    """Stop and forget a capture entirely: filter, file, record."""
    rec = state.guests.get(cap.guest)
    if rec is not None:
        try:
            backend.qmp(rec, "object-del", {"id": cap.id})
        except LabctlError:
            pass  # never added, or its QEMU is gone
    discard(state, cap)


def discard(state: LabState, cap: Capture) -> None:
    """Remove the capture's file and record."""
    cap.path.unlink(missing_ok=True)
    (state.path / CAPTURES / f"{cap.id}.json").unlink(missing_ok=True)


def reap(state: LabState, backend: Backend) -> list[str]:
    """Remove the captures whose labctl died (killed before it could stop them); their labels."""
    gone = [c for c in active(state) if not pid_alive(c.owner)]
    for cap in gone:
        log.info("removing capture %s of %s: its labctl (pid %d) is gone", cap.id, cap.label, cap.owner)
        _remove(state, backend, cap)
    return [c.label for c in gone]


# --------------------------------------------------------------------------- reading

@dataclass
class Written:
    """What a capture file holds: frames, bytes on the wire, first and last time (µs)."""

    frames: int = 0
    bytes: int = 0
    first_us: int | None = None
    last_us: int | None = None

    def add(self, frame: Frame) -> None:
        self.frames += 1
        self.bytes += frame.length
        self.first_us = frame.ts_us if self.first_us is None else self.first_us
        self.last_us = frame.ts_us


class _Stream:
    """QEMU's pcap bytes in, real-time frames out, the time zone checked on the first frame."""

    def __init__(self, cap: Capture) -> None:
        self.cap = cap
        self.reader = PcapReader()
        self.retime = Retimer(cap.shift_us)
        self.checked = cap.shift_us is None

    def frames(self, data: bytes) -> list[Frame]:
        raw = self.reader.feed(data)
        if raw and not self.checked:
            self._check_zone(raw[0])
        return [self.retime(f) for f in raw]

    def _check_zone(self, first_raw: Frame) -> None:
        """A first frame stamped whole quarters of an hour off: QEMU's time zone differs from ours."""
        self.checked = True
        t, lo, hi = self.retime(first_raw).ts_us / 1e6, self.cap.started - 2, time.time() + 2
        if lo <= t <= hi:
            return
        k = round((t - self.cap.started) / ZONE)
        if k and lo <= t - k * ZONE <= hi:
            assert self.cap.shift_us is not None
            self.retime = Retimer(self.cap.shift_us + k * ZONE * 1_000_000)
            self.cap.notes.append(f"{self.cap.label}: QEMU's time zone differs from labctl's by {k * ZONE} s; "
                                  "timestamps corrected")
        else:
            self.cap.notes.append(f"{self.cap.label}: the first frame is stamped {t - self.cap.started:+.3f} s "
                                  "from the capture's start; timestamps may be off")


class Tail:
    """A running capture's frames in real time, read as QEMU writes them, piece by piece (``labctl
    follow``'s wire): each :meth:`read` returns the whole frames written since the last."""

    def __init__(self, cap: Capture) -> None:
        self.cap, self.stream, self.pos = cap, _Stream(cap), 0

    def read(self, limit: int = 64 * CHUNK) -> list[Frame]:
        try:
            with open(self.cap.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(limit)
        except FileNotFoundError:
            return []
        self.pos += len(data)
        try:
            return self.stream.frames(data)
        except PcapError:
            return []


def description(state: LabState, guest: str, nic: str) -> str:
    """``e1000 on network lan, 10.0.0.1/24, fd00::1/64, VLANs 10, 20`` for a capture file's interface."""
    n = netctl.lab_nic(state, guest, nic)
    vlans = [str(v.get("id")) for v in n.get("vlans") or [] if isinstance(v, dict)]
    return (f"{n['model']} on network {n['network']}" + "".join(f", {a}" for a in nic_addresses(n))
            + (f", VLANs {', '.join(vlans)}" if vlans else ""))


def save(state: LabState, cap: Capture, dest: Path, fmt: str = "pcapng") -> tuple[Written, list[str]]:
    """Write the stopped capture's frames, in real time, to ``dest``; the capture's file is removed.

    :raise OSError: when ``dest`` cannot be written.
    """
    writer, stream, written = Writer(fmt), _Stream(cap), Written()
    warnings: list[str] = []
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(writer.header(cap.label, description(state, cap.guest, cap.nic)))
            for frame in _file_frames(cap, stream, warnings):
                written.add(frame)
                out.write(writer.frame(frame))
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
        discard(state, cap)
    return written, warnings + [n for n in cap.notes if n not in warnings]


def _file_frames(cap: Capture, stream: _Stream, warnings: list[str]) -> Iterator[Frame]:
    try:
        with open(cap.path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield from stream.frames(chunk)
    except FileNotFoundError:
        warnings.append(f"{cap.label}: QEMU wrote no capture file")
        return
    except PcapError as exc:
        warnings.append(f"{cap.label}: the capture file is damaged: {exc}")
        return
    if stream.reader.pending:
        warnings.append(f"{cap.label}: the capture ends in {stream.reader.pending} bytes of an incomplete frame "
                        "(QEMU stopped writing in the middle of it)")


def follow(cap: Capture, out: BinaryIO | None, stop_when: Callable[[Written], bool], *, label: str,
           description: str, fmt: str = "pcapng", poll: float = 0.05,
           alive: Callable[[], bool] = lambda: True, reader_gone: Callable[[], bool] = lambda: False,
           on_frame: Callable[[Frame], None] | None = None, written: Written | None = None) -> Written:
    """Copy the capture to ``out`` (None: nowhere) as QEMU writes it, each frame also to
    ``on_frame``, until ``stop_when(written)`` is true or the guest is gone (``alive``, asked
    every second). Writes are flushed batch by batch; while nothing arrives, ``reader_gone``
    is asked whether the reader of ``out`` left. On Ctrl-C (KeyboardInterrupt, raised again)
    the frames QEMU had written are copied first. ``written`` (counted into) says how far it got
    even when it ends in an exception.

    :raise BrokenPipeError: when the reader of ``out`` went away.
    """
    writer, stream = Writer(fmt), _Stream(cap)
    written = written if written is not None else Written()
    if out is not None:
        out.write(writer.header(label, description))
        out.flush()

    def take(chunk: bytes) -> None:
        frames = stream.frames(chunk)
        for frame in frames:
            written.add(frame)
            if out is not None:
                out.write(writer.frame(frame))
            if on_frame is not None:
                on_frame(frame)
            if stop_when(written):
                break
        if frames and out is not None:
            out.flush()

    idle = 0
    with open(cap.path, "rb") as f:
        try:
            while not stop_when(written):
                chunk = f.read(CHUNK)
                if chunk:
                    take(chunk)
                    continue
                if reader_gone():
                    raise BrokenPipeError("the reader of the capture went away")
                idle += 1
                if idle % max(1, round(1 / poll)) == 0 and not alive():
                    break
                time.sleep(poll)
        except KeyboardInterrupt:
            # Ctrl-C stops the capture, not what it caught: the frames QEMU wrote before it (still
            # unread, between two polls) are copied too, as tcpdump writes what it buffered
            while not stop_when(written) and (chunk := f.read(CHUNK)):
                take(chunk)
            raise
    return written
