"""``labctl capture LAB GUEST NIC [-w FILE|-]``: a live packet capture of one lab NIC.

``-w -`` streams pcapng to standard output, for ``| wireshark -k -i -`` or
``| tcpdump -r -``; ``-w FILE`` writes a file; without ``-w`` on a terminal,
one line per frame. The capture ends on Ctrl-C (or SIGTERM), when the reader
of the stream goes away, after ``-c`` frames or ``--duration`` seconds, or
when the guest stops; it always removes its QEMU filter and file.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from rich.text import Text

from labctl.backends import get_backend
from labctl.cli.link_cmd import add_nic_arguments, nic_lab
from labctl.cli.ui import console, warn
from labctl.errors import LabctlError, UsageError
from labctl.live import (
    CaptureWritten,
    capture_description,
    discard_capture,
    follow_capture,
    start_capture,
    stop_capture,
)
from labctl.net import FORMATS, Frame, summary_line
from labctl.paths import create_new


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("capture", help="capture a lab NIC's traffic live (pcapng to a file or to stdout)",
                       description="Capture the frames a lab NIC sends and receives, as QEMU sees them. "
                                   "Ends on Ctrl-C, when the reader of -w - goes away, or after -c/--duration.")
    add_nic_arguments(p)
    p.add_argument("-w", "--write", metavar="FILE", help="write the capture to FILE ('-': standard output)")
    p.add_argument("-c", "--count", type=int, metavar="N", help="stop after N frames")
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this many seconds")
    p.add_argument("--format", choices=FORMATS, default="pcapng", help="file format (default pcapng)")
    p.set_defaults(func=cmd_capture)


def _check(args: argparse.Namespace) -> None:
    if args.count is not None and args.count < 1:
        raise UsageError("-c must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be more than 0 seconds")
    if args.write is None and not sys.stdout.isatty():
        raise UsageError("say where the capture goes: -w FILE, or -w - for standard output")
    if args.write == "-" and sys.stdout.isatty():
        raise UsageError("refusing to write a binary capture to a terminal",
                         hint="pipe it (labctl capture ... -w - | tcpdump -r -) or use -w FILE")


def _reader_gone(out: BinaryIO) -> Callable[[], bool]:
    """Whether the reading end of ``out`` (a pipe) was closed: poll reports an error on it."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):
        return lambda: False
    poller = select.poll()
    poller.register(fd, 0)
    return lambda: any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def cmd_capture(args: argparse.Namespace) -> int:
    _check(args)
    state = nic_lab(args)
    backend = get_backend(state.backend)
    rec = state.guests[args.guest]
    started = time.monotonic()

    def done(written: CaptureWritten) -> bool:
        return ((args.count is not None and written.frames >= args.count)
                or (args.duration is not None and time.monotonic() - started >= args.duration))

    out, close = _output(args)
    cap = start_capture(state, backend, args.guest, args.nic, "live")
    console.print(Text(f"capturing {cap.label} of lab {state.lab}; Ctrl-C stops", style="dim"))
    written = CaptureWritten()
    how = "stopped"
    try:
        follow_capture(cap, out, done, label=cap.label, written=written,
                                 description=capture_description(state, args.guest, args.nic), fmt=args.format,
                                 alive=lambda: _alive(backend, rec),
                                 reader_gone=_reader_gone(out) if out is not None else lambda: False,
                                 on_frame=_printer() if args.write is None else None)
        if not done(written):
            how = f"guest {args.guest} stopped"
    except KeyboardInterrupt:
        how = "interrupted"
    except BrokenPipeError:
        how = "the reader went away"
        _silence_stdout()
    finally:
        for w in stop_capture(state, backend, cap):
            warn(w)
        discard_capture(state, cap)
        close()
    console.print(Text(f"{written.frames} frames ({written.bytes} bytes) from {cap.label}; {how}"))
    return 0


def _alive(backend: object, rec: object) -> bool:
    try:
        return bool(backend.alive(rec))  # type: ignore[attr-defined]
    except LabctlError:
        return False


def _output(args: argparse.Namespace) -> tuple[BinaryIO | None, Callable[[], None]]:
    """Where the capture file goes (None: one text line per frame instead), and how to close it."""
    if args.write == "-":
        return sys.stdout.buffer, lambda: None
    if args.write is None:
        return None, lambda: None
    try:
        # O_EXCL|O_NOFOLLOW in a checked directory: an existing link there is refused, never followed
        f = os.fdopen(create_new(Path(args.write)), "wb")
    except OSError as exc:
        raise UsageError(f"cannot write {args.write}: {exc.strerror or exc}") from exc
    return f, f.close


def _printer() -> Callable[[Frame], None]:
    def show(frame: Frame) -> None:
        sys.stdout.write(summary_line(frame) + "\n")
        sys.stdout.flush()
    return show


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so that Python's exit flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
