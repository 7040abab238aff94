"""``labctl``: argument parsing, error printing, exit codes."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

import labctl.cli.bisect_cmd as bisect_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.capture_cmd as capture_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.check_cmd as check_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.class_cmd as class_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.compare_cmd as compare_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.cp_cmd as cp_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.doctor as doctor  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.drgn_cmd as drgn_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.exec_cmd as exec_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.follow_cmd as follow_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.gdb_cmd as gdb_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.graph_cmd as graph_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.images as images  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.impair_cmd as impair_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.kernel_cmd as kernel_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.lifecycle_cmds as lifecycle_cmds  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.link_cmd as link_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.oops_cmd as oops_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.report_cmds as report_cmds  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.restore_cmds as restore_cmds  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.run_cmd as run_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.serve_cmd as serve_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.ssh_cmd as ssh_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.cli.validate_cmd as validate_cmd  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import __version__
from labctl.cli.ui import error
from labctl.errors import LabctlError, LabFileError
from labctl.textsafe import safe_text

EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labctl", description="Kernel-network debugging labs on QEMU guests.")
    p.add_argument("--version", action="version", version=f"labctl {__version__}")
    p.add_argument("--debug", action="store_true", help="log details and show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate_cmd.register(sub)
    lifecycle_cmds.register(sub)
    run_cmd.register(sub)
    report_cmds.register(sub)
    compare_cmd.register(sub)
    bisect_cmd.register(sub)
    oops_cmd.register(sub)
    gdb_cmd.register(sub)
    drgn_cmd.register(sub)
    doctor.register(sub)
    ssh_cmd.register(sub)
    exec_cmd.register(sub)
    cp_cmd.register(sub)
    check_cmd.register(sub)
    class_cmd.register(sub)
    capture_cmd.register(sub)
    follow_cmd.register(sub)
    impair_cmd.register(sub)
    link_cmd.register(sub)
    graph_cmd.register(sub)
    images.register(sub)
    kernel_cmd.register(sub)
    restore_cmds.register(sub)
    serve_cmd.register(sub)
    return p


class _SafeFormatter(logging.Formatter):
    """Log records (which may quote guest output) with control characters shown escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))


def _sigterm_as_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, handlers=[handler])
    if not args.debug:  # refused connections while sshd starts are expected
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
        # qemu.qmp logs each refused connection while labctl waits for a starting QEMU's monitor
        # (labctl retries and reports what matters itself).
        logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        error("interrupted; everything this command started was stopped")
        return EXIT_INTERRUPTED
    except LabFileError as exc:
        for problem in exc.problems:
            print(safe_text(str(problem)), file=sys.stderr)
        return exc.exit_code
    except LabctlError as exc:
        if args.debug:
            raise
        error(exc.message, exc.hint)
        return exc.exit_code
