"""Byte offsets of struct members in a prepared kernel, read once from its debug info and cached.

Probes written straight to ``kprobe_events``/``dynamic_events`` fetch fields at byte offsets
(``+208(%di)``): the guest has no debug info, so they are read on the host from the kernel's
``vmlinux.debug`` with drgn (under a second; gdb took 35 s on a busy host), and kept as JSON beside
the kernel (or in a per-kernel cache directory when the kernel's directory is read-only).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labctl.errors import TraceError
from labctl.kernel.cached import Kernel

log = logging.getLogger(__name__)

Fields = Mapping[str, tuple[str, str]]
"""name -> (C type, member path): ``{"skb_data": ("struct sk_buff", "data")}``."""


def struct_offsets(kernel: Kernel, fields: Fields, cache_name: str, cache_dir: Path | None = None,
                   modules: tuple[str, ...] = ()) -> dict[str, int]:
    """The byte offset of every field of ``fields`` in ``kernel`` (cached in ``cache_name``); ``modules``:
    debug files of modules (``net/netfilter/nf_tables.ko``, under its ``debug-modules/kernel``) whose
    types are read too.

    :raise TraceError: the kernel has no debug info, or a type or member is not in it.
    """
    for d in (kernel.dir, cache_dir):
        if d is not None and (cached := _read(d / cache_name, fields)) is not None:
            return cached
    drgn, prog = _program(kernel, "its struct offsets")
    try:
        for name in modules:
            ko = kernel.debug_modules / "kernel" / name
            if not ko.is_file():
                raise TraceError(f"kernel {kernel.name} has no debug file of {name}")
            prog.extra_module(ko.stem, create=True).try_file(str(ko), force=True)
        out = {name: int(drgn.offsetof(prog.type(ctype), member)) for name, (ctype, member) in fields.items()}
    except (LookupError, ValueError, drgn.FaultError, OSError) as exc:
        raise TraceError(f"cannot read struct offsets from {kernel.vmlinux_debug}: {exc}") from exc
    kernel.keep_json(cache_name, out, cache_dir)
    return out


def enum_names(kernel: Kernel, enum: str, prefix: str, cache_name: str, cache_dir: Path | None = None) -> list[str]:
    """The names of ``enum``'s values in ``kernel``, by value, ``prefix`` taken off (``""`` where no
    name has that value): ``enum skb_drop_reason``'s ``NETFILTER_DROP`` is 7 on 6.1, 12 on 6.12.
    Read from the kernel's debug info like the offsets (cached in ``cache_name``).

    :raise TraceError: the kernel has no debug info, or no such enum.
    """
    for d in (kernel.dir, cache_dir):
        if d is not None:
            try:
                data = json.loads((d / cache_name).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, list) and all(isinstance(n, str) for n in data):
                return [str(n) for n in data]
    drgn, prog = _program(kernel, f"the names of its {enum}")
    try:
        values = {int(e.value): e.name.removeprefix(prefix) for e in prog.type(enum).enumerators or ()}
    except (LookupError, ValueError, drgn.FaultError, OSError) as exc:
        raise TraceError(f"cannot read {enum} from {kernel.vmlinux_debug}: {exc}") from exc
    out = [values.get(i, "") for i in range(max(v for v in values if v < 1 << 16) + 1)] if values else []
    kernel.keep_json(cache_name, out, cache_dir)
    return out


def _program(kernel: Kernel, needed: str) -> tuple[Any, Any]:
    """drgn and a program of ``kernel``'s ``vmlinux.debug`` (``needed``: what is read from it, for the error).

    :raise TraceError: without the debug file, drgn, or when drgn cannot read the file."""
    vmlinux = kernel.vmlinux_debug
    if not vmlinux.is_file():
        raise TraceError(f"kernel {kernel.name} has no vmlinux with debug info: {needed} are needed",
                         hint="give the lab's kernel its debug file")
    try:
        import drgn
    except ImportError as exc:  # pragma: no cover - a dependency
        raise TraceError(f"drgn is not installed: {exc}") from exc
    try:
        prog = drgn.Program(drgn.host_platform)
        prog.extra_module("vmlinux", create=True).try_file(str(vmlinux), force=True)
    except (LookupError, ValueError, drgn.FaultError, OSError) as exc:
        raise TraceError(f"cannot read {vmlinux}: {exc}") from exc
    return drgn, prog


def _read(path: Path, fields: Fields) -> dict[str, int] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and all(isinstance(data.get(k), int) for k in fields):
        return {k: int(data[k]) for k in fields}
    return None
