"""Image recipes: ``images/<name>/recipe.toml`` and the cache key they give."""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import ImageError
from labctl.paths import resource_dir

# Bump when the builder's output changes for the same recipe.
BUILDER_VERSION = "3"  # 3: the kernel is prepared on its own (labctl.kernel)


@dataclass(frozen=True)
class Recipe:
    """A parsed image recipe."""

    name: str
    path: Path
    description: str
    suite: str
    mirrors: tuple[str, ...]
    kernel_abi: str
    kernel_flavour: str
    initramfs_modules: tuple[str, ...]
    exclude_modules: tuple[str, ...]
    debug_modules: tuple[str, ...]
    extra_modules: tuple[str, ...]
    variant: str
    packages: tuple[str, ...]
    free_mib: int

    @property
    def kernel_release(self) -> str:
        return f"{self.kernel_abi}-{self.kernel_flavour}"

    def kernel_today(self) -> tuple[str, str | None]:
        """The release the image boots by default, as the archive is today, and why it is not the
        pinned one (None when it is): the pinned ABI while the archive carries it, else the newest
        ABI of its line (``6.1.0-56`` gone: ``6.1.0-57``). Recorded in the image's manifest when it
        is built; a built image keeps its kernel (a lab that pins an ABI keeps it too)."""
        from labctl.image.apt import candidate, newest_abi

        if candidate(self.kernel_package) is not None:
            return self.kernel_release, None
        line = self.kernel_abi.rsplit("-", 1)[0]
        newer = newest_abi(line, self.kernel_flavour)
        if newer is None:
            return self.kernel_release, None  # nothing to follow: the kernel's own check says so
        why = (f"the archive no longer carries the pinned kernel {self.kernel_release}: the image follows its "
               f"line, {newer}-{self.kernel_flavour}")
        return f"{newer}-{self.kernel_flavour}", why

    @property
    def kernel_package(self) -> str:
        return f"linux-image-{self.kernel_release}-unsigned"

    @property
    def debug_package(self) -> str:
        return f"linux-image-{self.kernel_release}-dbg"

    def key(self) -> str:
        """Content key: the recipe, labctl's guest files and the builder version."""
        h = hashlib.sha256()
        h.update(f"builder={BUILDER_VERSION}\n".encode())
        h.update(self.path.read_bytes())
        guest = resource_dir("guest")
        for f in sorted(p for p in guest.rglob("*") if p.is_file()):
            h.update(f"\0{f.relative_to(guest)}\0".encode())
            h.update(f.read_bytes())
        return h.hexdigest()[:16]


def recipe_names() -> list[str]:
    """Names of all recipes shipped with labctl."""
    root = resource_dir("images")
    return sorted(p.parent.name for p in root.glob("*/recipe.toml"))


_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def load_recipe(name: str) -> Recipe:
    """Load the recipe called ``name``.

    :raise ImageError: when there is no such recipe or it is malformed.
    """
    if _NAME.fullmatch(name) is None:  # a name, never a path: the recipe is labctl's own
        raise ImageError(f"no image recipe named {name!r}", hint=f"known images: {', '.join(recipe_names()) or 'none'}")
    path = resource_dir("images") / name / "recipe.toml"
    if not path.is_file():
        known = ", ".join(recipe_names()) or "none"
        raise ImageError(f"no image recipe named '{name}'", hint=f"known images: {known}")
    try:
        data = tomllib.loads(path.read_text())
        k, r = data["kernel"], data["rootfs"]
        return Recipe(
            name=data["name"], path=path, description=data.get("description", ""),
            suite=data["suite"], mirrors=tuple(data["mirrors"]),
            kernel_abi=k["abi"], kernel_flavour=k["flavour"],
            initramfs_modules=tuple(k["initramfs_modules"]),
            exclude_modules=tuple(k.get("exclude_modules", ())),
            debug_modules=tuple(k.get("debug_modules", ())),
            extra_modules=tuple(k.get("extra_modules", ())),
            variant=r.get("variant", "essential"), packages=tuple(r["packages"]),
            free_mib=int(r.get("free_mib", 1024)),
        )
    except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as exc:
        raise ImageError(f"{path}: malformed recipe ({exc})") from exc
