"""What a packed file promises about each guest's kernel and the image, and the checks of what
was prepared here against it.

Each guest's kernel is recorded as one of::

    {"kind": "debian", "release": "6.1.0-56-amd64", "build_id": ..., "package": ..., "version": ...,
     "sha256": <the package's digest>, "debug_package": ..., "debug_version": ...,
     "debug_sha256": <the -dbg package's digest, packed with --with-debug>}
    {"kind": "files", "key": <the prepared kernel's key>, "release": ..., "build_id": ...,
     "source": {"kind": "tree", "tree": ...}, "commit": <the tree's git commit, or null>, "debug": bool}

A Debian kernel must come from the archive with the same version and package digest (and, when
packed ``--with-debug``, its ``-dbg`` package too: its debug info is what gdb, drgn and oops
decoding read); a tree's
(or loose) kernel comes from the pack's own files. Either way the kernel prepared here must
have the recorded build id. The image: with its files packed, the root file system booted must
have the recorded sha256; without (``--no-image``), the image built here must have every
package at the recorded version. Every refusal is a :class:`~labctl.errors.UsageError`
(exit 2) naming what differs, raised before anything starts.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import UsageError
from labctl.image import ROOTFS, Image, apt_download, sha256_file, versions
from labctl.kernel import Kernel
from labctl.pack.packfile import UNPACKED, ImageRecord, KernelRecord, PackIndex


@dataclass(frozen=True)
class Pinned:
    """A packed lab opened here: its index, where it was unpacked, and the packed image installed
    in the cache (None: ``--no-image``, the image is built here)."""

    source: str  # the packed file as given (messages)
    index: PackIndex
    dir: Path
    image: Image | None

    def refuse(self, what: str, hint: str | None = None) -> UsageError:
        return UsageError(f"{self.source}: {what}; nothing started", hint=hint)


def check_host(pinned: Pinned) -> None:
    """The pack was made for this architecture. :raise UsageError: when it was not."""
    host = pinned.index.data.get("host")
    arch = str(host.get("arch", "")) if host else ""
    if arch and arch != platform.machine():
        raise pinned.refuse(f"packed on {arch}, this host is {platform.machine()}")


def check_archive(pinned: Pinned) -> None:
    """Each Debian kernel the pack names is still in the archive at its version (before anything is
    downloaded). :raise UsageError: when one is not."""
    for guest, rec in sorted(pinned.index.guests.items()):
        if rec.get("kind") != "debian":
            continue
        packages: list[tuple[str | None, str | None]] = [(rec["package"], rec.get("version"))]
        if rec.get("debug_sha256"):
            packages.append((rec.get("debug_package"), rec.get("debug_version")))
        for package, version in packages:
            have = versions(str(package))
            if version not in have:
                raise pinned.refuse(
                    f"guest {guest}: kernel {rec.get('release')} was packed as {package} {version}, "
                    f"the archive here has {', '.join(have[:4]) or 'no such package'}",
                    hint="point apt at an archive with that version (snapshot.debian.org), then apt-get update")


def check_image(pinned: Pinned, image: Image) -> None:
    """The image about to boot is the packed one: its root file system's sha256 (packed), or every
    package at the packed version (``--no-image``). :raise UsageError: when it is not."""
    want = pinned.index.image
    if pinned.index.has_image:
        got = _packed_digest(pinned, image) or sha256_file(image.rootfs)
        if got != want.get("rootfs_sha256"):
            raise pinned.refuse(f"image {image.name}: root file system sha256 {got[:16]}, packed "
                                f"{str(want.get('rootfs_sha256'))[:16]}")
        return
    diffs = package_differences(dict(want.get("packages") or {}), dict(image.manifest.get("packages") or {}))
    if diffs:
        shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        raise pinned.refuse(f"image {image.name} here is not the packed one ({shown})",
                            hint="ask for a pack with the image (labctl pack without --no-image)")


def _packed_digest(pinned: Pinned, image: Image) -> str | None:
    """The root file system's sha256 as checked when the pack was unpacked, when the image's rootfs
    is that very file (a hard link of the unpacked member) and unchanged since (not written after
    the unpacking's end mark): no second pass over 1.3 GB."""
    member = pinned.dir / "image" / ROOTFS
    try:
        same = (os.path.samefile(member, image.rootfs) and not os.path.islink(image.rootfs)
                and os.stat(image.rootfs).st_mtime_ns <= os.stat(pinned.dir / UNPACKED).st_mtime_ns)
    except OSError:
        return None
    entry = pinned.index.files.get(f"image/{ROOTFS}")
    return str(entry.get("sha256") if entry else None) if same else None


def package_differences(packed: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """What differs between two images' package lists, one line each."""
    out = []
    for name in sorted(set(packed) | set(here)):
        a, b = packed.get(name), here.get(name)
        if a != b:
            out.append(f"{name} {a or 'absent'} packed, {b or 'absent'} here")
    return out


def check_kernels(pinned: Pinned, kernels: dict[str, Kernel]) -> None:
    """Every guest's kernel prepared here is the packed one (same build id; a Debian one from the same
    package by version and digest). :raise UsageError: naming the first that is not."""
    for guest, rec in sorted(pinned.index.guests.items()):
        kernel = kernels.get(guest)
        if kernel is None:
            raise pinned.refuse(f"guest {guest}: no kernel was prepared")
        got = kernel.manifest.get("build_id")
        if got != rec.get("build_id"):
            raise pinned.refuse(f"guest {guest}: kernel {kernel.release} has build id {got}, "
                                f"packed {rec.get('build_id')}")
        if rec.get("kind") == "debian":
            _check_debian(pinned, guest, rec, kernel)


def _check_debian(pinned: Pinned, guest: str, rec: KernelRecord, kernel: Kernel) -> None:
    deb = dict(kernel.manifest.get("debian") or {})
    if deb.get("version") != rec.get("version"):
        raise pinned.refuse(f"guest {guest}: {rec['package']} {deb.get('version')} here, packed {rec.get('version')}")
    # (package, version, its packed digest, whether it is the -dbg package)
    checked = [(rec["package"], rec.get("version"), rec.get("sha256"), False)] + (
        [(rec["debug_package"], rec.get("debug_version"), rec.get("debug_sha256"), True)]
        if rec.get("debug_sha256") else [])
    for package, version, packed, dbg in checked:
        digest = sha256_file(apt_download(str(package), str(version)))
        if digest != packed:
            raise pinned.refuse(f"guest {guest}: {package} {version} from the archive has sha256 "
                                f"{digest[:16]}, packed {str(packed)[:16]}",
                                hint="its debug info would not be the packed kernel's" if dbg else None)


def kernel_record(kernel: Kernel, *, commit: str | None = None, debug: bool = False) -> KernelRecord:
    """What the pack records of a prepared kernel (see the module's docstring)."""
    src = kernel.source
    release, build_id, banner = kernel.release, kernel.manifest.get("build_id"), kernel.manifest.get("banner")
    if src.get("kind") == "debian":
        deb = dict(kernel.manifest.get("debian") or {})
        package = str(deb.get("package"))
        dbg = deb.get("debug_package")
        rec: KernelRecord = {"kind": "debian", "release": release, "build_id": build_id, "banner": banner,
                             "package": package, "version": deb.get("version"),
                             "sha256": sha256_file(apt_download(package, str(deb.get("version")))),
                             "debug_package": dbg, "debug_version": deb.get("debug_version")}
        if debug and dbg:
            rec["debug_sha256"] = sha256_file(apt_download(str(dbg), str(deb.get("debug_version"))))
        return rec
    return {"kind": "files", "release": release, "build_id": build_id, "banner": banner, "key": kernel.key,
            "source": src, "commit": commit, "debug": debug}


def image_record(image: Image, packed: bool) -> ImageRecord:
    """What the pack records of the image."""
    files = dict(image.manifest.get("files") or {})
    return {"name": image.name, "key": image.key, "packed": packed,
            "rootfs_sha256": (files.get(ROOTFS) or {}).get("sha256"),
            "packages": dict(image.manifest.get("packages") or {}),
            "default_kernel": image.default_kernel}
