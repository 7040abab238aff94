"""Take a lab down: its guests stopped, its switches and stray processes killed, what its
backends made on hosts released (their ownership journals) and its run directory removed.
``up`` uses the same steps to undo a start that failed.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path

import labctl.up.taps as taps  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import mux
from labctl.backends import GuestRecord, get_backend, owned_backends
from labctl.errors import LabctlError, LabStateError
from labctl.proc import kill_pids, pids_referencing, stop_pid
from labctl.state import LabState, SwitchRecord, lab_lock, remove_run_dir, run_dir


def release_owned(directory: Path) -> list[LabctlError]:
    """Remove what backends created on hosts for a lab's guests (their ownership journals).

    Returns the failures (every journal is tried).
    """
    failures: list[LabctlError] = []
    for backend, guest_dirs in owned_backends(directory).items():
        for gdir in guest_dirs:
            try:
                get_backend(backend).cleanup(gdir)
            except LabctlError as exc:
                failures.append(exc)
    return failures


def stop_switches(switches: list[SwitchRecord]) -> None:
    for sw in switches:
        stop_pid(sw.pid, marker=sw.socket, grace=3.0)  # its socket path: still that switch, not a reused pid


def down(lab_name: str, timeout: float = 10.0,
         on_guest: Callable[[str], None] | None = None) -> None:
    """Power every guest of the lab off (clean, then hard after ``timeout``) and remove its state.

    A lab whose ``up`` was killed, or whose state cannot be read, is removed
    by its run directory: every process that names a file in it (QEMUs,
    switches) is killed and every ownership journal released.

    :raise UsageError: for an invalid lab name. :raise LabStateError: when the lab is not up.
    """
    with lab_lock(lab_name):
        d = run_dir(lab_name)
        mux.close_lab(d)  # the kept connections of exec and cp (their masters: labctl.mux)
        try:
            state = LabState.load(lab_name)
        except LabStateError:
            if d.exists():
                kill_pids(pids_referencing(d))
                taps.delete_netns(taps.netns_name(d))
                _finish_down(lab_name, d)
                return
            raise
        backend = get_backend(state.backend)
        errors: list[LabctlError] = []

        def stop(rec: GuestRecord) -> None:
            try:
                backend.stop(rec, timeout)
            except LabctlError as exc:
                errors.append(exc)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(state.guests))) as pool:
            list(pool.map(stop, state.guests.values()))
        for name in state.guests:
            if on_guest:
                on_guest(name)
        stop_switches(state.switches)
        kill_pids(pids_referencing(d))  # anything started but never recorded (a killed up)
        if state.netns:
            taps.delete_netns(state.netns)
        _finish_down(lab_name, d, errors)


def _finish_down(lab_name: str, directory: Path, errors: list[LabctlError] | None = None) -> None:
    """Release what the lab owns on its hosts and remove its run directory.

    :raise LabctlError: the first failure (a host that is unreachable...);
        the run directory is then kept, so that ``down`` can be run again.
    """
    errors = list(errors or []) + release_owned(directory)
    if errors:
        first = errors[0]
        first.hint = (f"the lab's state is kept; run 'labctl down {lab_name}' again once it is fixed"
                      + (f" ({first.hint})" if first.hint else ""))
        raise first
    remove_run_dir(directory)
