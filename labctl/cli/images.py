"""``labctl image build|list|prune`` (``build`` also prepares the image's default kernel)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from labctl.cli.jsonout import json_subcommand
from labctl.cli.ui import PrepareDisplay, StepsReporter, out, print_json
from labctl.image import ImageStore, load_recipe, recipe_names
from labctl.kernel import add_source
from labctl.lab import DEFAULT_IMAGE, Lab, load_lab_text
from labctl.pipeline import prepare_image, prepare_kernels


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("image", help="build and list guest images")
    isub = p.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    b = isub.add_parser("build", help="build an image from its recipe under images/ (cached)")
    b.add_argument("name", nargs="?", default=DEFAULT_IMAGE)
    b.add_argument("--force", action="store_true", help="rebuild even if up to date")
    b.add_argument("--with-source", action="store_true",
                   help="also unpack the matching kernel source (Debian linux-source) for gdb's list")
    b.set_defaults(func=build)
    pr = isub.add_parser("prune", help="remove older builds of an image (keep the newest)")
    pr.add_argument("name", nargs="?", default=DEFAULT_IMAGE)
    pr.add_argument("--keep", type=int, default=1, help="how many recent builds to keep (default 1)")
    pr.set_defaults(func=prune)
    json_subcommand(isub, "list", "list built images and known recipes", list_images)


def build(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.name)
    img = ImageStore().get(args.name, recipe.key())
    if img and not args.force:
        out.print(f"image {args.name} ({recipe.key()}) is up to date")
    else:
        img = prepare_image(args.name, PrepareDisplay(), force=args.force)
        out.print(f"built {img.name} ({img.key}) in {img.dir}")
    # The image's default kernel is prepared too (a lab on it then starts at once).
    kernel = prepare_kernels(default_lab(), img, PrepareDisplay())["g"]
    out.print(Text(f"kernel {kernel.name} ready in {kernel.dir}"))
    if args.with_source:
        rep = StepsReporter(f"kernel source for {kernel.name}")
        with rep.running():
            src = add_source(kernel, rep)
        out.print(Text(f"kernel source in {src}"))
    return 0


def default_lab() -> Lab:
    """A one-guest lab on the image's default kernel (to prepare it, or decode against it)."""
    return load_lab_text("name: default\nnetworks: {}\nguests: {g: {}}\n", "default")


def images_in_use() -> list[Path]:
    """The image directories of the labs that are up (never pruned)."""
    from labctl.errors import LabStateError
    from labctl.state import LabState, up_labs

    used = []
    for lab in up_labs():
        try:
            used.append(Path(LabState.load(lab).image["dir"]))
        except (LabStateError, KeyError, TypeError):
            continue
    return used


def prune(args: argparse.Namespace) -> int:
    removed = ImageStore().prune(args.name, keep=max(1, args.keep), in_use=images_in_use())
    for img in removed:
        out.print(f"removed {img.name} ({img.key}) built {img.manifest.get('built_at')}")
    if not removed:
        out.print("nothing to prune")
    return 0


def list_images(args: argparse.Namespace) -> int:
    store = ImageStore()
    images = store.list()
    current = {n: load_recipe(n).key() for n in recipe_names()}
    rows = [{"name": i.name, "key": i.key, "current": current.get(i.name) == i.key,
             "built_at": i.manifest.get("built_at"), "kernel": i.default_kernel,
             "size_mib": round(sum(f["size"] for f in i.manifest.get("files", {}).values()) / 2**20),
             "dir": str(i.dir)} for i in images]
    if args.json:
        print_json({"images": rows, "recipes": sorted(current)})
        return 0
    t = Table("image", "key", "current", "kernel", "built", "size")
    for r in rows:
        t.add_row(r["name"], r["key"], "yes" if r["current"] else "no (recipe changed)",
                  r["kernel"], str(r["built_at"]), f"{r['size_mib']} MiB")
    out.print(t)
    missing = [n for n in current if not any(r["name"] == n and r["current"] for r in rows)]
    for n in missing:
        out.print(f"recipe {n}: not built (labctl image build {n})")
    from labctl.kernel import KernelStore

    prepared = KernelStore().list()
    if prepared:
        out.print(Text(f"kernels prepared for any image: {', '.join(sorted({k.name for k in prepared}))} "
                       "(labctl kernel list)"))
    return 0
