"""The command line: one thin module per command (argument parsing, output with rich, ``--json``),
the one place that prints (:mod:`.ui`; :mod:`.displays` for the commands that run steps or a class;
:mod:`.junit_out` for ``--junit``; :mod:`.jsonout` for ``--json``; :mod:`.plaintable`, the quick
commands' tables for a pipe without rich; :mod:`.examples`, each command's example line), and :mod:`.main`, the
one place that turns labctl's errors into messages and exit codes. Everything else is the
library's; nothing in the library imports the CLI.

Commands: :mod:`.validate_cmd` (validate), :mod:`.lifecycle_cmds` (up), :mod:`.down_cmd` (down), :mod:`.status_cmd` (status; a
guest's interfaces, routes and sysctls as status shows them: :mod:`.netview`),
:mod:`.run_cmd` (run; its recorded runs :mod:`.recording`), :mod:`.replay_cmd` (replay), :mod:`.gdb_replay` (gdb --replay), :mod:`.report_cmds` (report, archive), :mod:`.compare_cmd` (compare), :mod:`.pack_cmd` (pack), :mod:`.cache_cmd` (cache),
:mod:`.bisect_cmd` (bisect), :mod:`.oops_cmd` (oops), :mod:`.gdb_cmd` (gdb), :mod:`.drgn_cmd`
(drgn, dump), :mod:`.doctor`
(doctor), :mod:`.ssh_cmd` (ssh), :mod:`.exec_cmd` (exec), :mod:`.cp_cmd` (cp), :mod:`.check_cmd`
(check), :mod:`.class_cmd` (class), :mod:`.capture_cmd` (capture), :mod:`.follow_cmd` (follow), :mod:`.impair_cmd` (impair),
:mod:`.link_cmd` (link), :mod:`.graph_cmd` (graph), :mod:`.images` (image), :mod:`.kernel_cmd`
(kernel), :mod:`.restore_cmds` (reset, checkpoint), :mod:`.serve_cmd` (serve), :mod:`.completion_cmd`
(completion: the shell's completion script, with the labs that are up and their guests).
"""

from __future__ import annotations

from labctl.cli.main import main

__all__ = [
    "main",
]
