"""Guest images: recipes under ``images/`` (:mod:`.recipe`) built into cached
artifacts (:mod:`.build`: kernel, modules, root file system, initramfs from
:mod:`.initramfs` and :mod:`.kernel`), found, listed and pruned by
:mod:`.store`, which also names every file of an image once.

Must not import the ``up`` stage, backends, steps, bundles, reports or the CLI.
"""

from labctl.image.recipe import Recipe, load_recipe
from labctl.image.store import Image, ImageStore

__all__ = ["Image", "ImageStore", "Recipe", "load_recipe"]
