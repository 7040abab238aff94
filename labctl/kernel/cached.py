"""Prepared kernels: ``<cache>/kernels/<key>/``, one per kernel content, shared by every lab and image.

::

    <key>/                   key: a hash of what the kernel is made of (see labctl.kernel.prepare)
        manifest.json        source (spec), release, banner, build id, sha256 of the files
        boot                 what QEMU boots: the ELF vmlinux (PVH), or a bzImage
        config               the kernel's .config (preflight, labctl kernel config)
        System.map
        modules.img          ext4 image of lib/modules/<release> (mounted read-only by the guest)
        vmlinux.debug        the kernel with DWARF (gdb, oops decoding, struct offsets), when known
        debug-modules/       modules' .ko files with debug info, when known
        initrd-<image>.img   the small initramfs for one root file system (made on first use)
        offsets.json         skb_latency's struct offsets (made on first use)

A kernel is prepared once and used read-only afterwards; switching a
lab's kernel never touches the root file system.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.paths import InDir, atomic_write, cache_dir

MANIFEST = "manifest.json"
BOOT = "boot"
CONFIG = "config"
SYSTEM_MAP = "System.map"
MODULES_IMG = "modules.img"
VMLINUX_DEBUG = "vmlinux.debug"
DEBUG_MODULES = "debug-modules"


def kernels_root() -> Path:
    return cache_dir() / "kernels"


@dataclass(frozen=True)
class Kernel:
    """A prepared kernel: its directory and manifest."""

    dir: Path
    manifest: dict[str, Any]

    @classmethod
    def at(cls, directory: Path | str) -> Kernel:
        """The kernel prepared in ``directory`` (its manifest {} when unreadable)."""
        d = Path(directory)
        try:
            manifest = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError):
            manifest = {}
        return cls(d, manifest if isinstance(manifest, dict) else {})

    @property
    def key(self) -> str:
        return self.dir.name

    @property
    def release(self) -> str:
        """``uname -r`` of the kernel."""
        return str(self.manifest.get("release", "?"))

    @property
    def source(self) -> dict[str, Any]:
        """How the lab named it (:meth:`labctl.lab.kernels.KernelSpec.to_dict`)."""
        return dict(self.manifest.get("source") or {})

    @property
    def name(self) -> str:
        """How messages name it: its Debian name, or its release and where it came from."""
        src = self.source
        if src.get("kind") == "debian":
            return str(src.get("release"))
        where = src.get("tree") or src.get("image") or "?"
        return f"{self.release} ({where})"

    boot = InDir(BOOT)
    config = InDir(CONFIG)
    system_map = InDir(SYSTEM_MAP)

    @property
    def modules_img(self) -> Path | None:
        """The modules disk, or None for a kernel without modules (everything built in). Only a
        regular file (a link, which QEMU would follow to a disk of the host's, never is)."""
        p = self.dir / MODULES_IMG
        try:
            return p if stat.S_ISREG(os.lstat(p).st_mode) else None
        except OSError:
            return None

    vmlinux_debug = InDir(VMLINUX_DEBUG)
    debug_modules = InDir(DEBUG_MODULES)

    @property
    def has_debug(self) -> bool:
        return self.vmlinux_debug.is_file()

    def keep_json(self, name: str, data: object, cache_dir: Path | None = None) -> None:
        """``data`` as JSON in the file ``name`` beside the kernel, else (its directory read-only)
        in ``cache_dir``; best effort: nothing when neither can be written."""
        for d in (self.dir, cache_dir):
            if d is None:
                continue
            try:
                atomic_write(d / name, json.dumps(data) + "\n")
                return
            except OSError:
                continue

    def initrd(self, image_key: str) -> Path:
        """Where this kernel's initramfs for the root file system ``image_key`` goes."""
        return self.dir / f"initrd-{image_key}.img"

    def summary(self) -> dict[str, Any]:
        """What a bundle's manifest and ``labctl status`` record of the kernel."""
        files = self.manifest.get("files") or {}
        return {"dir": str(self.dir), "source": self.source, "release": self.release,
                "banner": self.manifest.get("banner"), "build_id": self.manifest.get("build_id"),
                "sha256": {k: v.get("sha256") for k, v in files.items() if isinstance(v, dict)},
                "debug": self.has_debug}


class KernelStore:
    """Lists and removes prepared kernels."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or kernels_root()

    def list(self) -> list[Kernel]:
        """Every complete prepared kernel (it has a manifest)."""
        return [Kernel.at(m.parent) for m in sorted(self.root.glob(f"*/{MANIFEST}"))]

    def prune(self, keep: set[Path]) -> builtins.list[Kernel]:
        """Remove every prepared kernel whose directory is not in ``keep``, and leftovers (directories
        without a manifest: a kernel is renamed into place whole, so those are older labctls'); the
        removed ones."""
        wanted = {p.resolve() for p in keep}
        gone = [k for k in self.list() if k.dir.resolve() not in wanted]
        if self.root.is_dir():
            gone += [Kernel.at(d) for d in sorted(self.root.iterdir())
                     if d.is_dir() and not d.name.startswith(".") and not (d / MANIFEST).is_file()]
        for k in gone:
            shutil.rmtree(k.dir, ignore_errors=True)
        return gone
