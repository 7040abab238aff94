"""The kernels of a lab: which one each guest boots, whether they can be had, preparing them, preflight.

A guest boots its own ``kernel:``, else the lab's, else ``--kernel`` for
every guest, else the image's default Debian kernel (:func:`specs`, worked out once
and handed to the rest). Before anything is started, :func:`check` reports kernels that cannot be had (a missing tree,
one that was not built, an unknown Debian ABI) at the lab file's line (exit
2), :func:`prepare` prepares each distinct kernel once (cached), and
:func:`preflight` refuses a kernel the lab cannot run on, from its
configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import labctl.kernel.prepare as prep
from labctl.errors import ImageError, LabFileError, Problem, UsageError
from labctl.events import NullReporter, Reporter
from labctl.image import Image, Recipe
from labctl.kernel.cached import Kernel, kernels_root
from labctl.kernel.kconfig import parse_config
from labctl.kernel.requirements import Preflight, check_requirements
from labctl.lab import DEBIAN, KernelSpec, Lab, debian_kernel


def options(recipe: Recipe) -> prep.Options:
    """How the image's recipe wants every kernel prepared."""
    return prep.Options(recipe.initramfs_modules, recipe.exclude_modules, recipe.debug_modules,
                        recipe.extra_modules)


def default_spec(image: Image) -> KernelSpec:
    """The image's default kernel (its recipe's Debian ABI and flavour).

    :raise ImageError: when its manifest names none (a damaged or foreign image: exit 3, no traceback).
    """
    try:
        return debian_kernel(image.default_kernel, path="image")
    except ValueError as exc:
        raise ImageError(f"image {image.name} ({image.dir}): its manifest names no default kernel ({exc})") from None


def default_kernel(image: Image, recipe: Recipe, reporter: Reporter | None = None) -> Kernel:
    """The image's default kernel, prepared (from the cache when ``labctl image build`` did it).

    :raise ImageError: when preparing it fails.
    """
    return prep.prepare(default_spec(image), options(recipe), reporter)


def specs(lab: Lab, image: Image) -> dict[str, KernelSpec]:
    """guest -> the kernel it boots."""
    default = default_spec(image)
    return {g: lab.kernel_of(g) or default for g in lab.guests}


def _distinct(specs_by_guest: Mapping[str, KernelSpec]) -> list[KernelSpec]:
    seen: dict[tuple[Any, ...], KernelSpec] = {}
    for spec in specs_by_guest.values():
        seen.setdefault(_identity(spec), spec)
    return list(seen.values())


def _identity(spec: KernelSpec) -> tuple[Any, ...]:
    return (spec.kind, spec.abi, spec.flavour, spec.tree, spec.image, spec.modules, spec.debug)


def check(lab: Lab, by_guest: Mapping[str, KernelSpec]) -> None:
    """Refuse kernels that cannot be had, each at the line that names it (``by_guest``: :func:`specs`).

    :raise LabFileError: for kernels named in the lab file (exit 2).
    :raise UsageError: for ``--kernel`` (exit 2).
    """
    problems: list[Problem] = []
    for spec in _distinct(by_guest):
        why = prep.check(spec)
        if why is None:
            continue
        if spec.path == "--kernel":
            raise UsageError(f"--kernel: {why}")
        problems.append(Problem(lab.source, max(spec.line, 1), spec.path if spec.path != "image" else "image", why))
    if problems:
        raise LabFileError(sorted(problems, key=lambda p: p.line))


def prepare(by_guest: Mapping[str, KernelSpec], recipe: Recipe, reporter: Reporter | None = None) -> dict[str, Kernel]:
    """guest -> its prepared kernel (``by_guest``: :func:`specs`; each distinct kernel prepared once,
    from the cache when it can).

    :raise ImageError: when preparing one fails.
    """
    r = reporter or NullReporter()
    by_spec = {_identity(s): prep.prepare(s, options(recipe), r) for s in _distinct(by_guest)}
    return {g: by_spec[_identity(s)] for g, s in by_guest.items()}


def all_prepared(by_guest: Mapping[str, KernelSpec], recipe: Recipe) -> bool:
    """True when every kernel of ``by_guest`` (:func:`specs`) is in the cache (nothing to download or build)."""
    return all((kernels_root() / prep.content_key(s, options(recipe)) / "manifest.json").is_file()
               for s in _distinct(by_guest))


def preflight(lab: Lab, by_guest: Mapping[str, KernelSpec]) -> Preflight:
    """What the lab needs, checked against each guest's kernel configuration (``by_guest``:
    :func:`specs`), before any kernel is prepared (a Debian kernel's package is downloaded for its
    config) or any QEMU starts.

    :raise ImageError: when a Debian kernel's package cannot be downloaded.
    """
    configs = {_identity(s): prep.config_text(s) for s in _distinct(by_guest)}
    parsed = {k: parse_config(v) if v else None for k, v in configs.items()}
    return check_requirements(lab, lambda g: parsed[_identity(by_guest[g])], lambda g: _name(by_guest[g]))


def _name(spec: KernelSpec) -> str:
    """A kernel's name in preflight messages: its Debian release, or its tree or image."""
    return str(spec.release) if spec.kind == DEBIAN else str(spec.tree or spec.image)


def refuse(report: Preflight) -> None:
    """Raise the preflight's refusals as a lab-file error (exit 2), else nothing.

    :raise LabFileError: when a guest's kernel cannot run the lab.
    """
    if report.refusals:
        raise LabFileError(list(report.refusals))


def warning_lines(report: Preflight) -> Sequence[str]:
    """The preflight's warnings and notes, one line each (file:line: path: message)."""
    return [str(p) for p in (*report.warnings, *report.notes)]
