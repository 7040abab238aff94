"""Running drgn code against a kernel view, and pausing a guest around it.

``run_code``/``run_script`` run the user's Python with ``prog`` (and drgn's
helpers, as drgn's own ``-e``/script modes do) and return its exit status,
never raising what the code raised (the traceback comes back as text for the
CLI to print); ``interactive`` is drgn's own shell. :func:`paused` stops a
running guest for a consistent view (QMP ``stop``) and always resumes it
(``cont``), whatever ends the block: an exception, Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import contextlib
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from labctl.backends import qmp_running
from labctl.errors import DebugError, MachineError
from labctl.inspect.guest_target import GuestTarget
from labctl.inspect.program import require_drgn

if TYPE_CHECKING:
    import drgn


_OURS = frozenset({__file__, runpy.__file__})


@dataclass
class Outcome:
    """How the user's code ended: its exit status, and the traceback of what it raised ('' if nothing)."""

    status: int
    traceback: str = ""
    message: str = ""  # sys.exit("text")'s text


@dataclass
class Pause:
    """A pause of the guest: how long it lasted, at most (from before QMP ``stop`` was sent until
    ``cont`` was answered; None while it lasts, or when labctl did not pause it)."""

    already: bool = False  # the guest was paused before (gdb holds it): left paused
    seconds: float | None = None


@contextlib.contextmanager
def paused(target: GuestTarget) -> Iterator[Pause]:
    """The guest stopped for the block (a consistent view), then resumed, whatever happens.

    A guest that was not running before (gdb holds it) is left as it was.

    :raise MachineError: when it cannot be stopped. :raise DebugError: when it cannot be resumed
        (after the block ended normally; else the block's own exception goes on).
    """
    pause = Pause()
    if qmp_running(target.monitor) is False:
        pause.already = True
        yield pause
        return
    restore = _hangup_as_interrupt()
    t0, ended = time.monotonic(), False
    try:
        target.qmp("stop")  # inside: a Ctrl-C just after it still resumes the guest
        yield pause
        ended = True
    finally:
        try:
            target.qmp("cont")
        except MachineError as exc:
            if ended:  # else the block's own exception goes on
                raise DebugError(f"guest {target.guest} could not be resumed: {exc.message}",
                                 hint=f"QMP 'cont' on its monitor ({target.record.qmp}), or 'labctl reset'") from exc
        finally:
            pause.seconds = time.monotonic() - t0
            restore()


def _hangup_as_interrupt() -> Callable[[], None]:
    """SIGHUP (the terminal went away) ends the block like Ctrl-C; the previous handler back after."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGHUP, handler)
    except ValueError:  # not the main thread
        return lambda: None

    def restore() -> None:
        signal.signal(signal.SIGHUP, previous)

    return restore


def default_globals(prog: drgn.Program) -> dict[str, Any]:
    """What drgn's ``-e`` mode gives code: ``prog``, drgn's names and its kernel helpers."""
    require_drgn()
    from drgn.cli import default_globals as drgn_globals

    return drgn_globals(prog)


def _outcome(run: Callable[[], object]) -> Outcome:
    """Run the user's code; its exit status (``sys.exit``'s, 1 for an exception, 0 at the end)."""
    try:
        run()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return Outcome(int(exc.code or 0))
        return Outcome(1, message=str(exc.code))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's code: any error is its status 1 and its traceback
        return Outcome(1, "".join(traceback.format_exception(type(exc), exc, _users(exc.__traceback__))))
    return Outcome(0)


def _users(tb: TracebackType | None) -> TracebackType | None:
    """A traceback from the user's first frame on (labctl's and runpy's frames before it left out)."""
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in _OURS:
        tb = tb.tb_next
    return tb


@contextlib.contextmanager
def _as_main(prog: drgn.Program, argv: list[str]) -> Iterator[None]:
    d = require_drgn()
    saved_argv, saved_path = sys.argv, list(sys.path)
    d.set_default_prog(prog)
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        d.set_default_prog(None)


def run_code(prog: drgn.Program, code: str, args: list[str] | None = None) -> Outcome:
    """Run ``code`` (Python) with drgn's globals; ``sys.argv`` is ``['-c', *args]``."""
    scope = default_globals(prog)
    with _as_main(prog, ["-c", *(args or [])]):
        return _outcome(lambda: exec(compile(code, "<-c>", "exec"), scope))  # noqa: S102 - the user's drgn code, as drgn -c runs it


def run_script(prog: drgn.Program, script: Path, args: list[str]) -> Outcome:
    """Run the Python file ``script`` as ``__main__`` with ``prog`` set; ``sys.argv`` is ``[script, *args]``.

    :raise DebugError: when it cannot be read.
    """
    if not script.is_file():
        raise DebugError(f"no script {script}")
    with _as_main(prog, [str(script), *args]):
        sys.path.insert(0, str(script.resolve().parent))
        return _outcome(lambda: runpy.run_path(str(script), init_globals={"prog": prog}, run_name="__main__"))


def interactive(prog: drgn.Program, header: str) -> int:
    """drgn's interactive shell on ``prog`` until the user leaves it (``header`` above its banner)."""
    require_drgn()
    from drgn.cli import run_interactive

    run_interactive(prog, banner_func=lambda banner: f"{header}\n{banner}")
    return 0
