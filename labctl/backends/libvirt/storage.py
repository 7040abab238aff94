"""Images and per-run disks in a libvirt storage pool.

Guests boot from volumes in the ``labctl`` directory pool of their host
(created when missing, mode 0711: QEMU's user may pass through it but not
list it): a remote host cannot see labctl's image cache, and on labctl's own
machine QEMU's unprivileged user cannot either (it is root's, 0700).

* the image's kernel, initramfs and root file system, root's, mode 0644
  (read-only to QEMU), named after the image and the file's sha256. On a
  remote host they are uploaded once through the libvirt stream API
  (sparse, so the 1.5 GB root file system sends only its data); after an
  upload the volume is downloaded back and hashed, and only when the sum
  matches the image manifest's is a ``<volume>.sha256`` marker volume
  written. On labctl's own machine the volume is a hard link to the cached
  file (the same bytes, nothing to send or verify), or an upload when the
  pool is on another file system. A volume without its marker (an
  interrupted upload) is replaced;
* per guest, a qcow2 overlay with the root file system as backing store and
  the three fw_cfg files, owned by QEMU's user with mode 0600, named
  ``labctl-<lab>-<guest>-...``: these belong to the lab and go at ``down``.

Every call takes an open ``virConnect``; libvirt errors are mapped by the
caller's :func:`labctl.backends.libvirt.connection`.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.errors import ImageError
from labctl.image import ROOTFS, Image, sha256_file
from labctl.kernel import Kernel
from labctl.paths import cache_dir, exclusive

log = logging.getLogger(__name__)

POOL = "labctl"
POOL_DIR = "/var/lib/libvirt/labctl"
MARKER = ".sha256"
_ZEROS = bytes(1 << 20)


@dataclass(frozen=True)
class HostImage:
    """The image's root file system on a host, and whether this run uploaded it."""

    rootfs: str
    rootfs_size: int
    uploaded: tuple[tuple[str, float], ...]  # (volume, seconds to upload and verify) sent by this run


@dataclass(frozen=True)
class HostKernel:
    """A guest's kernel files on a host: what it boots, its initramfs and modules disk."""

    boot: str
    initrd: str
    modules: str | None
    uploaded: tuple[tuple[str, float], ...]


POOL_MODE = 0o711  # QEMU's user passes through to its volumes; nobody lists the pool


def pool_xml(name: str = POOL, path: str = POOL_DIR) -> str:
    """A directory pool, root's, that QEMU's user may pass through but not list."""
    pool = ET.Element("pool", type="dir")
    ET.SubElement(pool, "name").text = name
    target = ET.SubElement(pool, "target")
    ET.SubElement(target, "path").text = path
    perms = ET.SubElement(target, "permissions")
    ET.SubElement(perms, "mode").text = f"{POOL_MODE:04o}"
    return ET.tostring(pool, encoding="unicode")


def pool_target(pool: Any) -> tuple[str, int]:
    """(directory, mode) of a directory pool, as libvirt last saw it (after a refresh)."""
    target = ET.fromstring(pool.XMLDesc(0)).find("target")
    path = target.findtext("path") if target is not None else None
    mode = target.findtext("permissions/mode") if target is not None else None
    return path or POOL_DIR, int(mode, 8) if mode else 0


def pool_is_passable(mode: int) -> bool:
    """True when a pool directory with ``mode`` lets QEMU's user reach its volumes."""
    return bool(mode & stat.S_IXOTH)


def volume_xml(name: str, capacity: int, fmt: str = "raw", backing: str | None = None,
               backing_format: str = "raw", mode: str = "0600", owner: tuple[int, int] | None = None) -> str:
    """A volume; with ``backing`` a copy-on-write overlay on that path; ``owner`` is (uid, gid)."""
    vol = ET.Element("volume")
    ET.SubElement(vol, "name").text = name
    ET.SubElement(vol, "capacity", unit="bytes").text = str(capacity)
    ET.SubElement(vol, "allocation", unit="bytes").text = "0"
    target = ET.SubElement(vol, "target")
    ET.SubElement(target, "format", type=fmt)
    perms = ET.SubElement(target, "permissions")
    ET.SubElement(perms, "mode").text = mode
    if owner is not None:
        ET.SubElement(perms, "owner").text = str(owner[0])
        ET.SubElement(perms, "group").text = str(owner[1])
    if backing is not None:
        store = ET.SubElement(vol, "backingStore")
        ET.SubElement(store, "path").text = backing
        ET.SubElement(store, "format", type=backing_format)
    return ET.tostring(vol, encoding="unicode")


def image_volume_name(image: Image, file: str, sha256: str) -> str:
    """``<image>-<file>-<sha256 prefix>``: a new build never reuses an old volume."""
    return f"{image.name}-{file}-{sha256[:16]}"


def lookup_pool(conn: Any, name: str = POOL) -> Any | None:
    """The storage pool ``name``, or None when it does not exist."""
    return _lookup(conn.storagePoolLookupByName, name, "VIR_ERR_NO_STORAGE_POOL")


def ensure_pool(conn: Any) -> Any:
    """The ``labctl`` pool on this host, defined, built and started when needed."""
    pool = lookup_pool(conn)
    if pool is None:
        log.info("defining storage pool %s at %s", POOL, POOL_DIR)
        pool = conn.storagePoolDefineXML(pool_xml(), 0)
        pool.build(0)
        pool.setAutostart(1)
    if not pool.isActive():
        pool.create(0)
    refresh(pool)
    return pool


REFRESH_WAIT = 60.0  # an upload to the pool (another guest's, another labctl's) holds off a refresh


def refresh(pool: Any) -> None:
    """Have libvirt read the pool's directory again, waiting while it refuses because a volume
    upload runs ("pool ... has asynchronous jobs running": guests started side by side on one
    libvirtd, each uploading its fw_cfg volumes)."""
    lv = _lv()
    deadline = time.monotonic() + REFRESH_WAIT
    while True:
        try:
            pool.refresh(0)
            return
        except lv.libvirtError as exc:
            if "asynchronous jobs" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def lookup_volume(pool: Any, name: str) -> Any | None:
    """The volume called ``name`` in ``pool``, or None."""
    return _lookup(pool.storageVolLookupByName, name, "VIR_ERR_NO_STORAGE_VOL")


def _lookup(find: Callable[[str], Any], name: str, missing: str) -> Any | None:
    """``find(name)``, or None when libvirt answers with the error code ``missing`` (its name)."""
    lv = _lv()
    try:
        return find(name)
    except lv.libvirtError as exc:
        if exc.get_error_code() == getattr(lv, missing):
            return None
        raise


def delete_volume(pool: Any, name: str) -> bool:
    """Delete a volume; True if it existed."""
    vol = lookup_volume(pool, name)
    if vol is None:
        return False
    vol.delete(0)
    return True


def ensure_image(conn: Any, image: Image, local: bool = False) -> HostImage:
    """The image's root file system in the host's pool, placed and verified when missing.

    ``local``: the host is labctl's own machine, where a volume can be a hard
    link to the cached file instead of an upload.

    :raise ImageError: when the manifest lacks the file's sum, or an upload
        does not read back with that sum.
    """
    pool = ensure_pool(conn)
    sha256, size = _manifest_sum(image, ROOTFS)
    name = image_volume_name(image, ROOTFS, sha256)
    path, secs = ensure_file(conn, pool, name, image.rootfs, sha256, size, local)
    return HostImage(path, size, ((name, secs),) if secs is not None else ())


def ensure_kernel(conn: Any, kernel: Kernel, initrd: Path, local: bool = False) -> HostKernel:
    """A guest's kernel files in the host's pool (boot file, initramfs, modules disk), each
    named by its sha256, placed and verified when missing.

    :raise ImageError: when an upload does not read back with its sum.
    """
    pool = ensure_pool(conn)
    sums = {name: entry.get("sha256") for name, entry in (kernel.manifest.get("files") or {}).items()}
    uploaded: list[tuple[str, float]] = []

    def place(path: Path, label: str, sha256: str | None) -> str:
        sha = sha256 or sha256_file(path)
        name = f"kernel-{label}-{sha[:16]}"
        vol, secs = ensure_file(conn, pool, name, path, sha, path.stat().st_size, local)
        if secs is not None:
            uploaded.append((name, secs))
        return vol

    boot = place(kernel.boot, "boot", sums.get("boot"))
    initrd_vol = place(initrd, "initrd", None)
    mods = kernel.modules_img
    modules = place(mods, "modules", sums.get("modules.img")) if mods else None
    return HostKernel(boot, initrd_vol, modules, tuple(uploaded))


def ensure_file(conn: Any, pool: Any, name: str, path: Path, sha256: str, size: int,
                local: bool) -> tuple[str, float | None]:
    """Volume ``name`` holding ``path`` (read-only 0644, verified by ``sha256``): its path on the
    host, and how long uploading it took (None when nothing was sent: the volume was there
    already, or it is a hard link to the cached file).

    :raise ImageError: when an upload does not read back with that sum.
    """
    secs = None
    # Two labs placing the same volume at once (a shared kernel, initramfs or image): without the
    # lock, one took the other's half-uploaded volume (no marker yet) for a leftover and deleted it.
    with exclusive(_volume_lock(conn, name)):
        if not _verified(conn, pool, name, sha256) and not (local and link_file(conn, pool, name, path, sha256)):
            t0 = time.monotonic()
            upload_file(conn, pool, name, path, size, mode="0644")
            _verify(conn, pool, name, sha256, path)
            secs = time.monotonic() - t0
        return str(pool.storageVolLookupByName(name).path()), secs


def _volume_lock(conn: Any, name: str) -> Path:
    """The lock file (in labctl's cache) held while a volume of this host's pool is checked and placed."""
    where = hashlib.sha256(f"{conn.getURI()}\0{POOL}\0{name}".encode()).hexdigest()[:24]
    return cache_dir() / "locks" / f"libvirt-volume-{where}.lock"


def _manifest_sum(image: Image, file: str) -> tuple[str, int]:
    """(sha256, size) of an image file, from its manifest."""
    entry = image.manifest.get("files", {}).get(file)
    if not entry or "sha256" not in entry:
        raise ImageError(f"image {image.name} ({image.key}) has no sha256 for {file} in its manifest",
                         hint=f"rebuild it: labctl image build {image.name} --force")
    return str(entry["sha256"]), int(entry["size"])


def _verified(conn: Any, pool: Any, name: str, sha256: str) -> bool:
    """True when the volume and its marker exist and the marker holds ``sha256``.

    A volume without a matching marker is a leftover of an interrupted
    upload: it is deleted.
    """
    marker = lookup_volume(pool, name + MARKER)
    if (lookup_volume(pool, name) is not None and marker is not None
            and read_volume(conn, marker).decode(errors="replace").split()[:1] == [sha256]):
        log.info("volume %s is in pool %s with sha256 %s", name, POOL, sha256)
        return True
    for stale in (name, name + MARKER):
        delete_volume(pool, stale)
    return False


def _verify(conn: Any, pool: Any, name: str, sha256: str, source: Path) -> None:
    """Download the uploaded volume back, hash it, and record the sum in its marker.

    :raise ImageError: when the sums differ (the volume is deleted).
    """
    got = hash_volume(conn, pool.storageVolLookupByName(name))
    if got != sha256:
        delete_volume(pool, name)
        raise ImageError(f"upload of {source} to volume {name} read back with sha256 {got}, "
                         f"not the manifest's {sha256}",
                         hint="check the host's disk; rebuild the image if the local file changed")
    upload_bytes(conn, pool, name + MARKER, f"{sha256}  {source.name}\n".encode(), mode="0644")
    log.info("uploaded %s as volume %s, sha256 %s verified", source, name, sha256)


def link_file(conn: Any, pool: Any, name: str, path: Path, sha256: str) -> bool:
    """Make volume ``name`` a hard link to ``path`` (on labctl's machine) and mark it verified.

    The cached file is the manifest's (labctl built it), so there is nothing
    to send or read back. Only a root-owned file that everyone may read, but
    only root write, is linked: the volume keeps the file's owner and mode,
    and QEMU must read it and never write it. False when it cannot be linked
    (another file system, other owner or mode): the caller uploads instead.
    """
    st = os.stat(path)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o022 or not st.st_mode & stat.S_IROTH:
        return False
    target = Path(pool_target(pool)[0]) / name
    try:
        os.link(path, target)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            return False
        raise
    refresh(pool)
    upload_bytes(conn, pool, name + MARKER, f"{sha256}  {path.name} (hard link)\n".encode(), mode="0644")
    log.info("linked %s as volume %s (sha256 %s, from the image manifest)", path, name, sha256)
    return True


def upload_file(conn: Any, pool: Any, name: str, path: Path, size: int, mode: str = "0600") -> Any:
    """A new raw volume with the contents of ``path``, sent as a sparse stream."""
    lv = _lv()
    vol = pool.createXML(volume_xml(name, size, mode=mode), 0)
    stream = conn.newStream(0)
    fd = os.open(path, os.O_RDONLY)
    try:
        vol.upload(stream, 0, 0, lv.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
        stream.sparseSendAll(_read, _hole, _skip, fd)
        stream.finish()
    except BaseException:
        _abort(stream)
        raise
    finally:
        os.close(fd)
    return vol


def upload_bytes(conn: Any, pool: Any, name: str, data: bytes, mode: str = "0600",
                 owner: tuple[int, int] | None = None) -> Any:
    """A new raw volume holding ``data`` (a small file: fw_cfg entries, markers),
    owned by ``owner`` (uid, gid) when given."""
    vol = pool.createXML(volume_xml(name, len(data), mode=mode, owner=owner), 0)
    stream = conn.newStream(0)
    try:
        vol.upload(stream, 0, len(data), 0)
        sent = 0
        while sent < len(data):
            sent += stream.send(data[sent:])
        stream.finish()
    except BaseException:
        _abort(stream)
        raise
    return vol


def read_volume(conn: Any, vol: Any, limit: int = 1 << 16) -> bytes:
    """The first ``limit`` bytes of a small volume."""
    stream = conn.newStream(0)
    vol.download(stream, 0, limit, 0)
    chunks: list[bytes] = []
    try:
        while True:
            data = stream.recv(65536)
            if not data or isinstance(data, int):
                break
            chunks.append(data)
        stream.finish()
    except BaseException:
        _abort(stream)
        raise
    return b"".join(chunks)


def hash_volume(conn: Any, vol: Any) -> str:
    """sha256 of a volume's whole contents, downloaded as a sparse stream (holes hash as zeros)."""
    lv = _lv()
    digest = hashlib.sha256()

    def data(_st: Any, buf: bytes, _opaque: Any) -> int:
        digest.update(buf)
        return len(buf)

    def hole(_st: Any, length: int, _opaque: Any) -> int:
        while length > 0:
            n = min(length, len(_ZEROS))
            digest.update(_ZEROS[:n])
            length -= n
        return 0

    stream = conn.newStream(0)
    try:
        vol.download(stream, 0, 0, lv.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM)
        stream.sparseRecvAll(data, hole, None)
        stream.finish()
    except BaseException:
        _abort(stream)
        raise
    return digest.hexdigest()


def create_overlay(pool: Any, name: str, backing: str, capacity: int, owner: tuple[int, int] | None = None) -> Any:
    """A qcow2 volume backed by the raw root file system at ``backing``, owned by ``owner``."""
    return pool.createXML(volume_xml(name, capacity, fmt="qcow2", backing=backing, owner=owner), 0)


def _read(_st: Any, nbytes: int, fd: int) -> bytes:
    return os.read(fd, nbytes)


def _skip(_st: Any, length: int, fd: int) -> int:
    return os.lseek(fd, length, os.SEEK_CUR)


def _hole(_st: Any, fd: int) -> list[Any]:
    """[in_data, length] of the section at the file offset (SEEK_DATA/SEEK_HOLE)."""
    cur = os.lseek(fd, 0, os.SEEK_CUR)
    try:
        data = os.lseek(fd, cur, os.SEEK_DATA)
    except OSError:  # ENXIO: only a hole until the end
        data = -1
    if data < 0:
        section = [False, os.lseek(fd, 0, os.SEEK_END) - cur]
    elif data > cur:
        section = [False, data - cur]
    else:
        section = [True, os.lseek(fd, data, os.SEEK_HOLE) - data]
    os.lseek(fd, cur, os.SEEK_SET)
    return section


def _abort(stream: Any) -> None:
    try:
        stream.abort()
    except Exception as exc:  # noqa: BLE001 - already failing; keep the first error
        log.debug("aborting a stream: %s", exc)


def _lv() -> Any:
    from labctl.backends.libvirt.binding import binding as _libvirt

    return _libvirt()
