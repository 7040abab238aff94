"""Reading a packed file back: whole and as indexed, or refused before anything starts.

:func:`open_pack` first has zstd test the whole file (a truncated or damaged file is refused
with zstd's reason), then unpacks it once into ``<cache>/packs/<digest>/`` (the file's sha256;
a second ``up`` of the same file reuses it): the first member must be the index, every other
one a regular file the index names, under the layout's directories only, with the size and
sha256 it gives; a member missing, extra, of another kind or another digest refuses the file.
Long runs of zeros are written as holes (the root file system is mostly sparse). The packed
image, if any, goes into the image cache under a key of its own (``pack-<digest>``); its lab,
with each guest's kernel replaced by the packed one, is :meth:`Opened.lab`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from labctl.errors import LabctlError, UsageError
from labctl.events import NullReporter, Reporter
from labctl.image import MANIFEST as IMAGE_MANIFEST
from labctl.image import Image, ImageStore, sha256_file
from labctl.lab import KERNEL_FILES, KernelSpec, Lab, debian_kernel, load_lab_text
from labctl.pack.cache import pin
from labctl.pack.fetch import check_foreign
from labctl.pack.identity import Pinned, check_host
from labctl.pack.packfile import INDEX, LAB, MAX_INDEX, UNPACKED, PackIndex, member_ok
from labctl.paths import build_into, cache_dir, exclusive
from labctl.proc import kill_group, run, start_piped

CHUNK = 1 << 20
RUN = "run"


@dataclass(frozen=True)
class Opened:
    """A packed file unpacked here."""

    pinned: Pinned

    @property
    def index(self) -> PackIndex:
        return self.pinned.index

    @property
    def dir(self) -> Path:
        return self.pinned.dir

    def lab(self) -> Lab:
        """The packed lab, each guest on its packed kernel: held to a stranger's lab file's rules
        (:func:`~labctl.pack.fetch.check_foreign`: no share, no selftests' tree, no bpftrace file;
        its kernels are the pack's own), refused before any file it names is read.

        :raise LabFileError: for a lab file labctl refuses. :raise UsageError: for a packed lab that
            names a host path (a share, a tree, a file).
        """
        text = (self.dir / LAB).read_text()
        lab = load_lab_text(text, str(self.dir / LAB), remote=self.pinned.source)
        shared = [g for g, guest in lab.guests.items() if guest.shares]
        if shared:
            raise UsageError(f"{self.pinned.source}: its lab shares host directories ({', '.join(shared)}); "
                             "a packed lab may not")
        check_foreign(lab, self.pinned.source, kernels=False)
        guests = {g: dataclasses.replace(guest, kernel=self.kernel_spec(g)) for g, guest in lab.guests.items()}
        return dataclasses.replace(lab, kernel=None, guests=guests)

    def kernel_spec(self, guest: str) -> KernelSpec:
        """The packed kernel of ``guest``: its Debian name, or the pack's loose files.

        :raise UsageError: when the index names none for the guest.
        """
        rec = self.index.guests.get(guest)
        if rec is None:
            raise UsageError(f"{self.pinned.source}: its index has no kernel for guest {guest}")
        where = f"guests.{guest}.kernel"
        if rec.get("kind") == "debian":
            return debian_kernel(f"debian:{rec.get('release')}", path=where)
        d = self.dir / "kernels" / str(rec.get("key"))
        mods = d / "modules"
        debug = d / "vmlinux.debug" if (d / "vmlinux.debug").is_file() else d / "boot" if rec.get("debug") else None
        return KernelSpec(KERNEL_FILES, image=d / "boot", modules=mods if mods.is_dir() else None, debug=debug,
                          config=d / "config" if (d / "config").is_file() else None, path=where)


def open_pack(path: Path, source: str | None = None, reporter: Reporter | None = None) -> Opened:
    """Test, unpack (once) and index the packed file ``path``; install its image in the cache.

    :raise UsageError: for a truncated, damaged or foreign file, or one made for another architecture.
    """
    source = source or str(path)
    r = reporter or NullReporter()
    with r.step("test the whole file"):
        test = run(["zstd", "-tq", "--", path], timeout=3600, check=False)
    if test.returncode != 0:
        why = (test.stderr or b"").decode(errors="replace").strip().splitlines()
        raise UsageError(f"{source}: damaged or truncated pack ({why[-1] if why else 'zstd says so'}); nothing started")
    digest = sha256_file(path)[:16]
    store = cache_dir() / "packs"
    dest = store / digest
    dest.parent.mkdir(parents=True, exist_ok=True)
    pin(dest)
    with exclusive(dest.parent / f".{digest}.lock"):
        if not (dest / INDEX).is_file():
            # whatever refuses the pack, here or in its lab, leaves nothing of it in the cache
            with r.step("unpack and check every member's sha256"), build_into(dest, store=store) as work:
                _unpack(path, work, source)
                Opened(Pinned(source, PackIndex.parse((work / INDEX).read_bytes(), source), work, None)).lab()
    index = PackIndex.parse((dest / INDEX).read_bytes(), source)
    pinned = Pinned(source, index, dest, None)
    check_host(pinned)
    lab = Opened(pinned).lab()
    if index.has_image:
        with r.step("the packed image into the image cache"):
            pinned = dataclasses.replace(pinned, image=_install_image(pinned, lab.image))
    return Opened(pinned)


def packed_run(opened: Opened) -> Path:
    """The packed run's bundle (manifest, summary, lab file) for ``labctl compare``.

    :raise UsageError: when the pack holds no run.
    """
    if not opened.index.has_run:
        raise UsageError(f"{opened.pinned.source}: holds no run (pack a run's directory to compare with it)")
    return opened.dir / RUN


def _unpack(path: Path, work: Path, source: str) -> None:
    proc = start_piped(["zstd", "-dcq", "--", path])
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            _members(tar, work, source)
        proc.stdout.read()
        if proc.wait(timeout=60) != 0:
            raise UsageError(f"{source}: damaged pack (zstd exited with status {proc.returncode}); nothing started")
    except tarfile.TarError as exc:
        raise UsageError(f"{source}: damaged pack ({exc}); nothing started") from exc
    finally:
        if proc.poll() is None:
            kill_group(proc)


def _members(tar: tarfile.TarFile, work: Path, source: str) -> None:
    first = tar.next()
    if first is None or first.name != INDEX or not first.isreg() or first.size > MAX_INDEX:
        raise UsageError(f"{source}: not a labctl pack (its first member is not {INDEX})")
    f = tar.extractfile(first)
    assert f is not None
    raw = f.read()
    index = PackIndex.parse(raw, source)  # the whole index, of its known shapes, before anything is written
    check_host(Pinned(source, index, work, None))
    (work / INDEX).write_bytes(raw)
    seen: set[str] = set()
    for m in tar:
        if m is first:  # the stream's iterator starts again at the member already read
            continue
        name = m.name.rstrip("/")
        if m.isdir() and member_ok(name, directory=True):
            continue
        want = index.files.get(name)
        if not m.isreg() or not member_ok(name) or want is None or name in seen:
            raise UsageError(f"{source}: member {name!r} is not one its index names; nothing started")
        seen.add(name)
        if not (work / name).resolve().is_relative_to(work.resolve()):  # never, by the names' rule; twice sure
            raise UsageError(f"{source}: member {name!r} is outside the pack; nothing started")
        if m.size != want.get("size"):  # never more bytes than the index names (their total is capped)
            raise UsageError(f"{source}: member {name} has {m.size} bytes, its index {want.get('size')}; "
                             "nothing started")
        src = tar.extractfile(m)
        assert src is not None
        size, digest = _copy_sparse(src, work / name)
        if size != want.get("size") or digest != want.get("sha256"):
            raise UsageError(f"{source}: member {name} has sha256 {digest[:16]} ({size} bytes), its index "
                             f"{str(want.get('sha256'))[:16]} ({want.get('size')} bytes); nothing started")
    missing = sorted(set(index.files) - seen)
    if missing:
        raise UsageError(f"{source}: members missing: {', '.join(missing[:5])}; nothing started")
    (work / UNPACKED).touch()


def _copy_sparse(src: IO[bytes], dst: Path) -> tuple[int, str]:
    """Copy ``src`` into the new file ``dst``, runs of zeros as holes; its size and sha256."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    h, size = hashlib.sha256(), 0
    zeros = bytes(CHUNK)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        while chunk := src.read(CHUNK):
            h.update(chunk)
            if chunk == zeros[:len(chunk)]:
                os.lseek(fd, len(chunk), os.SEEK_CUR)
            else:
                os.write(fd, chunk)
            size += len(chunk)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return size, h.hexdigest()


def _install_image(pinned: Pinned, name: str) -> Image:
    """The packed image in the image cache (``<name>/pack-<rootfs digest>``), hard links to the
    unpacked files; its rootfs checked against the index when it is installed. ``name``: the packed
    lab's ``image:`` (validated as a lab file's), never the index's: an image and its recipe are
    never taken from a pack by name.

    :raise UsageError: when the index names another image, or its manifest names no Debian kernel.
    """
    want = pinned.index.image
    if want.get("name") != name:
        raise pinned.refuse(f"its index packs image {want.get('name')!r}, its lab runs on {name!r}")
    digest = str(want.get("rootfs_sha256"))  # 64 hex digits (PackIndex.parse)
    store = ImageStore()
    key = f"pack-{digest[:16]}"
    final = store.path_for(name, key)
    pin(final)
    with exclusive(final.parent / f".{key}.lock"):
        if not (final / IMAGE_MANIFEST).is_file():
            with build_into(final, 0o755, store=store.root) as work:
                for f in (pinned.dir / "image").iterdir():
                    try:
                        os.link(f, work / f.name)
                    except OSError:
                        shutil.copyfile(f, work / f.name)
    image = Image.at(final)
    if not image.manifest:
        raise LabctlError(f"{pinned.source}: its image has no readable manifest")
    try:
        debian_kernel(image.default_kernel, path="image")
    except ValueError as exc:
        raise pinned.refuse(f"its image's manifest names no default kernel ({exc})") from None
    return dataclasses.replace(image, name=name, key=key)
