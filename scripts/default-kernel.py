"""Prints the default image's kernel as ``RELEASE VERSION`` (setup.sh installs its headers at that
version, for guest/modules/): the built image's own kernel when the image is in the cache, else
the one a build would take today (the recipe's pinned ABI while the archive carries it, else the
newest of its line). VERSION is ``-`` when neither the archive nor the cache has it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's labctl, whatever is installed

from labctl.image import ImageStore, load_recipe
from labctl.kernel import debian_version
from labctl.lab import debian_kernel


def main() -> None:
    recipe = load_recipe("debian-12")
    image = ImageStore().get(recipe.name, recipe.key())
    release = image.default_kernel.removeprefix("debian:") if image else recipe.kernel_today()[0]
    version = debian_version(debian_kernel(f"debian:{release}"))
    print(release, version or "-")


if __name__ == "__main__":
    main()
