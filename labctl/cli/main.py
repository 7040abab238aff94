"""``labctl``: argument parsing, error printing, exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

from labctl import __version__
from labctl.cli.examples import add_examples

if TYPE_CHECKING:
    import argparse
    import logging

# Nothing else of labctl (nor rich, logging, the errors) is imported here: `labctl --version` and
# `labctl --help` load only this module, and a command loads its own module when it runs
# (tests/unit/test_cli_budget.py pins what each imports).

EXIT_INTERRUPTED = 130


# Each command module, in the order `labctl --help` lists them, with the command words it
# registers: a command imports only its own module (and what that imports), so that `labctl exec`
# does not pay for bisect, the report and the web server (labctl --version: 0.63 -> 0.1x CPU-s).
# tests/unit/test_cli_lazy.py checks the words against what each module registers.
def _validate_cmd() -> ModuleType:
    import labctl.cli.validate_cmd as module
    return module


def _lifecycle_cmds() -> ModuleType:
    import labctl.cli.lifecycle_cmds as module
    return module


def _down_cmd() -> ModuleType:
    import labctl.cli.down_cmd as module
    return module


def _status_cmd() -> ModuleType:
    import labctl.cli.status_cmd as module
    return module


def _run_cmd() -> ModuleType:
    import labctl.cli.run_cmd as module
    return module


def _report_cmds() -> ModuleType:
    import labctl.cli.report_cmds as module
    return module


def _compare_cmd() -> ModuleType:
    import labctl.cli.compare_cmd as module
    return module


def _pack_cmd() -> ModuleType:
    import labctl.cli.pack_cmd as module
    return module


def _bisect_cmd() -> ModuleType:
    import labctl.cli.bisect_cmd as module
    return module


def _oops_cmd() -> ModuleType:
    import labctl.cli.oops_cmd as module
    return module


def _gdb_cmd() -> ModuleType:
    import labctl.cli.gdb_cmd as module
    return module


def _drgn_cmd() -> ModuleType:
    import labctl.cli.drgn_cmd as module
    return module


def _doctor() -> ModuleType:
    import labctl.cli.doctor as module
    return module


def _ssh_cmd() -> ModuleType:
    import labctl.cli.ssh_cmd as module
    return module


def _exec_cmd() -> ModuleType:
    import labctl.cli.exec_cmd as module
    return module


def _cp_cmd() -> ModuleType:
    import labctl.cli.cp_cmd as module
    return module


def _check_cmd() -> ModuleType:
    import labctl.cli.check_cmd as module
    return module


def _class_cmd() -> ModuleType:
    import labctl.cli.class_cmd as module
    return module


def _capture_cmd() -> ModuleType:
    import labctl.cli.capture_cmd as module
    return module


def _follow_cmd() -> ModuleType:
    import labctl.cli.follow_cmd as module
    return module


def _impair_cmd() -> ModuleType:
    import labctl.cli.impair_cmd as module
    return module


def _link_cmd() -> ModuleType:
    import labctl.cli.link_cmd as module
    return module


def _graph_cmd() -> ModuleType:
    import labctl.cli.graph_cmd as module
    return module


def _images() -> ModuleType:
    import labctl.cli.images as module
    return module


def _kernel_cmd() -> ModuleType:
    import labctl.cli.kernel_cmd as module
    return module


def _restore_cmds() -> ModuleType:
    import labctl.cli.restore_cmds as module
    return module


def _replay_cmd() -> ModuleType:
    import labctl.cli.replay_cmd as module
    return module


def _serve_cmd() -> ModuleType:
    import labctl.cli.serve_cmd as module
    return module


def _cache_cmd() -> ModuleType:
    import labctl.cli.cache_cmd as module
    return module


def _completion_cmd() -> ModuleType:
    import labctl.cli.completion_cmd as module
    return module


MODULES: dict[Callable[[], ModuleType], tuple[str, ...]] = {
    _validate_cmd: ("validate",),
    _lifecycle_cmds: ("up",),
    _down_cmd: ("down",),
    _status_cmd: ("status",),
    _run_cmd: ("run",),
    _report_cmds: ("report", "bundle",),
    _compare_cmd: ("compare",),
    _pack_cmd: ("pack",),
    _cache_cmd: ("cache",),
    _bisect_cmd: ("bisect",),
    _oops_cmd: ("oops",),
    _gdb_cmd: ("gdb",),
    _replay_cmd: ("replay",),
    _drgn_cmd: ("drgn", "dump",),
    _doctor: ("doctor",),
    _ssh_cmd: ("ssh",),
    _exec_cmd: ("exec",),
    _cp_cmd: ("cp",),
    _check_cmd: ("check", "ssh-config",),
    _class_cmd: ("class",),
    _capture_cmd: ("capture",),
    _follow_cmd: ("follow",),
    _impair_cmd: ("impair",),
    _link_cmd: ("link",),
    _graph_cmd: ("graph",),
    _images: ("image",),
    _kernel_cmd: ("kernel",),
    _restore_cmds: ("reset", "checkpoint", "snapshot",),
    _serve_cmd: ("serve",),
    _completion_cmd: ("completion",),
}
COMMANDS: dict[str, Callable[[], ModuleType]] = {word: load for load, words in MODULES.items() for word in words}
# Each command's one-line help as `labctl --help` lists it, so that the top-level help loads no
# command's module (tests/unit/test_cli_lazy.py checks it against what the modules register).
HELP: dict[str, str] = {
    'validate': 'check a lab file without starting anything',
    'up': "boot a lab's guests and wait until they answer SSH",
    'down': "power a lab's guests off and remove its state",
    'status': 'show labs that are up',
    'run': 'bring a lab up, run its steps, write the report bundle, take it down',
    'report': 'recompute summary.json and (re)write report.md and report.html of a bundle',
    'bundle': 'pack a run directory into one .tar.gz',
    'compare': 'compare two runs of one lab: what differs, and every figure with its change',
    'pack': 'pack a lab (or a run) with its exact kernels and image into one file',
    'cache': "list or prune the unpacked packs and fetched lab files in labctl's cache",
    'bisect': "find the commit of a kernel tree that changed a lab's outcome",
    'oops': 'decode kernel oopses found in console logs',
    'gdb': "gdb attached to a guest's kernel (symbols, modules, source)",
    'replay': 'replay a recorded guest of a run alone; prints its console again',
    'drgn': "drgn on a guest's running kernel (or a vmcore), with its debug info",
    'dump': 'a vmcore of a guest (drgn and crash open it)',
    'doctor': 'check the host for what the backends need',
    'ssh': 'interactive shell on a guest',
    'exec': 'run a command on a guest; exits with its status',
    'cp': 'copy files and directories between the host and a guest (GUEST:PATH says which side)',
    'check': "run a lab's graded checks on its guests; exit 6 unless all pass",
    'ssh-config': "print an OpenSSH config for a lab's guests (ssh -F FILE GUEST)",
    'class': 'a class: one instance of a lab per student, with handouts',
    'capture': "capture a lab NIC's traffic live (pcapng to a file or to stdout)",
    'follow': "follow matching packets through every guest's kernel and wire, live",
    'impair': "impair a lab NIC's egress (netem in the guest), or show or clear it",
    'link': "take a lab NIC's link down or up (the guest sees carrier loss)",
    'graph': "draw a lab's topology (SVG, Graphviz DOT or Mermaid)",
    'image': 'build and list guest images',
    'kernel': "the guests' kernels: the config a lab needs, prepared kernels",
    'reset': 'put guests of a lab that is up back to their post-boot state',
    'checkpoint': 'save or restore the whole lab at one instant',
    'snapshot': 'post-boot snapshots (warm start, reset)',
    'serve': "the trainer's page, each student's lab and terminals, your labs: in a browser",
    'completion': 'print the shell completion script (bash or zsh)',
}
HELP_FLAGS = frozenset({"-h", "--help"})
GLOBAL_FLAGS = frozenset({"--debug"})  # options before the command word that take no value


def _new_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    import argparse  # here: exec started on a kept connection needs no parser (exec_cmd.started)

    p = argparse.ArgumentParser(prog="labctl", description="Kernel-network debugging labs on QEMU guests.")
    p.add_argument("--version", action="version", version=f"labctl {__version__}")
    p.add_argument("--debug", action="store_true", help="log details and show tracebacks")
    return p, p.add_subparsers(dest="command", required=True, metavar="COMMAND")


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: every command's module loaded (--help, a mistyped command, the docs)."""
    p, sub = _new_parser()
    for load in MODULES:
        load().register(sub)
    add_examples(sub)
    return p


def parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser ``argv`` needs: only its command's module when the command word is known, the
    whole parser otherwise (help, a mistake: argparse's own messages stay the same)."""
    words = [a for a in argv if a not in GLOBAL_FLAGS]
    load = COMMANDS.get(words[0]) if words else None
    if load is None and words and words[0] == "--version":
        return _new_parser()[0]  # argparse prints the version and exits before it needs a command
    if load is None and words and words[0] in HELP_FLAGS:
        return help_parser()
    if load is None:
        return build_parser()
    p, sub = _new_parser()
    load().register(sub)
    add_examples(sub)
    return p


def help_parser() -> argparse.ArgumentParser:
    """``labctl --help``'s parser: every command word with its help line, no command's module loaded."""
    p, sub = _new_parser()
    for word, text in HELP.items():
        sub.add_parser(word, help=text)
    return p


def _log_handler() -> logging.Handler:
    """Log records (which may quote guest output) with control characters shown escaped."""
    import logging

    from labctl.textsafe import safe_text

    class SafeFormatter(logging.Formatter):  # labctl.cli.ui's, without rich (exec loads none)
        def format(self, record: logging.LogRecord) -> str:
            return safe_text(super().format(record))

    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    return handler


def _logging(debug: bool) -> None:
    import logging

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[_log_handler()])
    if not debug:  # refused connections while sshd starts are expected
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
        # qemu.qmp logs each refused connection while labctl waits for a starting QEMU's monitor
        # (labctl retries and reports what matters itself).
        logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)


def _sigterm_as_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _exit_now(status: int) -> NoReturn:
    """Exit without the interpreter's teardown (every loaded module freed: 5-10 ms of an ``exec``
    that ran on a kept connection), once this process's own output is flushed."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # exec on a guest whose kept connection is up: its command is on the guest before the parser,
    # the lab's state and the logging are loaded (they load while the guest runs it)
    quick = _exec_cmd().started(argv) if argv[:1] == ["exec"] else None
    if quick is not None:
        debug, func = False, quick
    else:
        args = parser_for(argv).parse_args(argv)
        if getattr(args, "wants_parser", False):  # labctl completion describes the whole parser
            args.wants_parser = build_parser()
        debug, func = args.debug, lambda: args.func(args)
    import signal

    from labctl.errors import LabctlError, LabFileError
    from labctl.textsafe import safe_text

    if quick is None:  # a started exec logs nothing (its relay and the lab's state): no logging to set up
        _logging(debug)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        status = int(func() or 0)
        if quick is not None:  # its output is copied and flushed: nothing is left to tear down
            _exit_now(status)
        return status
    except KeyboardInterrupt:
        from labctl.cli.ui import error  # rich: loaded when there is something to say

        error("interrupted; everything this command started was stopped")
        return EXIT_INTERRUPTED
    except LabFileError as exc:
        for problem in exc.problems:
            print(safe_text(str(problem)), file=sys.stderr)
        return exc.exit_code
    except LabctlError as exc:
        if debug:
            raise
        from labctl.cli.ui import error

        error(exc.message, exc.hint)
        return exc.exit_code
