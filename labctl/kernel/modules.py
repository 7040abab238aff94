"""A kernel's modules as the guest's boot needs them: dependency order, and which NIC drivers to load.

Works on a kernel's ``modules.dep``, ``modules.alias`` and
``modules.builtin``: a module built into the kernel (a user's tree often
has virtio and ext4 built in) needs no loading and is skipped.
"""

from __future__ import annotations

from pathlib import Path

from labctl.errors import ImageError


def parse_modules_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """Map module name -> (relative path, [dependency paths]) from modules.dep."""
    mods: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, deps = line.split(":", 1)
        name = Path(path).name.split(".ko")[0].replace("-", "_")
        mods[name] = (path, deps.split())
    return mods


def builtin_names(modules_builtin: str) -> set[str]:
    """Module names built into the kernel, from ``modules.builtin`` (``kernel/fs/ext4/ext4.ko`` lines)."""
    return {Path(line.strip()).name.split(".ko")[0].replace("-", "_")
            for line in modules_builtin.splitlines() if line.strip()}


def module_load_order(modules_dep: str, wanted: list[str], builtin: set[str] | None = None) -> list[str]:
    """Relative paths of ``wanted`` modules and their dependencies, dependencies first.

    Modules in ``builtin`` (:func:`builtin_names`) are part of the kernel and skipped.

    :raise ImageError: when a wanted module is neither in modules.dep nor built in.
    """
    mods = parse_modules_dep(modules_dep)
    builtin = builtin or set()
    by_path = {p: name for name, (p, _) in mods.items()}
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in mods[by_path[path]][1]:
            visit(dep)
        order.append(path)

    for name in wanted:
        key = name.replace("-", "_")
        if key in builtin and key not in mods:
            continue
        if key not in mods:
            raise ImageError(f"module '{name}' is neither built into the kernel nor in its modules.dep")
        visit(mods[key][0])
    return order


def nic_driver_rules(modules_dep: str, modules_alias: str) -> tuple[str, list[str]]:
    """Rules for the initramfs to load the drivers of present NICs.

    Returns the text of ``/modules/nics`` (one ``GLOB MOD.ko...`` line per
    PCI/virtio alias of every NIC model's drivers, dependencies first) and
    the relative paths of all modules those lines name.
    """
    from labctl.lab import NIC_MODELS

    drivers = {d.replace("-", "_") for m in NIC_MODELS.values() for d in m.drivers}
    lines: list[str] = []
    paths: list[str] = []
    orders: dict[str, list[str]] = {}
    for line in modules_alias.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] != "alias" or parts[2] not in drivers:
            continue
        if not parts[1].startswith(("pci:", "virtio:")):
            continue
        if parts[2] not in orders:
            orders[parts[2]] = module_load_order(modules_dep, [parts[2]])
        order = orders[parts[2]]
        lines.append(" ".join([parts[1], *(Path(p).name for p in order)]))
        paths.extend(order)
    return "".join(f"{ln}\n" for ln in lines), list(dict.fromkeys(paths))
