"""Guest images: recipes under ``images/`` built into cached artifacts."""

from labctl.image.recipe import Recipe, load_recipe
from labctl.image.store import Image, ImageStore

__all__ = ["Image", "ImageStore", "Recipe", "load_recipe"]
