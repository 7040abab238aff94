"""Bringing a class's instances up (labctl.training.roomup): one after another on one host, a spread
class's hosts side by side, a failure stopping every host from starting more. ``up`` and the
handouts are stand-ins here; tests/integration/test_libvirt_class.py brings a spread class up for real."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from labctl.errors import GuestError
from labctl.training import roomup
from labctl.training.classroom import ClassRecord
from labctl.up.lifecycle import UpOptions

STUDENTS = ["ann", "bea", "cid", "dan"]


class Recorder(roomup.RoomEvents):
    def __init__(self) -> None:
        self.side_by_side: bool | None = None
        self.arrived_in: list[str] = []
        self.stops: list[str] = []
        self.stopped = threading.Event()

    def started(self, side_by_side: bool) -> None:
        self.side_by_side = side_by_side

    def arrived(self, arrival: roomup.Arrival) -> None:
        self.arrived_in.append(arrival.student)

    def stopping(self, why: str) -> None:
        self.stops.append(why)
        self.stopped.set()


def _setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_up: Any) -> tuple[ClassRecord, dict[str, Any]]:
    record = ClassRecord("room", "", STUDENTS, str(tmp_path))
    up_now: set[str] = set()

    def up(copy: Any, image: Any, kernels: Any, opts: Any, events: Any) -> Any:
        fake_up(copy.student)
        up_now.add(copy.ident)
        return SimpleNamespace(accel="tcg", ident=copy.ident)

    def handout(state: Any, student: str, directory: Path, checks: Any) -> Path:
        return directory / "ssh_config"

    monkeypatch.setattr(roomup, "up", up)
    monkeypatch.setattr(roomup, "write_handout", handout)
    monkeypatch.setattr(roomup, "checks_of", lambda state: ())
    monkeypatch.setattr(roomup, "is_up", lambda ident: ident in up_now)
    copies = {s: SimpleNamespace(ident=f"room@{s}", student=s) for s in STUDENTS}
    return record, copies


def test_one_host_one_after_another_in_the_callers_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    record, copies = _setup(monkeypatch, tmp_path,
                            lambda s: seen.append((s, threading.current_thread().name)))
    events = Recorder()
    got = roomup.bring_up(record, copies, None, {}, UpOptions(), {}, events)  # type: ignore[arg-type]
    assert [a.student for a in got] == STUDENTS and events.side_by_side is False
    assert seen == [(s, threading.current_thread().name) for s in STUDENTS]
    assert got[1] == roomup.Arrival("bea", "room@bea", "tcg", tmp_path / "bea", tmp_path / "bea" / "ssh_config", None)


def test_a_spread_class_brings_its_hosts_up_side_by_side(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    both = threading.Barrier(2, timeout=20)  # each host's first instance waits for the other's: side by side
    order: list[str] = []

    def fake(student: str) -> None:
        if student in ("ann", "bea"):
            both.wait()
        order.append(student)

    record, copies = _setup(monkeypatch, tmp_path, fake)
    hosts = {"ann": "h1", "bea": "h2", "cid": "h1", "dan": "h2"}
    events = Recorder()
    got = roomup.bring_up(record, copies, None, {}, UpOptions(), hosts, events)  # type: ignore[arg-type]
    assert events.side_by_side is True
    assert [(a.student, a.host) for a in got] == list(hosts.items())  # roster order, whoever came first
    assert order.index("cid") > order.index("ann") and order.index("dan") > order.index("bea")  # each host in turn


def test_each_hosts_first_instance_gives_its_shared_states_to_the_next_ones_there(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    record, copies = _setup(monkeypatch, tmp_path, lambda s: None)
    given: dict[str, Any] = {}
    plain = roomup.up

    def up(copy: Any, image: Any, kernels: Any, opts: UpOptions, events: Any) -> Any:
        given[copy.student] = dict(opts.templates)
        return plain(copy, image, kernels, opts, events)

    monkeypatch.setattr(roomup, "up", up)
    # what the first instance on a host saved (warm.shared_templates reads it from its state)
    monkeypatch.setattr(roomup, "shared_templates",
                        lambda state: {("a", "h1" if state.ident in ("room@ann", "room@cid") else "h2"): state.ident})
    hosts = {"ann": "h1", "bea": "h2", "cid": "h1", "dan": "h2"}
    roomup.bring_up(record, copies, None, {}, UpOptions(shared_states=True), hosts)  # type: ignore[arg-type]
    assert given == {"ann": {}, "bea": {}, "cid": {("a", "h1"): "room@ann"}, "dan": {("a", "h2"): "room@bea"}}
    given.clear()
    roomup.bring_up(record, copies, None, {}, UpOptions(), hosts)  # type: ignore[arg-type]
    assert given == {s: {} for s in STUDENTS}  # without shared states (the qemu backend, --cold), none


def test_a_failure_stops_every_host_and_says_how_many_are_up(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    bea_started = threading.Event()
    started: list[str] = []
    events = Recorder()

    def fake(student: str) -> None:
        started.append(student)
        if student == "bea":  # h2's first instance is still coming up when h1's fails
            bea_started.set()
            assert events.stopped.wait(20)
        if student == "ann":
            assert bea_started.wait(20)
            raise GuestError("guest a failed to boot")

    record, copies = _setup(monkeypatch, tmp_path, fake)
    with pytest.raises(GuestError) as err:
        roomup.bring_up(record, copies, None, {}, UpOptions(),  # type: ignore[arg-type]
                        {"ann": "h1", "bea": "h2", "cid": "h1", "dan": "h2"}, events)
    assert "cid" not in started and "dan" not in started  # bea's up finished; nothing after it started
    assert err.value.hint and "student 'ann' failed; 1 instances are up" in err.value.hint
    assert "labctl class down --lab room" in err.value.hint
    assert events.stops == ["student 'ann' failed"]


def test_one_host_stops_at_the_first_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    started: list[str] = []

    def fake(student: str) -> None:
        started.append(student)
        if student == "bea":
            raise GuestError("no")

    record, copies = _setup(monkeypatch, tmp_path, fake)
    with pytest.raises(GuestError, match="no") as err:
        roomup.bring_up(record, copies, None, {}, UpOptions(), {})  # type: ignore[arg-type]
    assert started == ["ann", "bea"]
    assert err.value.hint and "student 'bea' failed; 1 instances are up" in err.value.hint


def test_ctrl_c_waits_for_the_instances_being_started_and_starts_no_more(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    import _thread
    import signal

    started: list[str] = []
    events = Recorder()

    def fake(student: str) -> None:
        started.append(student)
        if student == "ann":  # Ctrl-C while ann (h1) and bea (h2) come up: both finish, nothing else starts
            _thread.interrupt_main()
            assert events.stopped.wait(20)

    record, copies = _setup(monkeypatch, tmp_path, fake)
    # Ctrl-C as Python takes it, also where the suite runs with SIGINT ignored (a background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            roomup.bring_up(record, copies, None, {}, UpOptions(),  # type: ignore[arg-type]
                            {"ann": "h1", "bea": "h2", "cid": "h1", "dan": "h2"}, events)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "cid" not in started and "dan" not in started and events.stops == ["interrupted"]
    assert "ann" in events.arrived_in  # its up was not cut short
