"""How the suite's tests are shared between pytest-xdist's workers (``--dist loadgroup``, as
pyproject.toml asks): a test file's tests all on one worker (a module's booted lab is shared by
its tests and boots once), and files that declare the same group with
``pytestmark = pytest.mark.xdist_group("NAME")`` together (they share session-scoped bundles or
the kernel tree's builds). pytest-xdist 3.8's own loadgroup puts the group into each test's node
id, which pytest 9 no longer reads (its node ids come from ``Node._id``), so every test went to
whichever worker was free and a module's lab booted on both; this scheduler groups by file, and
reads the files' declared group itself. Files run in collection order (the integration tests,
the longest, first; the many short unit tests fill the end)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

_GROUP = re.compile(r"""^pytestmark\s*=\s*pytest\.mark\.xdist_group\(\s*["']([^"']+)["']\s*\)""", re.MULTILINE)


@cache
def file_group(path: str) -> str:
    """The group a test file declares at its top, else the file itself."""
    try:
        found = _GROUP.search(Path(path).read_text())
    except OSError:
        return path
    return f"group:{found.group(1)}" if found else path


class FileGroupScheduling(LoadScopeScheduling):
    """Whole files (or declared groups of files) to one worker each, in collection order."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        config.option.loadscopereorder = False  # collection order, not "most tests first"

    def _split_scope(self, nodeid: str) -> str:
        return file_group(nodeid.split("::", 1)[0].split("@", 1)[0])
