"""The engineer's tools on a lab page (the owner's token only): the guest's serial console as it
grows, packet captures started, stopped and downloaded as pcapng, impairments and links.

Captures run through :mod:`labctl.live.capture` exactly as ``labctl capture`` drives it: a
QEMU filter records the NIC's frames; stopping it writes them, in real time, as pcapng to a
file of the lab's run directory (``<run dir>/web-captures/<id>.pcapng``, with ``<id>.json``
beside it saying what it holds), which goes with the lab at ``down``. The server that started
a capture owns it: captures still running when it stops are stopped and saved then.

Everything here blocks (QMP, SSH, files): the application calls it from worker threads.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, cast

from labctl.backends import get_backend
from labctl.errors import LabctlError, UsageError
from labctl.lab import IMPAIR_KEYS, Impairment, nic_addresses, parse_impairment
from labctl.live import Capture, apply_impairment, lab_nic, save_capture, set_link, start_capture, stop_capture
from labctl.paths import atomic_write, ensure_private_dir
from labctl.state import LabState, load_netstate
from labctl.textsafe import safe_text

SAVED = "web-captures"
CAPTURE_ID = re.compile(r"labctl-cap-\d{1,10}-\d{1,10}")
CONSOLE_FIRST = 16 * 1024  # the console's tail a page gets first
CONSOLE_CHUNK = 64 * 1024  # the most a page gets at once after that
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def parse_impair_request(values: object) -> Impairment | None:
    """An impairment from a page's JSON (``{"delay": "20ms", "loss": "1%"}``; null or {}: none).

    :raise UsageError: naming the first bad key or value.
    """
    if values is None:
        return None
    if not isinstance(values, dict):
        raise UsageError("impair must be an object such as {\"delay\": \"20ms\", \"loss\": \"1%\"}, or null")
    unknown = [str(k) for k in values if k not in IMPAIR_KEYS]
    if unknown:
        raise UsageError(f"unknown impairment {unknown[0]!r}: use {', '.join(IMPAIR_KEYS)}")
    imp, problems = parse_impairment(values)
    if problems:
        key, message = problems[0]
        raise UsageError(f"{key}: {message}")
    return None if imp.empty else imp


def nic_of(state: LabState, guest: object, nic: object) -> tuple[str, str]:
    """``(guest, nic)`` from a page's JSON once the lab has them. :raise UsageError: otherwise."""
    if not isinstance(guest, str) or not isinstance(nic, str) or not NAME.fullmatch(guest) or not NAME.fullmatch(nic):
        raise UsageError("say which NIC: {\"guest\": NAME, \"nic\": NAME}")
    lab_nic(state, guest, nic)
    return guest, nic


class ConsoleTail:
    """A guest's console file read as it grows: text with controls escaped (the page shows it
    as text). Starts with the last :data:`CONSOLE_FIRST` bytes; a file that shrank (the guest
    was started again) is read again from its start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset: int | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.carry = ""

    def read(self) -> tuple[bool, str]:
        """``(restarted, text)``: what was added since the last call (restarted: from a new start).

        :raise OSError: when the console cannot be read.
        """
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            restarted = False
            if self.offset is None:
                self.offset = max(0, size - CONSOLE_FIRST)
                restarted = True
            elif size < self.offset:
                self.offset, restarted = 0, True
                self.decoder.reset()
                self.carry = ""
            f.seek(self.offset)
            data = f.read(CONSOLE_CHUNK)
        self.offset += len(data)
        text = self.carry + self.decoder.decode(data)
        self.carry = ""
        if text.endswith("\r"):  # may be half of a \r\n
            text, self.carry = text[:-1], "\r"
        return restarted, safe_text(text)


class CaptureStarted(TypedDict):
    """A capture the page started: its id and ``guest.nic``."""

    id: str
    label: str


class CaptureMeta(CaptureStarted):
    """A saved capture: ``saved/<id>.json`` beside its ``<id>.pcapng``."""

    guest: str
    nic: str
    started: float
    stopped: float
    frames: int
    bytes: int
    warnings: list[str]


class NicTools(TypedDict):
    """A lab NIC as the engineer's tools show it."""

    guest: str
    nic: str
    network: str
    ip: str
    link: str  # up | down
    impair: dict[str, str | int]  # Impairment.to_dict() ({} when none)
    impair_text: str
    capture: str  # the running capture's id ('' when none) and when it started
    capture_started: float


class ToolsView(TypedDict):
    nics: list[NicTools]
    captures: list[CaptureMeta]


@dataclass
class Running:
    ident: str
    cap: Capture
    started: float = field(default_factory=time.time)


class Tools:
    """The captures this server runs, and the actions on a lab's network."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, Running] = {}

    # -- captures ------------------------------------------------------------------------------

    def start_capture(self, ident: str, guest: object, nic: object) -> CaptureStarted:
        """Start capturing a NIC of lab ``ident``. :raise UsageError: for an unknown NIC, or
        one this server captures already. :raise LabctlError: when QEMU refuses."""
        state = LabState.load(ident)
        g, n = nic_of(state, guest, nic)
        with self.lock:
            if any(r.ident == ident and r.cap.guest == g and r.cap.nic == n for r in self.running.values()):
                raise UsageError(f"{g}.{n} is being captured already")
        cap = start_capture(state, get_backend(state.backend), g, n, "web")
        with self.lock:
            self.running[cap.id] = Running(ident, cap)
        return {"id": cap.id, "label": cap.label}

    def stop_capture(self, ident: str, cid: str) -> CaptureMeta:
        """Stop a capture this server runs on ``ident`` and save it as pcapng in the run directory.

        :raise UsageError: when there is no such capture.
        """
        with self.lock:
            run = self.running.get(cid)
            if run is None or run.ident != ident:
                raise UsageError(f"no capture {cid} is running on {ident}")
            del self.running[cid]
        return self._save(run)

    def _save(self, run: Running) -> CaptureMeta:
        state = LabState.load(run.ident)
        cap = run.cap
        warnings = stop_capture(state, get_backend(state.backend), cap)
        d = ensure_private_dir(state.path / SAVED)
        written, more = save_capture(state, cap, d / f"{cap.id}.pcapng")
        meta: CaptureMeta = {"id": cap.id, "label": cap.label, "guest": cap.guest, "nic": cap.nic,
                             "started": run.started, "stopped": time.time(), "frames": written.frames,
                             "bytes": written.bytes, "warnings": [safe_text(w) for w in dict.fromkeys(warnings + more)]}
        atomic_write(d / f"{cap.id}.json", json.dumps(meta) + "\n", 0o600)
        return meta

    def stop_all(self) -> None:
        """Stop and save every capture this server runs (it is stopping)."""
        with self.lock:
            runs = list(self.running.values())
            self.running.clear()
        for run in runs:
            try:
                self._save(run)
            except (LabctlError, OSError):
                pass

    def saved(self, ident: str) -> list[CaptureMeta]:
        """The captures saved in lab ``ident``'s run directory, newest first."""
        try:
            d = LabState.load(ident).path / SAVED
        except LabctlError:
            return []
        out = []
        for p in d.glob("*.json") if d.is_dir() else []:
            try:
                meta = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(meta, dict) and CAPTURE_ID.fullmatch(str(meta.get("id"))) and (d / f"{meta['id']}.pcapng").is_file():
                out.append(cast(CaptureMeta, meta))  # as _save wrote it
        return sorted(out, key=lambda m: -float(m.get("stopped", 0)))

    def capture_file(self, ident: str, cid: str) -> tuple[Path, CaptureMeta]:
        """A saved capture's file and what it holds. :raise UsageError: when there is none."""
        if not CAPTURE_ID.fullmatch(cid):
            raise UsageError(f"no capture {cid!r}")
        for meta in self.saved(ident):
            if meta["id"] == cid:
                return LabState.load(ident).path / SAVED / f"{cid}.pcapng", meta
        raise UsageError(f"no capture {cid} is saved in {ident}")

    # -- impairments and links -----------------------------------------------------------------

    @staticmethod
    def impair(ident: str, guest: object, nic: object, values: object) -> Impairment | None:
        """Put an impairment in force (None: clear it). :raise UsageError, GuestError."""
        imp = parse_impair_request(values)
        state = LabState.load(ident)
        g, n = nic_of(state, guest, nic)
        apply_impairment(state, g, n, imp)
        return imp

    @staticmethod
    def link(ident: str, guest: object, nic: object, up: object) -> None:
        """Take a NIC's link up or down. :raise UsageError, MachineError."""
        if not isinstance(up, bool):
            raise UsageError("say {\"up\": true} or {\"up\": false}")
        state = LabState.load(ident)
        g, n = nic_of(state, guest, nic)
        set_link(state, g, n, up)

    # -- the view ------------------------------------------------------------------------------

    def view(self, ident: str) -> ToolsView:
        """Every lab NIC with its link, impairment and running capture; the saved captures."""
        try:
            state = LabState.load(ident)
        except LabctlError:
            return {"nics": [], "captures": []}
        record = load_netstate(state.path)
        with self.lock:
            running = {(r.cap.guest, r.cap.nic): (cid, r.started) for cid, r in self.running.items()
                       if r.ident == ident}
        nics: list[NicTools] = []
        for gname, g in (state.resolved.get("guests") or {}).items():
            for n in g.get("nics") or []:
                imp = record.impairment(gname, n["name"])
                cap = running.get((gname, n["name"]))
                nics.append({"guest": gname, "nic": n["name"], "network": n.get("network", ""),
                             "ip": ", ".join(nic_addresses(n)), "link": "up" if record.link_up(gname, n["name"]) else "down",
                             "impair": imp.to_dict() if imp else {}, "impair_text": imp.describe() if imp else "",
                             "capture": cap[0] if cap else "", "capture_started": cap[1] if cap else 0})
        return {"nics": nics, "captures": self.saved(ident)}
