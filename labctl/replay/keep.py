"""A run's recordings: ended, then kept in its bundle (a guest that failed) or dropped.

A kept recording is ``guests/<guest>/recording/`` in the bundle::

    replay.bin         QEMU's recording (0600)
    recording.json     what it covers and what its replay needs (:func:`manifest`)
    console.log        the guest's console up to the recording's end: what a replay prints
    fw_cfg/<name>      the files QEMU gave the guest through fw_cfg (0600): its replay reads them again

A recording reproduces the guest's whole execution, so it holds whatever the guest held: its own
SSH host key among them (the one ``fw_cfg/host_key`` gives it). That key belongs to this run's
guest only, which is gone when the run ends; it is in no other guest and in no pack.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.backends import RRFILE, GuestRecord, fw_cfg_files, qmp_execute, read_only_files
from labctl.errors import LabctlError, UsageError
from labctl.paths import InDir, atomic_write
from labctl.proc import pid_alive, run

RECORDING = "recording"
MANIFEST = "recording.json"
FW_CFG = "fw_cfg"
CONSOLE = "console.log"
FORMAT = 1


@dataclass(frozen=True)
class Kept:
    """A recording kept in a bundle."""

    guest: str
    dir: Path
    bytes: int
    icount: int
    seconds: float


def end_recording(rec: GuestRecord, timeout: float = 30.0) -> int:
    """End a recorded guest's QEMU (``quit``: the recording ends with it and its replay ends at the
    same instruction); the instruction count it ended at (0 when its monitor did not answer)."""
    icount = 0
    try:
        icount = int(qmp_execute(rec.qmp, "query-replay", timeout=10.0).get("icount", 0))
        qmp_execute(rec.qmp, "quit", timeout=10.0)
    except LabctlError:
        pass
    deadline = time.monotonic() + timeout
    while pid_alive(rec.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return icount


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def identity(path: Path) -> dict[str, Any]:
    """What a replay checks of a file it reads as it was (kernel, initrd, modules, image): its
    path, size and modification time (these files are content-keyed in labctl's cache and never
    rewritten in place)."""
    st = path.stat()
    return {"path": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def backing_file(overlay: Path) -> Path:
    """The image file a guest's overlay is on (``qemu-img info``)."""
    out = run(["qemu-img", "info", "--force-share", "--output=json", str(overlay)], timeout=30).stdout
    info = json.loads(out)
    return Path(info.get("full-backing-filename") or info["backing-filename"])


def manifest(rec: GuestRecord, lab: str, qemu: str, icount: int, started: float, rrfile: Path,
             why: str) -> dict[str, Any]:
    """The recording's manifest: QEMU's version and argv, the files its replay reads unchanged
    (identity), the recording's size and checksum, and what it covers."""
    disk = Path(rec.dir) / "disk.qcow2"
    return {
        "format": FORMAT, "lab": lab, "guest": rec.name, "qemu": qemu, "argv": rec.argv,
        "recording": {"bytes": rrfile.stat().st_size, "sha256": sha256(rrfile)},
        "covers": {"from": "the machine's reset (its boot)", "to": why, "instructions": icount,
                   "wall_seconds": round(time.time() - started, 1)},
        "reads": [identity(p) for p in read_only_files(rec.argv)],
        "image": identity(backing_file(disk)),
        "kept_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def keep(rec: GuestRecord, bundle_guest_dir: Path, lab: str, qemu: str, icount: int, started: float,
         why: str) -> Kept:
    """Copy an ended recording of ``rec`` into ``bundle_guest_dir/recording``."""
    src = Path(rec.dir)
    dest = bundle_guest_dir / RECORDING
    (dest / FW_CFG).mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(dest, 0o700)
    rrfile = src / RRFILE
    shutil.copyfile(rrfile, dest / RRFILE)
    os.chmod(dest / RRFILE, 0o600)
    shutil.copyfile(rec.console, dest / CONSOLE)
    for name, path in fw_cfg_files(rec.argv).items():
        target = dest / FW_CFG / name.rsplit("/", 1)[-1]
        shutil.copyfile(path, target)
        os.chmod(target, 0o600)
    m = manifest(rec, lab, qemu, icount, started, dest / RRFILE, why)
    atomic_write(dest / MANIFEST, json.dumps(m, indent=2) + "\n", 0o600)
    return Kept(rec.name, dest, m["recording"]["bytes"], icount, m["covers"]["wall_seconds"])


@dataclass(frozen=True)
class Recording:
    """A recording read back from a bundle, checked."""

    dir: Path
    manifest: dict[str, Any]

    rrfile = InDir(RRFILE)
    console = InDir(CONSOLE)

    @property
    def argv(self) -> list[str]:
        return [str(a) for a in self.manifest["argv"]]

    def fw_cfg(self) -> dict[str, Path]:
        return {name: self.dir / FW_CFG / name.rsplit("/", 1)[-1] for name in fw_cfg_files(self.argv)}

    @property
    def image(self) -> Path:
        return Path(self.manifest["image"]["path"])


def load(bundle: Path, guest: str, qemu: str) -> Recording:
    """The recording of ``guest`` in the run bundle ``bundle``, checked against what its replay
    needs: the recording whole (checksum), the same QEMU, the kernel, initrd, modules and image
    files as they were.

    :raise UsageError: when there is none, or it cannot be replayed here (nothing is started).
    """
    d = bundle / "guests" / guest / RECORDING
    if not (d / MANIFEST).is_file():
        kept = sorted(p.parent.parent.name for p in (bundle / "guests").glob(f"*/{RECORDING}/{MANIFEST}"))
        raise UsageError(f"{bundle}: no recording of guest {guest}",
                         hint=f"recorded guests in this run: {', '.join(kept)}" if kept else
                         "the run was not recorded (labctl run --record), or its guests passed "
                         "(--keep-recordings keeps theirs)")
    try:
        m = json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{d / MANIFEST}: unreadable ({exc})") from exc
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("argv"), list):
        raise UsageError(f"{d / MANIFEST}: not a recording manifest of this labctl")
    rec = Recording(d, m)
    want = m.get("recording", {})
    if not rec.rrfile.is_file() or rec.rrfile.stat().st_size != want.get("bytes") or sha256(rec.rrfile) != want.get("sha256"):
        raise UsageError(f"{rec.rrfile}: the recording is truncated or changed (its size or checksum "
                         "is not the one it was kept with)")
    if m.get("qemu") != qemu:
        raise UsageError(f"the recording was made by {m.get('qemu')}; this is {qemu}",
                         hint="a recording replays on the QEMU that made it")
    for f in [*m.get("reads", []), m.get("image", {})]:
        p = Path(str(f.get("path", "")))
        try:
            st = p.stat()
        except OSError:
            raise UsageError(f"the recording's replay reads {p}, which is not here",
                             hint="replay where the run's image and kernel are (labctl pack carries them)") from None
        if st.st_size != f.get("bytes") or st.st_mtime_ns != f.get("mtime_ns"):
            raise UsageError(f"{p} is not the file the recording was made with (another kernel or image)")
    for name, path in rec.fw_cfg().items():
        if not path.is_file():
            raise UsageError(f"{d}: the recording's copy of its fw_cfg file {name} is missing")
    return rec
