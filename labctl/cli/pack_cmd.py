"""``labctl pack LAB.yaml|RUN_DIR -o FILE [--no-image] [--with-debug] [--json]``: a reproducer in one file."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from labctl.cli.lifecycle_cmds import load_with_kernel
from labctl.cli.ui import PrepareDisplay, out, print_json
from labctl.errors import UsageError
from labctl.pack import PackResult
from labctl.pipeline import pack_lab, pack_run


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("pack", help="pack a lab (or a run) with its exact kernels and image into one file")
    p.add_argument("source", metavar="LAB.yaml|RUN_DIR", type=Path)
    p.add_argument("-o", "--output", required=True, type=Path, metavar="FILE", help="the packed file to write")
    p.add_argument("--no-image", action="store_true",
                   help="leave the image out: only its package list, which the image where it runs must match")
    p.add_argument("--with-debug", action="store_true",
                   help="debug info travels too: a tree kernel's vmlinux and modules are its debug files where it "
                        "runs (a separate debug file is packed), a Debian kernel's -dbg package is pinned by digest")
    p.add_argument("--kernel", default=None, metavar="SPEC", help="every guest on this kernel, as up --kernel")
    p.add_argument("--trust-dir", action="append", default=[], metavar="DIR", help="as up --trust-dir")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=cmd_pack)


def cmd_pack(args: argparse.Namespace) -> int:
    out_path = args.output.expanduser().absolute()
    if out_path.exists() or out_path.is_symlink():
        raise UsageError(f"{out_path} exists", hint="pick another -o path")
    with_image = not args.no_image
    if args.source.is_dir():
        if args.kernel:
            raise UsageError("--kernel: a run is packed with the kernels it ran")
        result = pack_run(args.source, out_path, PrepareDisplay(), with_image=with_image, debug=args.with_debug)
    else:
        lab = load_with_kernel(str(args.source), args.kernel, args.trust_dir)
        result = pack_lab(lab, out_path, PrepareDisplay(), with_image=with_image, debug=args.with_debug)
    if args.json:
        print_json(_data(result))
    else:
        _print(result)
    return 0


def _data(result: PackResult) -> dict[str, object]:
    index = result.index.data if result.index else {}
    return {"file": str(result.path), "bytes": result.size, "seconds": round(result.seconds, 2),
            "contents": result.contents, "guests": index.get("guests"), "image": {
                k: v for k, v in dict(index.get("image") or {}).items() if k != "packages"}}


def _print(result: PackResult) -> None:
    t = Table(title=Text(f"{result.path}: {_mib(result.size)} in {result.seconds:.1f} s"), title_justify="left")
    t.add_column("inside")
    t.add_column("before compression", justify="right")
    for what, size in result.contents.items():
        t.add_row(Text(what), _mib(size))
    out.print(t)
    index = result.index.data if result.index else {}
    for guest, rec in dict(index.get("guests") or {}).items():
        how = (f"Debian {rec.get('package')} {rec.get('version')} (sha256 {str(rec.get('sha256'))[:16]})"
               if rec.get("kind") == "debian" else f"packed files{', commit ' + str(rec['commit']) if rec.get('commit') else ''}")
        out.print(Text(f"guest {guest}: {rec.get('release')} build id {rec.get('build_id')}: {how}"), soft_wrap=True)
    img = dict(index.get("image") or {})
    out.print(Text(f"image {img.get('name')}: {'packed' if img.get('packed') else 'package list only'}, "
                   f"root file system sha256 {str(img.get('rootfs_sha256'))[:16]}"), soft_wrap=True)


def _mib(size: int) -> Text:
    return Text(f"{size / 1048576:.1f} MiB")
