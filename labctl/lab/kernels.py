"""The ``kernel:`` of a lab file (top level, and per guest) and of ``--kernel``: which kernel a guest boots.

Three forms::

    kernel: debian:6.1.0-53-amd64                  # a Debian kernel: ABI and flavour (amd64, cloud-amd64, rt-amd64)
    kernel: debian:6.12.117+deb12-amd64            # Debian 12's 6.12 line: its version and the +deb12 tag
    kernel: {tree: ../linux}                       # a built kernel source tree, relative to the lab file
    kernel: {image: bzImage, modules: mods/, debug: vmlinux, config: .config}   # loose files; all but image optional

A Debian kernel is named as ``uname -r`` names it: 6.1's ``6.1.0-ABI`` and the 6.12 line's
``6.12.VERSION+debN`` (bookworm-backports' and -security's ``linux-image-6.12.117+deb12-amd64``) are
the two forms Debian uses.

On the command line (``labctl up --kernel SPEC``): ``debian:ABI-FLAVOUR``,
``tree:PATH``, ``image:PATH`` or a plain path (a directory is a tree, a
file an image), relative to the current directory.

Only the form is checked here (pure); whether the tree exists and was
built, or the Debian ABI is in the archive, is :mod:`labctl.kernel`'s
check, which reports it at the same line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEBIAN = "debian"
TREE = "tree"
FILES = "files"
FLAVOURS = ("amd64", "cloud-amd64", "rt-amd64")
# 6.1.0-53 (an ABI number) or 6.12.117+deb12 (a stable version and the release it was built for)
_DEBIAN = re.compile(r"debian:(?P<abi>\d+\.\d+\.\d+(?:-\d+|\+deb\d+))-(?P<flavour>"
                     + "|".join(map(re.escape, FLAVOURS)) + ")")
DEBIAN_RULE = ("debian:ABI-FLAVOUR, e.g. debian:6.1.0-53-amd64 or debian:6.12.117+deb12-amd64 "
               f"(flavours: {', '.join(FLAVOURS)})")
FILE_KEYS = ("image", "modules", "debug", "config")


@dataclass(frozen=True)
class KernelSpec:
    """One kernel as a lab file (or ``--kernel``) names it; paths are absolute."""

    kind: str  # DEBIAN, TREE or FILES
    abi: str | None = None  # DEBIAN: "6.1.0-53", "6.12.117+deb12"
    flavour: str | None = None  # DEBIAN: "amd64", "cloud-amd64", "rt-amd64"
    tree: Path | None = None  # TREE
    image: Path | None = None  # FILES: a bzImage or an ELF vmlinux
    modules: Path | None = None  # FILES: a directory holding lib/modules/<release>, or <release> itself
    debug: Path | None = None  # FILES: a vmlinux with debug info
    config: Path | None = None  # FILES: its .config (else the one the image embeds, if any)
    line: int = 0
    path: str = "kernel"  # where it was given: "kernel", "guests.a.kernel" or "--kernel"

    @property
    def series(self) -> str | None:
        """A Debian kernel's line (``6.1``, ``6.12``): what its ``linux-source-X.Y`` and archive listing go by."""
        return ".".join(str(self.abi).split(".")[:2]) if self.kind == DEBIAN else None

    @property
    def release(self) -> str | None:
        """A Debian kernel's release, as ``uname -r`` says it (``6.1.0-53-amd64``)."""
        return f"{self.abi}-{self.flavour}" if self.kind == DEBIAN else None

    def describe(self) -> str:
        """How a person names it: ``debian:6.1.0-53-amd64``, ``tree /src/linux``, ``image /x/bzImage``."""
        if self.kind == DEBIAN:
            return f"debian:{self.release}"
        if self.kind == TREE:
            return f"tree {self.tree}"
        return f"image {self.image}"

    def to_dict(self) -> dict[str, str]:
        """JSON-serialisable view."""
        return {"kind": self.kind, **({"release": self.release} if self.release else {}),
                **{k: str(v) for k, v in (("tree", self.tree), ("image", self.image), ("modules", self.modules),
                                          ("debug", self.debug), ("config", self.config)) if v is not None}}


def debian(text: str, line: int = 0, path: str = "kernel") -> KernelSpec:
    """A ``debian:ABI-FLAVOUR`` spec.

    :raise ValueError: when ``text`` is not of that form.
    """
    m = _DEBIAN.fullmatch(text)
    if not m:
        raise ValueError(f"invalid kernel '{text}' (use {DEBIAN_RULE}, or {{tree: PATH}} or {{image: PATH}})")
    return KernelSpec(DEBIAN, abi=m["abi"], flavour=m["flavour"], line=line, path=path)


def from_command_line(text: str, cwd: Path) -> KernelSpec:
    """``--kernel SPEC``: ``debian:...``, ``tree:PATH``, ``image:PATH`` or a path (a directory is a tree).

    :raise ValueError: for a spec of no known form.
    """
    if text.startswith("debian:"):
        return debian(text, path="--kernel")
    kind, sep, rest = text.partition(":")
    if sep and kind in (TREE, "image"):
        target = (cwd / rest).resolve()
        return (KernelSpec(TREE, tree=target, path="--kernel") if kind == TREE
                else KernelSpec(FILES, image=target, path="--kernel"))
    if not text:
        raise ValueError("--kernel needs a value (debian:ABI-FLAVOUR, tree:PATH or image:PATH)")
    target = (cwd / text).resolve()
    return KernelSpec(TREE, tree=target, path="--kernel") if target.is_dir() \
        else KernelSpec(FILES, image=target, path="--kernel")
