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

from labctl.bisect.bundlepages import COLUMNS as LOG_COLUMNS
from labctl.bisect.bundlepages import SUMMARY as BISECT_SUMMARY
from labctl.bisect.bundlepages import answer_text, trust_lines
from labctl.bisect.bundlepages import rows as log_rows
from labctl.bisect.bundlepages import summary as bisect_summary
from labctl.bisect.bundlepages import write as write_bundle
from labctl.bisect.cfgloop import start_files as config_start_files
from labctl.bisect.configs import check_pair as check_config_pair
from labctl.bisect.configs import makefile_version
from labctl.bisect.configs import parse as parse_config
from labctl.bisect.engine import Bisector, on_tree, tree_guests
from labctl.bisect.oracle import Oracle
from labctl.bisect.oracle import describe as describe_oracle
from labctl.bisect.oracle import make as make_oracle
from labctl.bisect.search import is_ancestor
from labctl.bisect.search import resolve as resolve_rev
from labctl.bisect.statefile import State, load, save
from labctl.bisect.tries import ESTIMATE_RUNS, MAX_TRIES
from labctl.bisect.worktree import checked_work, default_work
from labctl.bisect.worktree import locked as work_locked

__all__ = [
    "BISECT_SUMMARY",
    "ESTIMATE_RUNS",
    "LOG_COLUMNS",
    "MAX_TRIES",
    "Bisector",
    "Oracle",
    "State",
    "answer_text",
    "bisect_summary",
    "check_config_pair",
    "checked_work",
    "config_start_files",
    "default_work",
    "describe_oracle",
    "is_ancestor",
    "load",
    "log_rows",
    "make_oracle",
    "makefile_version",
    "on_tree",
    "parse_config",
    "resolve_rev",
    "save",
    "tree_guests",
    "trust_lines",
    "work_locked",
    "write_bundle",
]
