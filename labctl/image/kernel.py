"""Kernel artifacts: the bootable vmlinux and module dependency order."""

from __future__ import annotations

import lzma
from pathlib import Path

from labctl.errors import ImageError

_XZ_MAGIC = b"\xfd7zXZ\x00"


def extract_vmlinux(bzimage: Path, out: Path) -> None:
    """Write the uncompressed ELF kernel held in an xz-compressed bzImage.

    Booting the ELF directly (PVH) skips decompression, which is slow under TCG.

    :raise ImageError: when no xz payload yielding an ELF is found.
    """
    data = bzimage.read_bytes()
    start = data.find(_XZ_MAGIC)
    while start != -1:
        try:
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
        except lzma.LZMAError:
            elf = b""
        if elf.startswith(b"\x7fELF"):
            out.write_bytes(elf)
            return
        start = data.find(_XZ_MAGIC, start + 1)
    raise ImageError(f"{bzimage}: no xz-compressed ELF kernel found")


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


def module_load_order(modules_dep: str, wanted: list[str]) -> list[str]:
    """Relative paths of ``wanted`` modules and their dependencies, dependencies first.

    :raise ImageError: when a wanted module is not in modules.dep (built in
        modules are silently skipped by passing ``builtin``).
    """
    mods = parse_modules_dep(modules_dep)
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
        if key not in mods:
            raise ImageError(f"module '{name}' is not in modules.dep")
        visit(mods[key][0])
    return order


def nic_driver_rules(modules_dep: str, modules_alias: str) -> tuple[str, list[str]]:
    """Rules for the initramfs to load the drivers of present NICs.

    Returns the text of ``/modules/nics`` (one ``GLOB MOD.ko...`` line per
    PCI/virtio alias of every NIC model's drivers, dependencies first) and
    the relative paths of all modules those lines name.
    """
    from labctl.lab.nics import NIC_MODELS

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
