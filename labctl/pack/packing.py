"""Writing a packed file: a lab with its prepared kernels and its image, or a run's bundle too.

The caller prepares the lab first (:func:`labctl.pipeline.pack_lab`): what is packed is what
was prepared, byte for byte. Files are gathered as hard links in a staging directory of the
cache, indexed (size and sha256 of each), and written by ``tar | zstd -T0 -3`` into a new file
renamed into place (zstd level 3 by measurement: the default image's 1.3 GB root file system
in about 2 s to 66 MB, where gzip -1 took 9.6 s for its first 512 MB alone; see the README).
Nothing of a lab's state directory is read: no key, no host key, no token, no snapshot.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl import __version__
from labctl.errors import ProcessError, UsageError
from labctl.events import NullReporter, Reporter
from labctl.image import MANIFEST as IMAGE_MANIFEST
from labctl.image import ROOTFS, Image, sha256_file
from labctl.kernel import Kernel, kernels_root
from labctl.lab import Lab, untrusted_reason
from labctl.pack.identity import image_record, kernel_record
from labctl.pack.packfile import FORMAT, INDEX, LAB, VERSION, FileEntry, KernelRecord, PackIndex, PackIndexData
from labctl.paths import atomic_file, cache_dir
from labctl.proc import run, run_pipeline

INITRAMFS = "initramfs.cpio"
RUN_FILES = ("manifest.json", "summary.json", "lab.yaml")
TAR_ATTEMPTS = 3


@dataclass
class PackResult:
    """A packed file written: where, its size, the seconds it took, and what is in it (label -> bytes
    before compression)."""

    path: Path
    size: int
    seconds: float
    contents: dict[str, int] = field(default_factory=dict)
    index: PackIndex | None = None


def run_inputs(run_dir: Path) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """A run bundle's lab text, image (name, key) and each guest's prepared kernel directory.

    :raise UsageError: when the bundle lacks them or its kernels are no longer in the cache.
    """
    import json
    import re

    for p in (run_dir.resolve(), run_dir.resolve() / "manifest.json", run_dir.resolve() / "lab.yaml"):
        why = untrusted_reason(p)  # a bundle of another user's would name what it likes to pack
        if why is not None:
            raise UsageError(f"{run_dir}: not a run of yours to pack: {why}")
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        text = (run_dir / "lab.yaml").read_text()
    except (OSError, ValueError) as exc:
        raise UsageError(f"{run_dir}: not a run's bundle ({exc})") from exc
    kernels = {g: Path(str(k.get("dir"))) for g, k in dict(manifest.get("kernels") or {}).items()}
    store = Path(os.path.realpath(kernels_root()))
    outside = [f"{g} ({d})" for g, d in kernels.items() if Path(os.path.realpath(d)).parent != store]
    image = dict(manifest.get("image") or {})
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", str(image.get("name"))) or \
            not re.fullmatch(r"(pack-)?[0-9a-f]{16}", str(image.get("key"))):
        outside.append(f"image {image.get('name')!r} {image.get('key')!r}")
    if outside:
        raise UsageError(f"{run_dir}: its manifest names what is not in labctl's store: {', '.join(outside)}")
    gone = [f"{g} ({d})" for g, d in kernels.items() if not (d / "manifest.json").is_file()]
    if gone:
        raise UsageError(f"{run_dir}: the run's kernels are no longer prepared here: {', '.join(gone)}",
                         hint="pack the lab file instead (its kernels are prepared again)")
    return text, dict(manifest.get("image") or {}), kernels


def pack_lab(lab: Lab, image: Image, kernels: Mapping[str, Kernel], out: Path, *, with_image: bool = True,
             debug: bool = False, run_dir: Path | None = None, reporter: Reporter | None = None) -> PackResult:
    """Write ``out``: ``lab`` with each guest's prepared kernel, ``image`` (or its package list),
    and ``run_dir``'s manifest and summary when given.

    :raise UsageError: for a lab that cannot travel (a share names a host directory).
    :raise ProcessError: when tar or zstd fail.
    """
    shared = [f"{g}: {s.host}" for g, guest in lab.guests.items() for s in guest.shares]
    if shared:
        raise UsageError(f"{lab.source}: a pack carries no host directory, and the lab shares {', '.join(shared)}")
    r = reporter or NullReporter()
    t0 = time.monotonic()
    root = cache_dir() / "packs"
    root.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=root))
    try:
        contents: dict[str, int] = {}
        with r.step("gather and index (sha256 of every file)"):
            data = _stage(stage, lab, image, kernels, with_image=with_image, debug=debug, run_dir=run_dir,
                          contents=contents)
            index = PackIndex(data)
            (stage / INDEX).write_text(index.to_json())
        with r.step(f"compress into {out.name} (zstd -3)"):
            _write(stage, out, with_image)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return PackResult(out, out.stat().st_size, time.monotonic() - t0, contents, index)


def _stage(stage: Path, lab: Lab, image: Image, kernels: Mapping[str, Kernel], *, with_image: bool, debug: bool,
           run_dir: Path | None, contents: dict[str, int]) -> PackIndexData:
    _put_text(stage / LAB, lab.text)
    contents["lab file"] = len(lab.text.encode())
    guests: dict[str, KernelRecord] = {}
    for guest in lab.guests:
        kernel = kernels[guest]
        if kernel.source.get("kind") == "debian":
            guests[guest] = kernel_record(kernel, debug=debug)
            continue
        where = stage / "kernels" / kernel.key
        if not where.is_dir():
            contents[f"kernel {kernel.release}"] = _stage_kernel(kernel, where, debug)
        guests[guest] = kernel_record(kernel, commit=_commit(kernel), debug=debug)
    if run_dir is not None:
        for name in RUN_FILES:
            if (run_dir / name).is_file():
                _link(run_dir / name, stage / "run" / name)
        contents["run's manifest and summary"] = _size(stage / "run")
    if with_image:
        for name in (IMAGE_MANIFEST, INITRAMFS, ROOTFS):
            _link(image.dir / name, stage / "image" / name)
        contents[f"image {image.name}"] = _size(stage / "image")
    return {"format": FORMAT, "version": VERSION, "labctl_version": __version__,
            "made_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": {"arch": platform.machine(), "name": platform.node()},
            "lab": {"name": lab.name, "file": LAB, "source": lab.source, "sha256": lab.sha256},
            "guests": guests, "image": image_record(image, with_image),
            "run": {"dir": str(run_dir)} if run_dir else None,
            "files": _index_files(stage)}


def _stage_kernel(kernel: Kernel, where: Path, debug: bool) -> int:
    """A tree's (or loose) prepared kernel as loose files: boot, config, System.map, its modules
    (out of the modules disk, with labctl's out-of-tree ones: a tree's carry their DWARF, and are
    its debug modules where it is opened with ``debug``), and with ``debug`` its debug file."""
    for name in ("boot", "config", "System.map"):
        if (kernel.dir / name).is_file():
            _link(kernel.dir / name, where / name)
    if debug and kernel.has_debug and not os.path.samefile(kernel.vmlinux_debug, kernel.boot):
        _link(kernel.vmlinux_debug, where / "vmlinux.debug")
    img = kernel.modules_img
    if img is not None:
        mods = where / "modules" / "lib" / "modules"
        mods.mkdir(parents=True)
        run(["debugfs", "-R", f"rdump / {mods}", img], timeout=600)
        shutil.rmtree(mods / "lost+found", ignore_errors=True)
        for link in [p for p in mods.rglob("*") if p.is_symlink()]:  # a reader takes regular files only
            link.unlink()
    return _size(where)


def _commit(kernel: Kernel) -> str | None:
    """The git commit of the tree a kernel was built from (None: no tree, or not a git tree)."""
    tree = kernel.source.get("tree")
    if not tree or not (Path(tree) / ".git").exists():
        return None
    res = run(["git", "-C", tree, "rev-parse", "HEAD"], timeout=60, check=False)
    return res.stdout.decode().strip() or None if res.returncode == 0 else None


def _write(stage: Path, out: Path, with_image: bool) -> None:
    names = [INDEX, "lab", *(n for n in ("kernels", "run") if (stage / n).is_dir()), *(["image"] if with_image else [])]
    tar: list[str | os.PathLike[str]] = ["tar", "-C", stage, "--owner=0", "--group=0", "--numeric-owner", "--sort=name", "--format=gnu",
           "--hard-dereference", "-cf", "-", "--", *names]
    for attempt in range(1, TAR_ATTEMPTS + 1):
        try:
            with atomic_file(out) as f:
                run_pipeline([tar, ["zstd", "-T0", "-3", "-q", "-c"]], timeout=3600, stdout=f)
            return
        except ProcessError as exc:
            # The staged files are hard links of the cache's: another labctl (or test run) linking the same
            # image or kernel file meanwhile changes its ctime, which tar reports as a change (exit 1). Nothing
            # in the cache is written in place, and every member is checked by its digest when opened.
            if attempt == TAR_ATTEMPTS or "file changed as we read it" not in exc.output:
                raise


def _index_files(stage: Path) -> dict[str, FileEntry]:
    files: dict[str, FileEntry] = {}
    for dirpath, _dirs, names in os.walk(stage):
        for name in names:
            p = Path(dirpath, name)
            rel = p.relative_to(stage).as_posix()
            if rel != INDEX and p.is_file() and not p.is_symlink():
                files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    return dict(sorted(files.items()))


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _put_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
