"""``labctl bisect``: the commit of a kernel tree that changed a lab's outcome.

Owns the search over a git history (:mod:`.search`: midpoints, good/bad/skip,
the first bad commit), how far a verdict of a flaky oracle can be trusted (:mod:`.tries`: tries,
``--tries auto``'s failure rate and confidence), the build of each candidate in a worktree of the
user's repository that labctl keeps in its cache (:mod:`.worktree`: the user's
checkout, branch and files are never touched; builds are incremental and
cached by commit), the oracles that judge a run of the lab (:mod:`.oracle`:
a graded check, a step, a panic, a command, a figure over repeats), the state
file that makes a bisection resumable (:mod:`.statefile`), the loop itself
(:mod:`.engine`), config bisection (one commit, a good and a bad ``.config``: :mod:`.configs` splits
their differences as ktest.pl does, :mod:`.cfgloop` runs it on the engine's builds and runs), the runs that check it (:mod:`.verify`: ``--tries auto``'s reading of the failing
end, the answer confirmed by reverting it on the bad end) and the bisect bundle (:mod:`.bundlepages`).

Imports never: labctl.cli
"""

from __future__ import annotations

from labctl.bisect import bundlepages, cfgloop, configs, oracle, search, tries, worktree
from labctl.bisect.engine import Bisector, on_tree, tree_guests
from labctl.bisect.statefile import State, load, save

__all__ = [
    "Bisector",
    "State",
    "bundlepages",
    "cfgloop",
    "configs",
    "load",
    "on_tree",
    "oracle",
    "save",
    "search",
    "tree_guests",
    "tries",
    "worktree",
]
