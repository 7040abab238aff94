"""The packed file's layout: a zstd-compressed tar whose first member, ``pack.json``, indexes the rest.

::

    pack.json                     the index: format, lab, kernels, image, run, host, every member's size and sha256
    lab/lab.yaml                  the lab file as written (its kernels are replaced by the packed ones when opened)
    kernels/<key>/boot            a tree's (or loose) kernel as prepared: what QEMU boots
    kernels/<key>/config          its .config
    kernels/<key>/modules/lib/modules/<release>/...   its modules (and labctl's out-of-tree ones)
    kernels/<key>/vmlinux.debug   with --debug, when it is not the boot file itself
    run/manifest.json, run/summary.json, run/lab.yaml   a packed run's, for ``labctl compare``
    image/manifest.json, image/initramfs.cpio, image/rootfs.img   the image (not with --no-image)

A Debian kernel has no files: the index names its packages with their versions and sha256
digests, which the archive must still give. The image comes last, so that a reader that has
the same image already can tell before reading it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

from labctl.errors import UsageError

FORMAT = "labctl-pack"
VERSION = 1
INDEX = "pack.json"
UNPACKED = ".unpacked"  # written when a pack has been unpacked whole (its time: the end of the unpacking)
LAB = "lab/lab.yaml"
SUFFIX = ".labpack"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: What a member's name may be: the layout's directories, plain components (no "..", no absolute path).
MEMBER = re.compile(r"(lab|run|image|kernels/[0-9a-f]{16})(/[A-Za-z0-9_+.,=@-]+)+")
#: What a directory's may be: the same, or a top directory of the layout.
DIRECTORY = re.compile(r"(lab|run|image|kernels)(/[A-Za-z0-9_+.,=@-]+)*")
MAX_INDEX = 4 << 20
#: At most this many bytes in all the members together (checked against the index before anything
#: is written, and again while writing): the image's root file system is the bulk.
MAX_TOTAL = 32 << 30
MAX_MEMBERS = 100_000

#: The shapes of an index's values: data of a known form, never a path or an option.
DIGEST = re.compile(r"[0-9a-f]{64}")
KEY = re.compile(r"[0-9a-f]{16}")
PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1
VERSION_RE = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*(?:-[A-Za-z0-9.+~]+)?")  # Debian policy 5.6.12
RELEASE = re.compile(r"[0-9][A-Za-z0-9._+-]{0,99}")
BUILD_ID = re.compile(r"[0-9a-f]{2,128}")
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a guest's or image's name (never '.', '..' or a path)
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
ARCH = re.compile(r"[a-z0-9_]{1,32}")


def is_pack(path: str | Path) -> bool:
    """True when ``path`` is a file that starts as a packed file does (zstd's magic)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == ZSTD_MAGIC
    except OSError:
        return False


def member_ok(name: str, directory: bool = False) -> bool:
    """A member name the layout allows: no absolute path, no ``..``, nothing outside its directories."""
    pattern = DIRECTORY if directory else MEMBER
    return name == INDEX or (pattern.fullmatch(name) is not None and ".." not in name.split("/"))


class FileEntry(TypedDict):
    """A member of the pack, in the index's ``files``."""

    size: int
    sha256: str


class KernelRecord(TypedDict, total=False):
    """A guest's kernel in the index's ``guests`` (:func:`labctl.pack.identity.kernel_record`): the keys of
    both kinds, ``debian`` (a Debian package) and ``files`` (the pack's own files)."""

    kind: str  # debian | files
    release: str
    build_id: str | None
    banner: str | None
    package: str  # debian
    version: str | None
    sha256: str
    debug_package: str | None
    debug_version: str | None
    debug_sha256: str  # packed --with-debug
    key: str  # files
    source: dict[str, object]  # the prepared kernel's source record, carried unread
    commit: str | None
    debug: bool


class ImageRecord(TypedDict, total=False):
    """The index's ``image`` (:func:`labctl.pack.identity.image_record` writes every key)."""

    name: str
    key: str
    packed: bool
    rootfs_sha256: str | None
    packages: dict[str, str]  # package -> version
    default_kernel: str | None


class PackHost(TypedDict):
    arch: str
    name: str


class PackLab(TypedDict):
    name: str
    file: str
    source: str
    sha256: str


class PackRun(TypedDict):
    dir: str


class PackIndexData(TypedDict, total=False):
    """``pack.json`` (:func:`labctl.pack.packing.pack_lab` writes every key; :meth:`PackIndex.parse`
    checks the shape of what it reads)."""

    format: str
    version: int
    labctl_version: str
    made_at: str
    host: PackHost
    lab: PackLab
    guests: dict[str, KernelRecord]
    image: ImageRecord
    run: PackRun | None
    files: dict[str, FileEntry]


@dataclass(frozen=True)
class PackIndex:
    """``pack.json``: what the file promises."""

    data: PackIndexData

    @property
    def files(self) -> dict[str, FileEntry]:
        """member -> {size, sha256}: every member but the index and directories."""
        return dict(self.data.get("files") or {})

    @property
    def lab_name(self) -> str:
        lab = self.data.get("lab")
        return str(lab.get("name", "?")) if lab else "?"

    @property
    def guests(self) -> dict[str, KernelRecord]:
        """guest -> its kernel's identity (see :mod:`labctl.pack.identity`)."""
        return dict(self.data.get("guests") or {})

    @property
    def image(self) -> ImageRecord:
        return (self.data.get("image") or ImageRecord()).copy()

    @property
    def has_image(self) -> bool:
        return bool(self.image.get("packed"))

    @property
    def has_run(self) -> bool:
        return bool(self.data.get("run"))

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, raw: bytes, source: str) -> PackIndex:
        """:raise UsageError: when it is not a packed file's index."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"{source}: not a labctl pack (its {INDEX} is not JSON: {exc})") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UsageError(f"{source}: not a labctl pack (no '{FORMAT}' index)")
        if data.get("version") != VERSION:
            raise UsageError(f"{source}: a labctl pack of version {data.get('version')!r}; this labctl reads "
                             f"version {VERSION}", hint="use the labctl that made it")
        files = data.get("files")
        if not isinstance(files, dict) or not all(isinstance(v, dict) and member_ok(k) for k, v in files.items()):
            raise UsageError(f"{source}: its {INDEX} names members outside the pack's layout")
        problems = index_problems(data)
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise UsageError(f"{source}: its {INDEX} is not a valid index ({shown}); nothing started")
        return cls(cast(PackIndexData, data))  # its shape checked just above


def _bad(value: Any, pattern: re.Pattern[str], optional: bool = False) -> bool:
    if value is None and optional:
        return False
    return not isinstance(value, str) or pattern.fullmatch(value) is None


def index_problems(data: dict[str, object]) -> list[str]:
    """Every value of an index (``pack.json``) that is not of its known shape, one line each: member
    sizes and digests, each guest's kernel record (a Debian package by name, version and digest;
    a pack's kernel by its key, a digest), the image's record and the host's architecture. A name,
    key, package or version is data matched whole against its grammar, so none is ever a path
    (``/``, ``..``) or an option (a leading ``-``)."""
    out: list[str] = []
    files = data.get("files")
    total = 0
    if not isinstance(files, dict) or len(files) > MAX_MEMBERS:
        return [f"files: a mapping of at most {MAX_MEMBERS} members"]
    for name, rec in files.items():
        size = rec.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            out.append(f"files.{name}.size: not a size")
        else:
            total += size
        if _bad(rec.get("sha256"), DIGEST):
            out.append(f"files.{name}.sha256: not a sha256 digest")
    if total > MAX_TOTAL:
        out.append(f"files: {total} bytes in all, more than {MAX_TOTAL >> 30} GiB")
    lab = data.get("lab")
    if not isinstance(lab, dict) or not isinstance(lab.get("name"), str) or len(lab["name"]) > 64:
        out.append("lab.name: not a lab's name")
    host = data.get("host")
    if host is not None and (not isinstance(host, dict) or _bad(host.get("arch"), ARCH, optional=True)):
        out.append("host.arch: not an architecture")
    guests = data.get("guests")
    if not isinstance(guests, dict):
        out.append("guests: not a mapping")
    else:
        for guest, rec in guests.items():
            out += [f"guests.{guest}{p}" for p in _kernel_problems(guest, rec)]
    out += [f"image{p}" for p in _image_problems(data.get("image"), files)]
    run = data.get("run")
    if run is not None and not isinstance(run, dict):
        out.append("run: not a mapping")
    return out


def _kernel_problems(guest: Any, rec: Any) -> list[str]:
    if not isinstance(guest, str) or NAME.fullmatch(guest) is None:
        return [": not a guest's name"]
    if not isinstance(rec, dict):
        return [": not a mapping"]
    out = []
    if _bad(rec.get("release"), RELEASE):
        out.append(".release: not a kernel release")
    if _bad(rec.get("build_id"), BUILD_ID, optional=True):
        out.append(".build_id: not a build id")
    kind = rec.get("kind")
    if kind == "debian":
        for pkg, ver, sha, optional in (("package", "version", "sha256", False),
                                        ("debug_package", "debug_version", "debug_sha256", True)):
            if _bad(rec.get(pkg), PACKAGE, optional):
                out.append(f".{pkg}: not a Debian package name")
            if _bad(rec.get(ver), VERSION_RE, optional):
                out.append(f".{ver}: not a Debian version")
            if _bad(rec.get(sha), DIGEST, optional):
                out.append(f".{sha}: not a sha256 digest")
        if rec.get("debug_sha256") is not None and rec.get("debug_package") is None:
            out.append(".debug_package: missing")
    elif kind == "files":
        if _bad(rec.get("key"), KEY):
            out.append(".key: not a kernel's key (16 hex digits)")
        if _bad(rec.get("commit"), COMMIT, optional=True):
            out.append(".commit: not a git commit")
        if not isinstance(rec.get("debug", False), bool):
            out.append(".debug: not true or false")
    else:
        out.append(".kind: neither debian nor files")
    return out


def _image_problems(image: object, files: dict[str, object]) -> list[str]:
    if not isinstance(image, dict):
        return [": not a mapping"]
    out = []
    if _bad(image.get("name"), NAME):
        out.append(".name: not an image's name")
    if not isinstance(image.get("packed"), bool):
        out.append(".packed: not true or false")
    if _bad(image.get("rootfs_sha256"), DIGEST, optional=not image.get("packed")):
        out.append(".rootfs_sha256: not a sha256 digest")
    if image.get("packed") and "image/manifest.json" not in files:
        out.append(": packed without its manifest")
    dk = image.get("default_kernel")
    if dk is not None and (not isinstance(dk, str) or not dk.startswith("debian:") or _bad(dk[7:], RELEASE)):
        out.append(".default_kernel: not a Debian kernel")
    packages = image.get("packages") or {}
    if not isinstance(packages, dict):
        out.append(".packages: not a mapping")
    else:
        bad = [p for p, v in packages.items() if _bad(p, PACKAGE) or _bad(v, VERSION_RE)]
        if bad:
            out.append(f".packages: not Debian packages and versions: {', '.join(map(repr, bad[:3]))}")
    return out
