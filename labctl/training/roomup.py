"""Every student's instance of a class brought up, each with its handout (``labctl class up``).

On one host the instances come up one after another: the host's CPU is what a boot waits for,
and the first instance's post-boot snapshot is what the others start from (on a libvirt host,
the state libvirt saved of it, with throwaway keys: :func:`labctl.up.warm.shared_templates`). A class spread over
several libvirt hosts (:mod:`.placement`) brings its hosts' instances up side by side, one
thread per host, each host's instances one after another: N hosts take about 1/N of the time.

A failure stops every host from starting another instance; the instances already up stay up
(``class status`` shows them, ``class down`` takes them down), and the first failure is raised
with that said. Ctrl-C on one host stops the instance being started (its ``up`` takes it down);
side by side, it stops every host once the instances being started are up or have failed.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.errors import LabctlError
from labctl.events import UpEvents
from labctl.grading import checks_of
from labctl.image import Image
from labctl.kernel import Kernel
from labctl.lab import Lab
from labctl.training.classroom import ClassRecord, is_up
from labctl.training.handout import write_handout
from labctl.up import UpOptions, shared_templates, up

JOIN_PERIOD = 0.2


@dataclass(frozen=True)
class Arrival:
    """One student's instance, up, with its handout written."""

    student: str
    lab: str  # the instance's ident
    accel: str
    handout: Path  # the student's directory
    ssh_config: Path
    host: str | None  # the libvirt host's name in the lab, when the class is spread


class RoomEvents:
    """What :func:`bring_up` tells its caller (the CLI draws it)."""

    def started(self, side_by_side: bool) -> None:
        """Instances begin to come up; with ``side_by_side``, several at once (one per host)."""

    def instance(self, student: str, lab: Lab) -> UpEvents:
        """The events of ``student``'s instance's ``up``, about to start."""
        return UpEvents()

    def arrived(self, arrival: Arrival) -> None:
        """``arrival``'s instance is up and its handout written."""

    def stopping(self, why: str) -> None:
        """No further instance starts (a failure or Ctrl-C); those being started finish first."""

    def finished(self) -> None:
        """Every instance is up, or the bring-up stopped."""


def bring_up(record: ClassRecord, copies: Mapping[str, Lab], image: Image, kernels: dict[str, Kernel],
             opts: UpOptions, hosts: Mapping[str, str], events: RoomEvents | None = None) -> list[Arrival]:
    """Bring up ``copies`` (student -> that student's instance, in roster order) and write each
    handout; ``hosts`` (student -> host name) when the class is spread.

    :raise LabctlError: the first instance's failure, its hint saying how many are up.
    """
    events = events or RoomEvents()
    groups: dict[str | None, list[str]] = {}
    for student in copies:
        groups.setdefault(hosts.get(student), []).append(student)
    arrived: dict[str, Arrival] = {}
    failures: list[tuple[str, Exception]] = []
    halt = threading.Event()
    lock = threading.Lock()

    def one(student: str, templates: dict[tuple[str, str], Any]) -> None:
        copy = copies[student]
        # A libvirt class: the host's first instance saves the post-boot state the next ones start from.
        state = up(copy, image, kernels, dataclasses.replace(opts, templates=dict(templates)) if templates else opts,
                   events.instance(student, copy))
        if opts.shared_states and not templates:
            templates.update(shared_templates(state))
        config = write_handout(state, student, record.handout(student), checks_of(state))
        arrival = Arrival(student, copy.ident, state.accel, config.parent, config, hosts.get(student))
        with lock:
            arrived[student] = arrival
        events.arrived(arrival)

    def run(students: Sequence[str]) -> None:
        templates: dict[tuple[str, str], Any] = {}  # this host's shared post-boot states
        for student in students:
            if halt.is_set():
                return
            try:
                one(student, templates)
            except Exception as exc:  # noqa: BLE001 - raised in the caller's thread, after the others
                with lock:
                    failures.append((student, exc))
                if not halt.is_set():
                    halt.set()
                    events.stopping(f"student '{student}' failed")
                return

    side_by_side = len(groups) > 1
    events.started(side_by_side)
    try:
        if side_by_side:
            _side_by_side(list(groups.values()), run, halt, events)
        else:
            run(list(copies))
    finally:
        events.finished()
    if failures:
        student, exc = failures[0]
        if isinstance(exc, LabctlError):
            started = sum(is_up(record.ident(s)) for s in record.students)
            exc.hint = ((exc.hint + "; ") if exc.hint else "") + (
                f"student '{student}' failed; {started} instances are up: 'labctl class status --lab "
                f"{record.lab}', 'labctl class down --lab {record.lab}'")
        raise exc
    return [arrived[s] for s in copies]


def _side_by_side(groups: list[list[str]], run: Callable[[Sequence[str]], None], halt: threading.Event,
                  events: RoomEvents) -> None:
    """``run(group)`` for every group in a thread of its own, until all are done. Ctrl-C (or
    SIGTERM) in the caller's thread stops them starting more, waits for the instances being
    started, then goes on."""
    threads = [threading.Thread(target=run, args=(g,), name=f"class-up-{i}", daemon=True)
               for i, g in enumerate(groups)]
    try:
        for t in threads:
            t.start()
        _join(threads)
    except BaseException:
        halt.set()
        events.stopping("interrupted")
        _join(threads)  # a second Ctrl-C leaves at once: what was started, 'class down' removes
        raise


def _join(threads: list[threading.Thread]) -> None:
    for t in threads:
        while t.is_alive():
            t.join(JOIN_PERIOD)

