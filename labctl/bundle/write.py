"""Writing a run's bundle: its directory, the manifest, the lab file and the guests' consoles.

Where each file goes is :mod:`labctl.bundle.layout`'s; the figures are
:mod:`labctl.report.run_summary`'s; the steps' raw files are copied in by the
runner (:mod:`labctl.steps`).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labctl import __version__
from labctl.bundle.layout import CONSOLE, LAB_FILE, MANIFEST, OOPS_JSON, OOPS_TXT, guest_dir
from labctl.bundle.records import CommandRecord, VmcoreRecord
from labctl.errors import UsageError
from labctl.image import MANIFEST as IMAGE_MANIFEST
from labctl.kernel import Kernel
from labctl.lab import Lab
from labctl.paths import atomic_write, checked_dir
from labctl.state import LabState

log = logging.getLogger(__name__)


def new_bundle_dir(root: Path, lab: str) -> Path:
    """A fresh ``root/<lab>-<timestamp>`` directory (suffixed if it exists).

    Made before any guest boots, so a bad ``--out`` fails at once.

    :raise UsageError: when it cannot be made (not a directory, not writable...).
    """
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        # --out may be /tmp (sticky), never a directory another user could change: the
        # bundle is made fresh there (0755 at most), so nothing in it is anyone else's.
        root = checked_dir(root, create=True, shared_ok=True, mode=0o755)
        for n in range(100):
            d = root / (f"{lab}-{stamp}" + (f"-{n}" if n else ""))
            try:
                d.mkdir(mode=0o755)
                return d
            except FileExistsError:
                continue
    except OSError as exc:
        raise UsageError(f"cannot make a bundle directory under {root}: {exc.strerror or exc}",
                         hint="pick another --out") from exc
    raise UsageError(f"cannot make a bundle directory under {root}: 100 bundles of this second exist",
                     hint="pick another --out")



def host_info() -> dict[str, Any]:
    return {"name": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "python": platform.python_version()}


def write_manifest(bundle: Path, lab: Lab, state: LabState, started: str, finished: str,
                   commands: Sequence[CommandRecord], status: str, reason: str | None,
                   vmcores: Sequence[VmcoreRecord] = ()) -> None:
    """manifest.json: what ran, on what, how it ended, and the guests' vmcores it holds
    (:func:`vmcores_note`); all of it from what the run recorded (the state, the commands), nothing
    asked of a guest or its QEMU here."""
    warnings = list(state.warnings)
    try:
        image_manifest: dict[str, Any] = json.loads((Path(state.image["dir"]) / IMAGE_MANIFEST).read_text())
    except (OSError, ValueError, KeyError):
        # The build was removed while the lab was up (a newer build prunes older ones):
        # the bundle still names the image the guests booted.
        image_manifest = {k: state.image[k] for k in ("name", "key") if state.image.get(k)}
        if image_manifest:
            warnings.append(f"the image's manifest could not be read from {state.image.get('dir')} "
                            "(the build was removed while the lab was up?): only its name and key are recorded")
    manifest = {
        "labctl_version": __version__,
        "lab": lab_section(lab),
        "image": image_manifest,
        "accel": state.accel,
        "backend": state.backend,
        "host": host_info(),
        "qemu": _qemu_section(state),
        "drivers": state.drivers,
        "vlan_offloads": state.offloads,  # guest -> NIC carrying VLANs -> its offloads, as the guest said
        # guests restored from their post-boot snapshot (warm start) instead of booted
        "started_from": {g: "snapshot" if g in state.warm else "boot" for g in state.guests},
        "networks": state.networks,
        "kernels": {g: state.kernel(g).summary() for g in state.guests if g in state.kernels},
        "warnings": warnings,
        "started_at": started,
        "finished_at": finished,
        "commands": list(commands),
        "status": status,
        "reason": reason,
        **vmcores_note(vmcores),
    }
    # 0600: the resolved lab holds every bpftrace program's text (a file's too) and the commands run
    atomic_write(bundle / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n", 0o600)


def vmcore_record(bundle: Path, rec: VmcoreRecord) -> VmcoreRecord:
    """A crash's record (:func:`labctl.inspect.capture_crash`) as summary.json keeps it: its files'
    paths relative to the bundle."""
    out = rec.copy()
    if file := rec.get("file"):
        out["file"] = Path(file).relative_to(bundle).as_posix()
    if summary := rec.get("summary_file"):
        out["summary_file"] = Path(summary).relative_to(bundle).as_posix()
    return out


def vmcores_note(vmcores: Sequence[VmcoreRecord]) -> dict[str, Any]:
    """What the manifest says of the guests' vmcores in the bundle (nothing when there is none)."""
    files = [str(v["file"]) for v in vmcores if v.get("file")]
    if not files:
        return {}
    return {"vmcores": files,
            "vmcores_note": "each holds a guest's whole memory when it crashed (readable by the run's user "
                            "only); 'labctl bundle' leaves them out unless given --with-vmcores"}


def _qemu_section(state: LabState) -> dict[str, Any]:
    """The QEMU each guest ran on, and how, as ``up`` recorded it: ``version`` is the one version
    all guests ran (this host's binary's when none answered), ``guests`` each one's."""
    versions = {g: state.emulators.get(g, "unknown") for g in state.guests}
    known = {v for v in versions.values() if v != "unknown"}
    version = known.pop() if len(known) == 1 else ("mixed" if known else state.emulator or "unknown")
    return {"version": version, "guests": versions, "argv": {n: r.argv for n, r in state.guests.items()}}


def copy_inputs(bundle: Path, lab: Lab, state: LabState) -> dict[str, list[str]]:
    """The lab file as run and each guest's console log so far, oopses decoded.

    Returns guest -> titles of the oopses found on its console.
    """
    (bundle / LAB_FILE).write_text(lab.text)
    crashes: dict[str, list[str]] = {}
    for name, rec in state.guests.items():
        titles = copy_console(bundle, name, Path(rec.console), state.kernel(name))
        if titles:
            crashes[name] = titles
    return crashes


def copy_console(bundle: Path, guest: str, console: Path, kernel: Kernel) -> list[str]:
    """One guest's console log into the bundle, its oopses decoded (``oops.txt``, ``oops.json``);
    the oopses' titles."""
    from labctl.debug import decode_console

    d = bundle / guest_dir(guest)
    d.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copy(console, d / CONSOLE)
    except OSError:
        return []
    decoded = decode_console(d / CONSOLE, kernel)
    if decoded is None:
        return []
    (d / OOPS_TXT).write_text(decoded.text)
    if decoded.json is not None:
        (d / OOPS_JSON).write_text(decoded.json)
    return decoded.titles


def lab_section(lab: Lab) -> dict[str, Any]:
    """The manifest's ``lab``: name, instance, file and its hash, the resolved definition."""
    return {"name": lab.name, "instance": lab.instance, "source": lab.source, "sha256": lab.sha256,
            "resolved": lab.to_dict()}


def write_crash_manifest(bundle: Path, lab: Mapping[str, Any], started: str, finished: str, reason: str,
                         kernels: Mapping[str, Kernel], vmcores: Sequence[VmcoreRecord] = (),
                         lab_text: str | None = None) -> None:
    """manifest.json of a bundle made for guests' crashes outside a run's steps (while the lab came
    up, during ``labctl check``): the lab (:func:`lab_section`), its kernels, why it failed, and the
    vmcores it holds; and the lab file as run, when given."""
    if lab_text is not None:
        (bundle / LAB_FILE).write_text(lab_text)
    manifest = {
        "labctl_version": __version__,
        "lab": dict(lab),
        "host": host_info(),
        "kernels": {g: k.summary() for g, k in kernels.items()},
        "started_at": started,
        "finished_at": finished,
        "commands": [],
        "status": "failed",
        "reason": reason,
        **vmcores_note(vmcores),
    }
    # 0600: the resolved lab holds every bpftrace program's text (a file's too) and the commands run
    atomic_write(bundle / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n", 0o600)
