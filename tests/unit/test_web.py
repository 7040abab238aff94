"""labctl serve without guests: tokens and their revocation, who may reach what, the pages'
headers, and refusals (HTTP 403) for every action outside a student's own instance."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from labctl.training.classroom import ClassRecord
from labctl.web import access
from labctl.web.access import OWNER, STUDENT, TRAINER, Principal, class_tokens, owner_token, resolve, revoke
from labctl.web.app import build_app
from labctl.web.http import COOKIE
from labctl.web.server import links, parse_listen


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


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    for bad in ("localhost:80", "1.2.3.4:x", "1.2.3.4:70000", "a b"):
        with pytest.raises(access.UsageError):
            parse_listen(bad)


def test_class_tokens_are_private_and_resolve_to_their_holder(record: ClassRecord) -> None:
    tokens = class_tokens(record)
    path = access.ClassTokens.path_of("exlab")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert class_tokens(record) == tokens  # stable while the class is up
    assert resolve(tokens.trainer) == Principal(TRAINER, "exlab", students=("ann", "bea"))
    assert resolve(tokens.students["ann"]) == Principal(STUDENT, "exlab", "ann")
    assert resolve("nope") is None and resolve("") is None and resolve(None) is None
    own = owner_token()
    assert resolve(own) == Principal(OWNER)
    assert stat.S_IMODE((access.web_dir() / "owner.token").stat().st_mode) == 0o600


def test_who_may_reach_what() -> None:
    ann = Principal(STUDENT, "exlab", "ann")
    assert ann.may_reach("exlab@ann")
    assert not ann.may_reach("exlab@bea") and not ann.may_reach("exlab") and not ann.may_reach("other@ann")
    assert not ann.may_reach("../exlab@ann")
    trainer = Principal(TRAINER, "exlab", students=("ann", "bea"))
    assert trainer.may_reach("exlab@bea") and not trainer.may_reach("exlab") and not trainer.may_reach("other@bea")
    assert not trainer.may_reach("exlab@zed")  # the owner's own instance, or a student off the roster
    assert trainer.may_see_class("exlab") and not trainer.may_see_class("other") and not ann.may_see_class("exlab")
    assert Principal(OWNER).may_reach("anything@x") and not Principal(OWNER).may_reach("a/b")


def test_the_trainer_reaches_the_current_students_only(client: TestClient, record: ClassRecord) -> None:
    import dataclasses
    import json

    tokens = class_tokens(record)
    trainer = bearer(tokens.trainer)
    assert client.get("/api/lab/exlab@bea", headers=trainer).status_code == 200
    assert client.get("/api/lab/exlab@zed", headers=trainer).status_code == 403  # not a student: the owner's
    with pytest.raises(WebSocketDisconnect) as exc, client.websocket_connect("/ws/term/exlab@zed/a", headers=trainer):
        pass
    assert exc.value.code == 4403
    # bea leaves the roster: the trainer's token no longer reaches her instance (the class stays)
    ClassRecord.path_of("exlab").write_text(json.dumps(dataclasses.asdict(record) | {"students": ["ann"]}))
    access._resolved.clear()
    assert client.get("/api/lab/exlab@bea", headers=trainer).status_code == 403
    assert client.get("/api/lab/exlab@ann", headers=trainer).status_code == 200


def test_tokens_die_with_the_class_and_never_serve_the_next(record: ClassRecord) -> None:
    tokens = class_tokens(record)
    record.remove()  # class down removes the record: the tokens stop at once
    assert resolve(tokens.students["ann"]) is None and resolve(tokens.trainer) is None
    again = ClassRecord("exlab", record.source, record.students, record.out, created_at="2099-01-01T00:00:00+00:00")
    again.create()
    assert resolve(tokens.students["ann"]) is None  # a new class of the same lab: the old tokens stay dead
    fresh = class_tokens(again)
    assert fresh.students["ann"] != tokens.students["ann"]
    assert resolve(fresh.students["ann"]) == Principal(STUDENT, "exlab", "ann")
    revoke("exlab")
    assert resolve(fresh.students["ann"]) is None


def test_links_write_each_students_url_into_their_handout(record: ClassRecord) -> None:
    got = links("http://127.0.0.1:8470", None)
    tokens = class_tokens(record)
    assert got.classes["exlab"]["ann"] == f"http://127.0.0.1:8470/?t={tokens.students['ann']}"
    url_file = Path(record.out) / "ann" / access.URL_FILE
    assert url_file.read_text().strip() == got.classes["exlab"]["ann"]
    assert stat.S_IMODE(url_file.stat().st_mode) == 0o600


def test_first_visit_moves_the_token_into_a_cookie(client: TestClient, record: ClassRecord) -> None:
    tokens = class_tokens(record)
    r = client.get(f"/?t={tokens.students['ann']}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/lab/exlab@ann"
    page = client.get("/lab/exlab@ann")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "http" not in csp
    assert page.headers["referrer-policy"] == "no-referrer"
    assert client.get("/lab/exlab@bea").status_code == 403
    assert client.get("/?t=wrong").status_code == 403


def test_a_link_another_site_opened_signs_nobody_in(client: TestClient, record: ClassRecord) -> None:
    tokens = class_tokens(record)
    ann = tokens.students["ann"]
    for headers in ({"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"},
                    {"referer": "http://127.0.0.1:9999/page"}):
        r = client.get(f"/?t={ann}", headers=headers, follow_redirects=False)
        assert r.status_code == 200 and "set-cookie" not in r.headers, headers
        assert "ann (exlab)" in r.text and "Another site opened it" in r.text and f'href="/?t={ann}"' in r.text
    for headers in ({"sec-fetch-site": "none"}, {"sec-fetch-site": "same-origin"}, {},
                    {"referer": "http://127.0.0.1:8470/lab/x"}):
        r = client.get(f"/?t={ann}", headers=headers, follow_redirects=False)
        assert r.status_code == 303 and COOKIE in r.headers["set-cookie"], headers


def test_a_handout_is_read_without_following_links_or_waiting(record: ClassRecord, tmp_path: Path) -> None:
    from labctl.web.room import HANDOUT_LIMIT, handout_text

    d = Path(record.out) / "ann"
    (d / "README.md").write_text("# your lab\n")
    assert handout_text(record, "ann") == ("# your lab\n", "")
    (tmp_path / "secret").write_text("root:hash\n")
    (d / "README.md").unlink()
    (d / "README.md").symlink_to(tmp_path / "secret")
    text, why = handout_text(record, "ann")
    assert text == "" and "symbolic link" in why
    (d / "README.md").unlink()
    os.mkfifo(d / "README.md")  # no writer: a blocking open would wait for ever
    assert handout_text(record, "ann") == ("", "the handout is not shown: README.md is not a regular file")
    (d / "README.md").unlink()
    (d / "README.md").write_bytes(b"x" * (HANDOUT_LIMIT + 10))
    text, why = handout_text(record, "ann")
    assert len(text) == HANDOUT_LIMIT and "only its start" in why
    os.rename(d, tmp_path / "moved")
    d.symlink_to(tmp_path / "moved")  # the handout directory itself a link
    assert "symbolic link" in handout_text(record, "ann")[1]
    assert handout_text(record, "bea")[1] == "no README.md in the handout directory"


def test_a_page_that_stops_reading_holds_a_bounded_output() -> None:
    import asyncio

    from labctl.web.terminal import Output

    async def go() -> None:
        out = Output(limit=100)
        for i in range(50):
            out.put_nowait(bytes([65 + i % 26]) * 30)
        assert out.size == 100 and out.dropped == 1400
        got = await out.get()
        assert got is not None and got.startswith(b"\r\n[labctl: 1400 bytes of output dropped")
        assert got.endswith(b"U" * 10 + b"V" * 30 + b"W" * 30 + b"X" * 30)
        out.put_nowait(b"x" * 250)  # one chunk larger than the bound: its end is kept
        out.put_nowait(None)
        got = await out.get()
        assert got is not None and got.endswith(b"x" * 100) and b"150 bytes" in got
        assert await out.get() is None

    asyncio.run(go())


def test_one_guests_login_never_holds_up_anothers() -> None:
    import asyncio
    import threading
    from unittest import mock

    from labctl.web.terminal import Hub, Terminals

    stuck, release = threading.Event(), threading.Event()

    def fake_open(hub: Hub, ep: object, cols: int, rows: int) -> None:
        if hub.ident == "lab@ann":  # a guest whose sshd never answers
            stuck.set()
            release.wait(30)
            raise access.LabctlError("no answer")
        hub.chan = mock.MagicMock()

    async def go() -> None:
        terms = Terminals()
        with mock.patch.object(Hub, "open", fake_open), mock.patch.object(Hub, "start_reading", lambda hub: None):
            ann = asyncio.create_task(terms.attach("lab@ann", "a", mock.MagicMock(), 80, 24))
            await asyncio.to_thread(stuck.wait, 10)
            bea = await asyncio.wait_for(terms.attach("lab@bea", "a", mock.MagicMock(), 80, 24), 10)
            assert not ann.done() and bea.ident == "lab@bea"
            release.set()
            with pytest.raises(access.LabctlError):
                await ann
            bea.close()

    asyncio.run(go())


def test_no_login_to_a_guest_while_it_is_being_reset() -> None:
    """A page that reconnects during its guest's reset is logged in only once the reset has
    ended (before, it could get a shell on the guest on its way out, which took its keystrokes and
    answered nothing: seen once in CI); the hubs open then are closed; two resets at once hold
    logins until both end; another guest is not held up."""
    import asyncio
    from unittest import mock

    from labctl.web.terminal import Hub, Terminals

    opened: list[str] = []

    def fake_open(hub: Hub, ep: object, cols: int, rows: int) -> None:
        opened.append(hub.ident)
        hub.chan = mock.MagicMock()

    async def go() -> None:
        terms = Terminals()
        with mock.patch.object(Hub, "open", fake_open), mock.patch.object(Hub, "start_reading", lambda hub: None):
            old = await terms.attach("lab@ann", "a", mock.MagicMock(), 80, 24)
            first = terms.resetting("lab@ann", "a", 4001, "the guest is being reset")
            second = terms.resetting("lab@ann", "a", 4001, "the guest is being reset")
            await first.__aenter__()
            assert old.closed
            await second.__aenter__()
            page = asyncio.create_task(terms.attach("lab@ann", "a", mock.MagicMock(), 80, 24))
            other = await asyncio.wait_for(terms.attach("lab@bea", "a", mock.MagicMock(), 80, 24), 10)
            await asyncio.sleep(0.05)
            assert not page.done() and opened == ["lab@ann", "lab@bea"]
            await second.__aexit__(None, None, None)  # the second reset (refused, say) ends first
            await asyncio.sleep(0.05)
            assert not page.done()
            await first.__aexit__(None, None, None)
            hub = await asyncio.wait_for(page, 10)
            assert hub is not old and not hub.closed and opened == ["lab@ann", "lab@bea", "lab@ann"]
            hub.close()
            other.close()

    asyncio.run(go())


def test_a_student_reaches_only_their_own_instance(client: TestClient, record: ClassRecord) -> None:
    tokens = class_tokens(record)
    ann = bearer(tokens.students["ann"])
    assert client.get("/api/lab/exlab@bea", headers=ann).status_code == 403
    assert client.get("/api/lab/exlab@bea/topology.svg", headers=ann).status_code == 403
    assert client.post("/api/lab/exlab@bea/checks", headers=ann).status_code == 403
    assert client.post("/api/lab/exlab@bea/reset/a", headers=ann).status_code == 403
    assert client.get("/api/class/exlab", headers=ann).status_code == 403
    assert client.get("/class/exlab", headers=ann).status_code == 403
    assert client.post("/api/class/exlab/allow-reset", headers=ann, json={"allow": True}).status_code == 403
    assert client.get("/api/events?lab=exlab@bea", headers=ann).status_code == 403
    assert client.get("/api/index", headers=ann).status_code == 403
    # their own guest: not allowed to reset until the trainer says so
    r = client.post("/api/lab/exlab@ann/reset/a", headers=ann)
    assert r.status_code == 403 and "not allowed" in r.json()["error"]
    trainer = bearer(tokens.trainer)
    assert client.post("/api/class/exlab/allow-reset", headers=trainer, json={"allow": True}).status_code == 200
    assert client.post("/api/class/exlab/allow-reset", headers=trainer, json={"allow": "yes"}).status_code == 400
    assert client.post("/api/lab/exlab@ann/reset/a", headers=ann).status_code == 404  # allowed; the lab is not up
    # a page of another origin cannot act with the cookie
    assert client.post("/api/lab/exlab@ann/checks", headers={**ann, "origin": "http://127.0.0.1:9999"}).status_code == 403


def test_terminals_refuse_other_students_and_revoked_tokens(client: TestClient, record: ClassRecord) -> None:
    tokens = class_tokens(record)
    for headers in (bearer(tokens.students["ann"]), {}, bearer("forged")):
        with pytest.raises(WebSocketDisconnect) as exc, client.websocket_connect("/ws/term/exlab@bea/a",
                                                                                 headers=headers):
            pass
        assert exc.value.code == 4403
    with pytest.raises(WebSocketDisconnect) as exc, client.websocket_connect(  # another origin, right token
            "/ws/term/exlab@ann/a", headers={**bearer(tokens.students["ann"]), "origin": "http://evil.example"}):
        pass
    assert exc.value.code == 4403
    revoke("exlab")
    r = client.get("/api/lab/exlab@ann", headers=bearer(tokens.students["ann"]))
    assert r.status_code == 403


def test_serve_refuses_a_bad_listen_address_with_exit_2(state: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "labctl", "serve", "--listen", "nowhere:x"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "LABCTL_STATE_DIR": str(state)}, check=False)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "--listen" in res.stderr


def test_progress_counts_students_passing_each_check_and_keeps_a_small_history(record: ClassRecord) -> None:
    from labctl.web.progress import MAX_SAMPLES, History, Progress

    students = ["ann", "bea"]
    prog = Progress()
    prog.note("exlab", record.created_at, "ann", students, ["a", "b"], ["a"])
    prog.note("exlab", record.created_at, "ann", students, ["a", "b"], ["a"])  # nothing changed: no sample
    prog.note("exlab", record.created_at, "bea", students, ["a", "b"], ["a", "b"])
    view = prog.history("exlab", record.created_at).view(students)
    assert view["checks"] == ["a", "b"] and view["students"] == 2
    assert [s[1:] for s in view["samples"]] == [[0, 1, 0], [1, 2, 1]]
    assert view["now"] == [1, 2, 1]
    path = History.path_of("exlab")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # a new server reads it back; a later class of the same lab starts afresh
    again = Progress().history("exlab", record.created_at).view(students)
    assert again == view
    assert Progress().history("exlab", "2099-01-01T00:00:00+00:00").view(students)["samples"] == []
    # a damaged file is an empty history, not an error
    path.write_text("{not json")
    assert Progress().history("exlab", record.created_at).samples == []
    h = History("exlab", record.created_at)
    for i in range(MAX_SAMPLES + 50):
        h.note("ann", ["a"], ["a"] if i % 2 else [], students, at=float(i))
    assert len(h.samples) == MAX_SAMPLES and h.samples[-1][0] == MAX_SAMPLES + 49


def test_the_class_view_carries_its_progress(client: TestClient, record: ClassRecord) -> None:
    from labctl.grading import CheckResult

    tokens = class_tokens(record)
    r = client.get("/api/class/exlab", headers=bearer(tokens.trainer))
    assert r.status_code == 200
    assert r.json()["progress"] == {"checks": [], "students": 2, "samples": [], "now": [0]}
    from labctl.web.room import Room

    room = Room()
    room._note_progress("exlab", "ann", [CheckResult("fixed", "a", "pass"), CheckResult("other", "a", "fail")])
    room._note_progress("exlab", "nobody", [CheckResult("fixed", "a", "pass")])  # not a student: ignored
    p = room.class_view("exlab")["progress"]
    assert p["checks"] == ["fixed", "other"] and p["now"] == [0, 1, 0] and len(p["samples"]) == 1


TOOL_CALLS = [("get", "/console/a", None), ("post", "/captures", {"guest": "a", "nic": "eth1"}),
              ("post", "/captures/labctl-cap-1-1/stop", None), ("get", "/captures/labctl-cap-1-1.pcapng", None),
              ("post", "/impair", {"guest": "a", "nic": "eth1", "impair": {"delay": "20ms"}}),
              ("post", "/link", {"guest": "a", "nic": "eth1", "up": False})]


def test_the_engineers_tools_answer_the_owner_only(client: TestClient, record: ClassRecord) -> None:
    tokens = class_tokens(record)
    for tok in (tokens.students["ann"], tokens.trainer, "forged"):
        for method, path, body in TOOL_CALLS:  # even on the student's own instance, which they otherwise reach
            r = client.request(method, f"/api/lab/exlab@ann{path}", headers=bearer(tok), json=body)
            assert r.status_code == 403, (tok, path, r.status_code)
    own = bearer(owner_token())
    for method, path, body in TOOL_CALLS:  # the owner gets through to "not up" (no lab here), never a traceback
        r = client.request(method, f"/api/lab/exlab@ann{path}", headers=own, json=body)
        assert r.status_code in (400, 404), (path, r.status_code, r.text)
        assert "error" in r.json()
    # another origin cannot act with the owner's cookie either
    r = client.post("/api/lab/exlab@ann/link", headers={**own, "origin": "http://evil.example"}, json={})
    assert r.status_code == 403
    assert client.post("/api/lab/exlab@ann/impair", headers=own, content=b"[1, 2").status_code == 400


def test_impairments_from_a_page_are_checked() -> None:
    from labctl.errors import UsageError
    from labctl.web.tools import parse_impair_request

    assert parse_impair_request(None) is None and parse_impair_request({}) is None
    imp = parse_impair_request({"delay": "20ms", "loss": "1%", "limit": 100})
    assert imp is not None and imp.describe() == "delay 20ms, loss 1%, limit 100"
    for bad, why in (({"delay": "fast"}, "delay"), ({"jitter": "5ms"}, "needs a delay"), ({"bogus": 1}, "bogus"),
                     ("delay=20ms", "object"), ({"loss": "200%"}, "100%")):
        with pytest.raises(UsageError, match=why):
            parse_impair_request(bad)


def test_the_console_tail_escapes_controls_and_follows_a_restart(tmp_path: Path) -> None:
    from labctl.web.tools import CONSOLE_FIRST, ConsoleTail

    log = tmp_path / "console.log"
    log.write_bytes(b"x" * (CONSOLE_FIRST + 100) + b"\r\nboot \x1b[31mred\x07 <b>tag</b>\r")
    tail = ConsoleTail(log)
    restarted, text = tail.read()
    assert restarted and len(text) < CONSOLE_FIRST + 10
    assert text.endswith("\nboot \\x1b[31mred\\x07 <b>tag</b>") and "\r" not in text
    with open(log, "ab") as f:
        f.write(b"\nnext \xc3")  # the \r of \r\n came last time; half a UTF-8 character
    assert tail.read() == (False, "\nnext ")
    with open(log, "ab") as f:
        f.write(b"\xa9\n")
    assert tail.read() == (False, "\u00e9\n")
    log.write_bytes(b"again\n")  # the guest started anew: a shorter file
    assert tail.read() == (True, "again\n")


def _make_pair(d: Path, name: str = "serve") -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    c, k = d / f"{name}.crt", d / f"{name}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    os.chmod(c, 0o644)
    os.chmod(k, 0o600)
    return c, k


def test_the_trainers_certificate_is_checked_and_copied(state: Path, tmp_path: Path) -> None:
    from labctl.errors import UsageError
    from labctl.web.server import own_certificate

    d = tmp_path / "tls"
    d.mkdir(mode=0o700)
    cert, key = _make_pair(d)
    cert_copy, key_copy, fp = own_certificate(cert, key)
    assert cert_copy.read_bytes() == cert.read_bytes() and key_copy.read_bytes() == key.read_bytes()
    assert stat.S_IMODE(key_copy.stat().st_mode) == 0o600 and len(fp.split(":")) == 32
    _other_cert, other_key = _make_pair(d, "other")
    with pytest.raises(UsageError, match="not the key of the certificate"):
        own_certificate(cert, other_key)
    for mode in (0o640, 0o604):
        os.chmod(key, mode)
        with pytest.raises(UsageError, match="readable by other users"):
            own_certificate(cert, key)
    os.chmod(key, 0o600)
    os.chmod(cert, 0o666)
    with pytest.raises(UsageError, match="writable by other users"):
        own_certificate(cert, key)
    os.chmod(cert, 0o644)
    link = d / "link.key"
    link.symlink_to(key)
    with pytest.raises(UsageError, match="symbolic link"):
        own_certificate(cert, link)
    with pytest.raises(UsageError, match="not a PEM certificate"):
        own_certificate(key, key)
    with pytest.raises(UsageError, match="cannot open"):
        own_certificate(cert, d / "missing.key")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    shutil_copy = open_dir / "serve.key"
    shutil_copy.write_bytes(key.read_bytes())
    os.chmod(shutil_copy, 0o600)
    with pytest.raises(UsageError, match="writable by other users"):  # a directory others may change
        own_certificate(cert, shutil_copy)


def test_serve_refuses_a_key_others_may_read_with_exit_2(state: Path, tmp_path: Path) -> None:
    d = tmp_path / "tls"
    d.mkdir(mode=0o700)
    cert, key = _make_pair(d)
    os.chmod(key, 0o644)
    # A narrow terminal never cuts an error line: a script (or this test) reads it whole.
    env = {**os.environ, "LABCTL_STATE_DIR": str(state), "COLUMNS": "40"}
    for argv, what in ((["--cert", str(cert), "--key", str(key)], "readable by other users"),
                       (["--cert", str(cert)], "go together"),
                       (["--tls", "--cert", str(cert), "--key", str(key)], "--tls")):
        res = subprocess.run([sys.executable, "-m", "labctl", "serve", "--listen", "127.0.0.1:0", *argv],
                             capture_output=True, text=True, timeout=60, env=env, check=False)
        assert res.returncode == 2, res.stderr
        assert what in res.stderr and "Traceback" not in res.stderr
        lines = res.stderr.splitlines()  # each error and hint whole on its line, at any width
        assert lines and all(line.startswith(("error: ", "hint: ")) for line in lines), lines


def test_the_owners_view_shows_links_impairments_and_saved_captures(client: TestClient, state: Path) -> None:
    import json

    from labctl.state.runstate import LabState, run_dir

    run = run_dir("eng")
    run.mkdir(parents=True, mode=0o700)
    LabState(lab="eng", source="eng.yaml", dir=str(run), backend="qemu", accel="tcg", image={}, started_at="",
             resolved={"guests": {"a": {"nics": [{"name": "eth1", "network": "lan", "ip": "10.0.0.1/24"},
                                                  {"name": "eth2", "network": "wan"}]}}}).save()
    (run / "network.json").write_text(json.dumps({"impair": {"a.eth1": {"delay": "20ms", "loss": "1%"}},
                                                  "links": {"a.eth2": "down"}}))
    saved = run / "web-captures"
    saved.mkdir(mode=0o700)
    (saved / "labctl-cap-7-1.pcapng").write_bytes(b"\x0a\x0d\x0d\x0a" + b"\0" * 60)
    (saved / "labctl-cap-7-1.json").write_text(json.dumps({"id": "labctl-cap-7-1", "label": "a.eth1", "started": 0,
                                                           "stopped": 5, "frames": 0, "bytes": 0, "warnings": []}))
    (saved / "evil.json").write_text(json.dumps({"id": "../../x", "stopped": 1}))  # not a capture id: ignored
    own = bearer(owner_token())
    tools = client.get("/api/lab/eng", headers=own).json()["tools"]
    assert [(n["nic"], n["link"], n["impair_text"]) for n in tools["nics"]] == [
        ("eth1", "up", "delay 20ms, loss 1%"), ("eth2", "down", "")]
    assert [c["id"] for c in tools["captures"]] == ["labctl-cap-7-1"]
    r = client.get("/api/lab/eng/captures/labctl-cap-7-1.pcapng", headers=own)
    assert r.status_code == 200 and r.content.startswith(b"\x0a\x0d\x0d\x0a") and len(r.content) == 64
    assert r.headers["content-disposition"].startswith('attachment; filename="eng-a.eth1-')
    assert client.get("/api/lab/eng/captures/labctl-cap-9-9.pcapng", headers=own).status_code == 404
    assert client.get("/api/lab/eng/captures/evil.pcapng", headers=own).status_code == 404
    r = client.post("/api/lab/eng/impair", headers=own, json={"guest": "a", "nic": "eth9", "impair": None})
    assert r.status_code == 400 and "eth9" in r.json()["error"]
    r = client.post("/api/lab/eng/impair", headers=own, json={"guest": "a", "nic": "eth1", "impair": {"rate": "x"}})
    assert r.status_code == 400 and "rate" in r.json()["error"]
    r = client.post("/api/lab/eng/link", headers=own, json={"guest": "a", "nic": "eth1", "up": "down"})
    assert r.status_code == 400
    r = client.post("/api/lab/eng/captures/labctl-cap-7-1/stop", headers=own)
    assert r.status_code == 400 and "no capture" in r.json()["error"]
    assert "tools" not in client.get("/api/lab/eng", headers=bearer("forged")).text


def test_a_stopped_capture_is_saved_as_pcapng_and_downloads(state: Path) -> None:
    """The stop and download path without QEMU: a capture record whose file holds what QEMU's
    filter writes (classic pcap), stopped through the API (its QEMU is gone: a warning, no error)."""
    import struct as st

    from labctl.live.capture import Capture
    from labctl.state.runstate import LabState, run_dir
    from labctl.web.app import Server
    from labctl.web.tools import Running

    run = run_dir("eng")
    run.mkdir(parents=True, mode=0o700)
    LabState(lab="eng", source="eng.yaml", dir=str(run), backend="qemu", accel="tcg", image={}, started_at="",
             resolved={"guests": {"a": {"nics": [{"name": "eth1", "network": "lan", "model": "e1000",
                                                  "ip": "10.0.0.1/24"}]}}}).save()
    frames = [bytes(range(60)), b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\0" * 28]
    raw = st.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    for i, f in enumerate(frames):
        raw += st.pack("<IIII", 1_700_000_000 + i, 0, len(f), len(f)) + f
    (run / "q.pcap").write_bytes(raw)
    cap = Capture("labctl-cap-42-1", "a", "eth1", "net-a-eth1", str(run / "q.pcap"), os.getpid(), "web")
    server = Server()
    server.tools.running[cap.id] = Running("eng", cap)
    own = bearer(owner_token())
    with TestClient(build_app(server), base_url="http://127.0.0.1:8470") as client:
        assert client.post(f"/api/lab/bea@x/captures/{cap.id}/stop", headers=own).status_code == 400  # not its lab
        r = client.post(f"/api/lab/eng/captures/{cap.id}/stop", headers=own)
        assert r.status_code == 200, r.text
        assert r.json()["frames"] == 2 and r.json()["label"] == "a.eth1"
        assert not (run / "q.pcap").exists()  # QEMU's file goes once saved
        body = client.get(f"/api/lab/eng/captures/{cap.id}.pcapng", headers=own).content
    assert body[:4] == b"\x0a\x0d\x0d\x0a"
    got, pos = [], 0
    while pos < len(body):  # pcapng blocks read here: Enhanced Packet Blocks carry the frames
        btype, blen = st.unpack_from("<II", body, pos)
        if btype == 6:
            caplen = st.unpack_from("<I", body, pos + 20)[0]
            got.append(body[pos + 28:pos + 28 + caplen])
        pos += blen
    assert got == frames
    assert stat.S_IMODE((run / "web-captures").stat().st_mode) == 0o700


def test_access_is_one_policy_for_every_route(record: ClassRecord) -> None:
    """Policy.authorize(principal, action, instance), the table of labctl.web.authz."""
    from labctl.web.authz import (
        CLASS_MANAGE,
        CLASS_VIEW,
        INDEX,
        LAB_CHECK,
        LAB_RESET,
        LAB_TOOLS,
        LAB_VIEW,
        NO_RESETS,
        Policy,
    )

    allow: dict[str, bool] = {}
    policy = Policy(allow)
    owner = Principal(OWNER)
    trainer = Principal(TRAINER, "exlab", students=("ann", "bea"))
    ann = Principal(STUDENT, "exlab", "ann")
    ok = policy.authorize
    assert ok(owner, INDEX) is None and ok(trainer, INDEX) and ok(ann, INDEX) and ok(None, INDEX)
    for action in (CLASS_VIEW, CLASS_MANAGE):
        assert ok(owner, action, "other") is None and ok(trainer, action, "exlab") is None
        assert ok(trainer, action, "other") and ok(ann, action, "exlab")  # another class's trainer, a student
    for action in (LAB_VIEW, LAB_CHECK):
        assert ok(ann, action, "exlab@ann") is None and ok(ann, action, "exlab@bea")
        assert ok(trainer, action, "exlab@bea") is None and ok(trainer, action, "exlab@zed")
        assert ok(trainer, action, "other@ann") and ok(owner, action, "anything@x") is None
    assert ok(ann, LAB_RESET, "exlab@ann") == NO_RESETS and ok(trainer, LAB_RESET, "exlab@ann") is None
    allow["exlab"] = True
    assert ok(ann, LAB_RESET, "exlab@ann") is None and ok(ann, LAB_RESET, "exlab@bea")
    assert ok(owner, LAB_TOOLS, "exlab@ann") is None and ok(trainer, LAB_TOOLS, "exlab@ann") and ok(ann, LAB_TOOLS,
                                                                                                     "exlab@ann")
    assert ok(owner, "no.such.action", "x")


def test_a_trainer_sees_only_their_own_class(client: TestClient, record: ClassRecord, tmp_path: Path) -> None:
    """The trainer of one class is refused every view of another class: its page, its JSON, its
    events and its settings; the owner sees both."""
    out = tmp_path / "other-handouts"
    (out / "cid").mkdir(parents=True, mode=0o700)
    os.chmod(out, 0o700)
    other = ClassRecord("other", "/x/other.yaml", ["cid"], str(out))
    other.create()
    trainer = bearer(class_tokens(record).trainer)
    assert client.get("/api/class/exlab", headers=trainer).status_code in (200, 404)  # its own (404: not up)
    assert client.get("/class/exlab", headers=trainer).status_code == 200
    for path in ("/api/class/other", "/class/other", "/api/events?class=other"):
        assert client.get(path, headers=trainer).status_code == 403, path
    assert client.post("/api/class/other/allow-reset", headers=trainer, json={"allow": True}).status_code == 403
    assert client.get("/api/lab/other@cid", headers=trainer).status_code == 403
    owner = bearer(owner_token())
    assert client.get("/class/other", headers=owner).status_code == 200


def test_the_event_stream_ends_when_its_token_is_revoked(client: TestClient, record: ClassRecord,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A live page's events: the token is authorized again before every event; once the class is taken
    down (its tokens revoked) the stream says so and ends, even though the connection stays open.
    (A stream every 0.1 s, a keepalive after 0.2 s: a stream that goes on is seen within seconds.)"""
    from labctl.web import lab_api

    monkeypatch.setattr(lab_api, "EVENT_PERIOD", 0.1)
    monkeypatch.setattr(lab_api, "KEEPALIVE", 0.2)
    ann = bearer(class_tokens(record).students["ann"])
    seen: list[str] = []
    with client.stream("GET", "/api/events?lab=exlab@ann", headers=ann) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            seen.append(line)
            if line.startswith("data:") and "revoked" not in "".join(seen):
                revoke("exlab")
            if line == "event: revoked":
                break
            assert len(seen) < 50, seen
    assert "event: revoked" in seen and any(s.startswith("data:") for s in seen)
