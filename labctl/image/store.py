"""The image cache: ``<cache>/images/<name>/<key>/`` with a manifest each."""

from __future__ import annotations

import builtins
import json
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.errors import ImageError
from labctl.paths import InDir, cache_dir

# An image directory's files: every name once.
MANIFEST = "manifest.json"
ROOTFS = "rootfs.img"  # raw ext4 root file system; guests boot from qcow2 overlays on it
INITRAMFS_CPIO = "initramfs.cpio"  # the image's share of every initramfs (busybox, labctl's early init)
# Inside the root file system: guest/builtins.c as a bash loadable (guest/init enables it at this path)
AGENT_BUILTINS = "/usr/lib/labctl/builtins.so"


@dataclass(frozen=True)
class Image:
    """A built image: its directory and manifest."""

    name: str
    key: str
    dir: Path
    manifest: dict[str, Any]

    # Raw ext4 root file system; guests boot from qcow2 overlays on it.
    rootfs = InDir(ROOTFS)
    initramfs_cpio = InDir(INITRAMFS_CPIO)

    @property
    def default_kernel(self) -> str:
        """The recipe's Debian kernel (``debian:6.1.0-56-amd64``): a lab's unless it names another."""
        return str(self.manifest.get("default_kernel", ""))

    @classmethod
    def at(cls, directory: Path) -> Image:
        """The image in ``directory`` (a lab state names it), with its manifest ({} when unreadable)."""
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            manifest = {}
        if not isinstance(manifest, dict):
            manifest = {}
        return cls(str(manifest.get("name", directory.parent.name)), directory.name, directory, manifest)

    @property
    def boot_args(self) -> list[str]:
        return list(self.manifest.get("boot_args", []))


class ImageStore:
    """Finds, lists and removes built images under the cache directory."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_dir() / "images"

    def path_for(self, name: str, key: str) -> Path:
        return self.root / name / key

    def get(self, name: str, key: str) -> Image | None:
        """The image built from recipe ``name`` with content ``key``, if complete."""
        d = self.path_for(name, key)
        try:
            manifest = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        return Image(name, key, d, manifest)

    def latest(self, name: str) -> Image | None:
        """The most recently built complete image of ``name``, whatever its key."""
        images = [i for i in self.list() if i.name == name]
        return max(images, key=lambda i: str(i.manifest.get("built_at", ""))) if images else None

    def list(self) -> list[Image]:
        """Every complete image in the cache."""
        out: list[Image] = []
        for m in sorted(self.root.glob(f"*/*/{MANIFEST}")):
            img = self.get(m.parent.parent.name, m.parent.name)
            if img:
                out.append(img)
        return out

    def remove(self, image: Image) -> None:
        shutil.rmtree(image.dir)

    def prune(self, name: str, keep: int = 2, in_use: Collection[Path] = ()) -> builtins.list[Image]:
        """Remove all but the ``keep`` most recent builds of recipe ``name``; the removed ones.

        Each build is about 2 GB, and a recipe edit makes a new one. A build
        that a lab which is up uses (its directory in ``in_use``, or a file of it open
        in a running QEMU, whichever state directory started it) is never removed:
        gdb, oops decoding and new overlays still need its files.
        """
        from labctl.image.recipe import load_recipe
        from labctl.proc import files_open_under

        current = load_recipe(name).key()
        builds = sorted((i for i in self.list() if i.name == name),
                        key=lambda i: (i.key == current, str(i.manifest.get("built_at", ""))), reverse=True)
        used = {Path(p).resolve() for p in in_use}
        old = [i for i in builds[keep:]  # the current build sorts first
               if i.dir.resolve() not in used and not files_open_under(i.dir)]
        for image in old:
            self.remove(image)
        return old

    def require(self, name: str) -> Image:
        """The current image for recipe ``name``.

        :raise ImageError: when it has not been built.
        """
        from labctl.image.recipe import load_recipe

        recipe = load_recipe(name)
        img = self.get(name, recipe.key())
        if img is None:
            raise ImageError(f"image '{name}' is not built (or its recipe changed)",
                             hint=f"run: labctl image build {name}")
        return img
