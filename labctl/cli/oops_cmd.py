"""``labctl oops decode FILE``: every oops in a console log, symbolized to file:line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from labctl.bundle import MANIFEST
from labctl.cli.ui import PrepareDisplay, out, print_json
from labctl.debug import Symbolizer, parse_oopses, render_oops
from labctl.errors import ImageError, UsageError
from labctl.image import ImageStore
from labctl.kernel import Kernel
from labctl.lab import DEFAULT_IMAGE, kernel_from_command_line, load_lab_text
from labctl.pipeline import prepare_kernels

INDENT = "  "


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("oops", help="decode kernel oopses found in console logs")
    osub = p.add_subparsers(dest="oops_command", required=True, metavar="ACTION")
    d = osub.add_parser("decode", help="show every oops in a console log with file:line for each frame")
    d.add_argument("file", help="console text, e.g. a guest's console.log ('-' reads stdin)")
    d.add_argument("--kernel", metavar="SPEC",
                   help="the kernel that produced the log (debian:ABI-FLAVOUR, tree:PATH, image:PATH); "
                        "default: for a bundle's console, the kernel that guest ran, else the image's")
    d.add_argument("--image", default=DEFAULT_IMAGE, help=f"image whose default kernel to use (default {DEFAULT_IMAGE})")
    d.add_argument("--vmlinux", type=Path, help="vmlinux with DWARF to use instead of the kernel's")
    d.add_argument("--modules", type=Path, metavar="DIR",
                   help="tree of module .ko files with debug info, searched before the kernel's debug modules")
    d.add_argument("--json", action="store_true", help="print a JSON list of oopses")
    d.set_defaults(func=decode)


def read_console(path: str) -> str:
    """The text of ``path`` ('-' for stdin); undecodable bytes are replaced.

    :raise UsageError: when the file cannot be read.
    """
    if path == "-":
        return sys.stdin.buffer.read().decode(errors="replace")
    try:
        return Path(path).read_bytes().decode(errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def make_symbolizer(args: argparse.Namespace) -> Symbolizer:
    """A symbolizer for ``--vmlinux``/``--modules``, else for the log's kernel (:func:`log_kernel`).

    :raise ImageError: when that kernel has no debug info.
    """
    if args.vmlinux is not None:
        return Symbolizer(args.vmlinux, args.modules)
    kernel = log_kernel(args)
    if not kernel.vmlinux_debug.is_file():
        raise ImageError(f"kernel {kernel.name} has no vmlinux with debug info ({kernel.vmlinux_debug})",
                         hint="pass --vmlinux PATH")
    # --modules DIR first, then the kernel's own debug modules (in-tree drivers such as 8139cp).
    modules = [args.modules, kernel.debug_modules] if args.modules else [kernel.debug_modules]
    return Symbolizer(kernel.vmlinux_debug, modules, system_map=kernel.system_map)


def log_kernel(args: argparse.Namespace) -> Kernel:
    """The kernel that printed the log: ``--kernel``; else, for a console in a bundle
    (``guests/<guest>/console.log``), the kernel its manifest says that guest ran; else
    the image's default kernel (prepared from the cache)."""
    image = ImageStore().require(args.image)
    if args.kernel:
        spec = kernel_from_command_line(args.kernel, Path.cwd())
        lab = load_lab_text("name: decode\nnetworks: {}\nguests: {g: {}}\n", "decode").with_kernel(spec)
    else:
        recorded = bundle_kernel(Path(args.file)) if args.file != "-" else None
        if recorded is not None:
            return recorded
        lab = load_lab_text("name: decode\nnetworks: {}\nguests: {g: {}}\n", "decode")
    return prepare_kernels(lab, image, PrepareDisplay())["g"]


def bundle_kernel(console: Path) -> Kernel | None:
    """The kernel a bundle's manifest records for the guest whose console this is, if it is one."""
    guest_dir = console.resolve().parent
    bundle = guest_dir.parent.parent
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
        recorded = manifest["kernels"][guest_dir.name]["dir"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    kernel = Kernel.at(recorded)
    return kernel if kernel.manifest else None


def decode(args: argparse.Namespace) -> int:
    oopses = parse_oopses(read_console(args.file))
    decoded = make_symbolizer(args).decode(oopses) if oopses else []
    if args.json:
        print_json([d.to_json() for d in decoded])
        return 0
    if not decoded:
        out.print(f"no oops found in {args.file}", markup=False)
        return 0
    for i, d in enumerate(decoded, 1):
        if i > 1:
            out.print()
        for line in render_oops(d, i):
            out.print(line, soft_wrap=True)
    return 0
