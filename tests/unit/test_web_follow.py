"""Packets followed from labctl serve's pages, without guests: who may follow (the owner, a class's trainer,
a student only when the trainer allows), bad filters refused, and the last packets of an instance served
from its run directory whoever followed them (a page or labctl follow)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from labctl.training.classroom import ClassRecord
from labctl.web.access import OWNER, STUDENT, TRAINER, Principal, class_tokens, owner_token
from labctl.web.app import build_app
from labctl.web.authz import LAB_FOLLOW, NO_FOLLOW, Policy


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("LABCTL_STATE_DIR", str(d))
    return d


@pytest.fixture
def record(state: Path, tmp_path: Path) -> ClassRecord:
    out = tmp_path / "handouts"
    for s in ("ann", "bea"):
        (out / s).mkdir(parents=True, mode=0o700)
    os.chmod(out, 0o700)
    rec = ClassRecord("exlab", "/x/exlab.yaml", ["ann", "bea"], str(out))
    rec.create()
    return rec


@pytest.fixture
def client(record: ClassRecord) -> Iterator[TestClient]:
    with TestClient(build_app(), base_url="http://127.0.0.1:8470") as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_following_is_the_owners_the_trainers_and_a_students_when_allowed() -> None:
    allow: dict[str, bool] = {}
    ok = Policy({}, allow).authorize
    ann = Principal(STUDENT, "exlab", "ann")
    trainer = Principal(TRAINER, "exlab", students=("ann", "bea"))
    assert ok(Principal(OWNER), LAB_FOLLOW, "anything") is None and ok(trainer, LAB_FOLLOW, "exlab@ann") is None
    assert ok(ann, LAB_FOLLOW, "exlab@ann") == NO_FOLLOW
    allow["exlab"] = True
    assert ok(ann, LAB_FOLLOW, "exlab@ann") is None and ok(ann, LAB_FOLLOW, "exlab@bea")  # never another's
    assert ok(trainer, LAB_FOLLOW, "other@ann")


def test_a_student_follows_once_the_trainer_allows(client: TestClient, record: ClassRecord, state: Path) -> None:
    tokens = class_tokens(record)
    ann, bea, trainer = bearer(tokens.students["ann"]), bearer(tokens.students["bea"]), bearer(tokens.trainer)
    r = client.get("/api/lab/exlab@ann/packets", headers=ann)
    assert r.status_code == 403 and r.json()["error"] == NO_FOLLOW
    assert client.post("/api/lab/exlab@ann/follow", headers=ann, json={"filter": "icmp"}).status_code == 403
    assert client.post("/api/class/exlab/allow-follow", headers=ann, json={"allow": True}).status_code == 403
    r = client.post("/api/class/exlab/allow-follow", headers=trainer, json={"allow": True})
    assert r.status_code == 200 and r.json() == {"class": "exlab", "allow_follow": True}
    assert client.get("/api/class/exlab", headers=trainer).json()["allow_follow"] is True
    assert client.get("/api/lab/exlab@ann/packets", headers=ann).json() == {
        "running": False, "ready": False, "filter": "", "error": "", "packets": []}
    assert client.get("/api/lab/exlab@ann/packets", headers=bea).status_code == 403  # never another student's
    # a bad filter is refused by name before anything starts; a good one on a lab that is not up: 404
    r = client.post("/api/lab/exlab@ann/follow", headers=ann, json={"filter": "ether host 1:2:3:4:5:6"})
    assert r.status_code == 400 and "does not follow by 'ether'" in r.json()["error"]
    r = client.post("/api/lab/exlab@ann/follow", headers=ann, json={"filter": "icmp or vlan 10"})
    assert r.status_code == 400 and "'vlan' only ANDed with the whole filter" in r.json()["error"]
    r = client.post("/api/lab/exlab@ann/follow", headers=ann, json={"filter": "icmp and hst 1"})
    assert r.status_code == 400 and "syntax error" in r.json()["error"]
    assert client.post("/api/lab/exlab@ann/follow", headers=ann, json={"filter": 7}).status_code == 400
    assert client.post("/api/lab/exlab@ann/follow", headers=ann, json={"filter": "icmp"}).status_code == 404
    assert client.post("/api/lab/exlab@ann/follow/stop", headers=ann).status_code == 400
    r = client.post("/api/lab/exlab@ann/follow", headers={**ann, "origin": "http://evil.example"}, json={"filter": "icmp"})
    assert r.status_code == 403


def test_the_last_packets_come_from_the_run_directory(client: TestClient, record: ClassRecord, state: Path) -> None:
    """labctl follow in a terminal writes them there too: the owner's page shows the newest ten."""
    run = state / "labs" / "exlab@ann"
    run.mkdir(parents=True, mode=0o700)
    packets = [{"id": i, "packet": f"ICMP echo-request 10.1.0.1 > 10.2.0.1 id 7 seq {i}", "hops": [],
                "end": {"kind": "dropped", "guest": "r", "text": "dropped on r for IP_RPFILTER"}, "at": 1.0 + i}
               for i in range(1, 13)]
    (run / "follow-recent.json").write_text(json.dumps({"packets": packets}))
    got = client.get("/api/lab/exlab@ann/packets", headers=bearer(owner_token())).json()
    assert [p["id"] for p in got["packets"]] == list(range(3, 13)) and got["running"] is False


def test_a_packet_that_follows_another_closely_is_written_by_the_next_tick(tmp_path: Path) -> None:
    """The page polls the file: the second of two packets 0.1 s apart must not wait for a third."""
    from types import SimpleNamespace
    from typing import Any, cast

    from labctl.follow import Recent
    from labctl.follow.recent import EVERY, read

    class J:
        def __init__(self, i: int) -> None:
            self.i = i

        def as_dict(self) -> dict[str, Any]:
            return {"id": self.i, "packet": "ICMP", "hops": [], "end": {"kind": "dropped"}}

    keep = Recent(cast(Any, SimpleNamespace(path=tmp_path)))
    keep.add(cast(Any, J(1)))
    keep.add(cast(Any, J(2)))
    assert [p["id"] for p in read(tmp_path)] == [1]  # written at most every EVERY s
    keep.written -= EVERY
    keep.tick()
    assert [p["id"] for p in read(tmp_path)] == [1, 2]
