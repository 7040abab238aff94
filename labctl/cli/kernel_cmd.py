"""``labctl kernel config LAB_FILE``, ``labctl kernel list``, ``labctl kernel prune``.

``config`` prints the configuration fragment a lab needs, ready for the
kernel's ``scripts/kconfig/merge_config.sh``; ``list`` shows the prepared
kernels (each keyed by its content); ``prune`` removes those no lab that is
up uses (the image's default kernel stays).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from labctl.cli.images import default_lab
from labctl.cli.jsonout import json_subcommand
from labctl.cli.ui import out, print_json
from labctl.errors import LabStateError
from labctl.image import ImageStore, load_recipe
from labctl.kernel import KernelStore, config_fragment, content_key, kernel_options, kernel_specs, kernels_root
from labctl.lab import DEFAULT_IMAGE, load_lab
from labctl.state import LabState, up_labs


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("kernel", help="the guests' kernels: the config a lab needs, prepared kernels")
    ksub = p.add_subparsers(dest="kernel_command", required=True, metavar="ACTION")
    c = ksub.add_parser("config", help="print the kernel config fragment a lab needs (for merge_config.sh)")
    c.add_argument("file", metavar="LAB_FILE")
    c.set_defaults(func=cmd_config)
    json_subcommand(ksub, "list", "list prepared kernels", cmd_list)
    pr = ksub.add_parser("prune", help="remove prepared kernels that no lab that is up uses")
    pr.set_defaults(func=cmd_prune)


def cmd_config(args: argparse.Namespace) -> int:
    sys.stdout.write(config_fragment(load_lab(args.file)))
    return 0


def _in_use() -> dict[Path, list[str]]:
    """kernel directory -> the labs (up) whose guests run it."""
    used: dict[Path, list[str]] = {}
    for name in up_labs():
        try:
            state = LabState.load(name)
        except LabStateError:
            continue
        for d in set(state.kernels.values()):
            used.setdefault(Path(d).resolve(), []).append(name)
    return used


def _default_kernel_dir() -> Path | None:
    """The image's default kernel's directory (kept by prune), when the image is built."""
    recipe = load_recipe(DEFAULT_IMAGE)
    image = ImageStore().get(DEFAULT_IMAGE, recipe.key())
    if image is None:
        return None
    spec = kernel_specs(default_lab(), image)["g"]
    return kernels_root() / content_key(spec, kernel_options(recipe))


def cmd_list(args: argparse.Namespace) -> int:
    used = _in_use()
    default = _default_kernel_dir()
    rows: list[dict[str, Any]] = [{"key": k.key, "name": k.name, "release": k.release, "source": k.source,
             "debug": k.has_debug, "default": k.dir == default, "used_by": used.get(k.dir.resolve(), []),
             "prepared_at": k.manifest.get("prepared_at"), "dir": str(k.dir)} for k in KernelStore().list()]
    if args.json:
        print_json({"kernels": rows})
        return 0
    t = Table("kernel", "release", "key", "debug info", "used by", "prepared")
    for r in rows:
        used_by = ", ".join(r["used_by"]) + (" (image default)" if r["default"] else "")
        t.add_row(Text(str(r["name"])), Text(str(r["release"])), str(r["key"]), "yes" if r["debug"] else "no",
                  Text(used_by.strip()), str(r["prepared_at"] or ""))
    out.print(t)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    keep = set(_in_use())
    default = _default_kernel_dir()
    if default is not None:
        keep.add(default.resolve())
    gone = KernelStore().prune(keep)
    for k in gone:
        out.print(Text(f"removed kernel {k.name} ({k.key})" if k.manifest else f"removed leftover {k.dir}"))
    if not gone:
        out.print("nothing to prune")
    return 0
