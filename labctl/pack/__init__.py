"""A reproducer in one file: a lab packed with its exact kernels and image, and opened again.

Owns the packed file: its layout and index (:mod:`.packfile`), writing it from a lab's prepared
kernels and image or from a run's bundle (:mod:`.packing`), reading it back whole or refusing it
(:mod:`.unpack`), what it promises about each kernel and the image and the checks of what was
prepared here against it (:mod:`.identity`), fetching a lab file or a packed file from an
http(s) URL (:mod:`.fetch`) or from a git repository at a path (:mod:`.gitfetch`), and what the
cache keeps of them, removed when nothing uses it (:mod:`.cache`). It never holds a secret: it
is made of the lab file, kernel files, the image's files and a run's manifest and summary,
nothing of a lab's state directory.

The pipeline (:func:`labctl.pipeline.prepare`) calls the identity checks; the CLI only parses
and prints.

Imports never: labctl.cli, labctl.pipeline, labctl.up, labctl.backends, labctl.steps, labctl.report, labctl.state, labctl.live, labctl.training, labctl.web
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.pack.cache import Entry as CacheEntry
    from labctl.pack.cache import entries as cache_entries
    from labctl.pack.cache import prune as prune_cache
    from labctl.pack.fetch import fetch_url, is_url, url_lab
    from labctl.pack.gitfetch import Checkout, fetch_git, git_lab, is_git_url, parse_git_url
    from labctl.pack.identity import Pinned, check_archive, check_image, check_kernels
    from labctl.pack.packfile import PackIndex, is_pack
    from labctl.pack.packing import PackResult, pack_lab, run_inputs
    from labctl.pack.unpack import Opened, open_pack, packed_run
else:  # each name loaded at its first use (labctl.lazyface): up of a lab file loads no HTTP client
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())

__all__ = [
    "CacheEntry", "Checkout", "Opened", "PackIndex", "PackResult", "Pinned", "cache_entries", "check_archive",
    "check_image", "check_kernels", "fetch_git", "fetch_url", "git_lab", "is_git_url", "is_pack", "is_url",
    "open_pack", "pack_lab", "packed_run", "parse_git_url", "prune_cache", "run_inputs", "url_lab",
]
