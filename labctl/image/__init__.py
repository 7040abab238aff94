"""Guest images: recipes under ``images/`` (:mod:`.recipe`) built into cached
artifacts (:mod:`.build`: root file system and the image's share of the
initramfs, written by :mod:`.cpio`), found, listed and pruned by
:mod:`.store`, which also names every file of an image once. Debian's
package fetcher (:mod:`.apt`) is here too: kernels use it after images.

Must not import the ``up`` stage, backends, steps, bundles, reports or the CLI,
nor the kernel stage that comes after it.

Imports never: labctl.kernel, labctl.up, labctl.backends, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.state, labctl.live, labctl.training
"""


from labctl.image.apt import apt_download, candidate, newest_abi, require, sha256_file, versions
from labctl.image.build import build_image
from labctl.image.cpio import directory as cpio_directory
from labctl.image.cpio import file as cpio_file
from labctl.image.cpio import write_cpio
from labctl.image.recipe import Recipe, load_recipe, recipe_names
from labctl.image.store import AGENT_BUILTINS, MANIFEST, ROOTFS, Image, ImageStore

__all__ = [
    "AGENT_BUILTINS", "MANIFEST", "ROOTFS", "Image", "ImageStore", "Recipe", "apt_download", "build_image",
    "candidate", "cpio_directory", "cpio_file", "load_recipe", "newest_abi", "recipe_names", "require",
    "sha256_file", "versions", "write_cpio",
]
