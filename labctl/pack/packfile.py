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
from typing import Any

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


@dataclass(frozen=True)
class PackIndex:
    """``pack.json``: what the file promises."""

    data: dict[str, Any]

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        """member -> {size, sha256}: every member but the index and directories."""
        return dict(self.data.get("files") or {})

    @property
    def lab_name(self) -> str:
        return str((self.data.get("lab") or {}).get("name", "?"))

    @property
    def guests(self) -> dict[str, dict[str, Any]]:
        """guest -> its kernel's identity (see :mod:`labctl.pack.identity`)."""
        return dict(self.data.get("guests") or {})

    @property
    def image(self) -> dict[str, Any]:
        return dict(self.data.get("image") or {})

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
        return cls(data)
