"""Issue 34 (safe on a shared host, round three), each finding's attack performed for real.

A throwaway system user (``labctl-r3-NNNNN``, made by ``useradd``, removed by ``userdel`` after
the module) plays the other local user; root runs labctl. One class of two students (``r3@ann``,
``r3@bea``, one guest each, with a writable share) is brought up once for the module and shared
by every finding that needs a guest:

1. shares: a lab file (another user's, or root's own) cannot share root's files; a writable
   share shows the guest only a new directory, never the files already there.
2. serve's handouts: a student's link to /etc/shadow is not followed, a FIFO blocks nothing.
3. a websocket that stops reading while its guest floods the terminal: serve's memory stays flat.
4. a guest whose sshd never answers holds up no other student's terminal.
5. bisect --continue and --work trust no bundle, state or work directory another user could write.
6. the trainer's token reaches the class's current students only.
7. ``cp --max-size`` caps entries as well as bytes (a step's copy-back: in test_security.py).
8. a link with a token, opened by another site, signs no browser in (login CSRF); a libvirt class's
   shared state: a second user squatting a guest's SSH port around its restore gets no handover
   (checked, not real: the restored QEMU binds the port itself; shown with QEMU and that user).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import http.server
import json
import os
import pwd
import random
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests import harness
from tests.conftest import Cli, new_cli

playwright_sync = pytest.importorskip("playwright.sync_api")
websockets_client = pytest.importorskip("websockets.asyncio.client")
websockets_errors = pytest.importorskip("websockets.exceptions")
CHROMIUM = "/usr/bin/chromium"
T = TypeVar("T")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a second user is made")

NAME = "r3"
STUDENTS = ("ann", "bea")
LAB = """\
name: r3
networks: {{}}
guests:
  a:
    shares:
      - {{host: {share}, mount: /mnt/out, writable: true}}
"""


@pytest.fixture(scope="module")
def shared_tmp() -> Iterator[Path]:
    """A directory like /tmp (1777) where the other user can make things (pytest's are root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="labctl-r3-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


@pytest.fixture(scope="module")
def evil(shared_tmp: Path) -> Iterator[pwd.struct_passwd]:
    """The other local user, with a home of its own in ``shared_tmp``."""
    name = f"labctl-r3-{random.randrange(10000, 99999)}"
    home = shared_tmp / "home"
    subprocess.run(["useradd", "-r", "-m", "-d", str(home), "-s", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def as_evil(user: pwd.struct_passwd, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user.pw_name, "--", *argv], check=True, cwd="/", capture_output=True,
                          text=True)


@dataclass
class Klass:
    """The module's class: its lab file, the writable share's host directory, the handouts."""

    cli: Cli
    lab: Path
    share: Path
    out: Path


@pytest.fixture(scope="module")
def klass(image: object, tmp_path_factory: pytest.TempPathFactory, shared_tmp: Path) -> Iterator[Klass]:
    d = tmp_path_factory.mktemp("r3class")
    share = d / "results"  # root's, holding root's files: what a guest must never change
    (share / "cron.d").mkdir(parents=True)
    (share / "authorized_keys").write_text("ssh-ed25519 AAAA root@host\n")
    lab = d / "r3.yaml"
    lab.write_text(LAB.format(share=share))
    roster = d / "roster.txt"
    roster.write_text("\n".join(STUDENTS) + "\n")
    cli = new_cli(tmp_path_factory, "r3")
    assert cli.tracked is not None
    cli.tracked.test = f"klass (first used by {harness.current_test()})"
    try:
        out = shared_tmp / "handouts"  # where the students can reach their own
        up = cli("class", "up", str(lab), "--roster", str(roster), "--out", str(out), "--accel", "tcg", "--cold",
                 timeout=1200)
        assert up.returncode == 0, up.stdout + up.stderr
        yield Klass(cli, lab, share, out)
    finally:
        cli("class", "down", timeout=300)
        harness.teardown(cli.tracked)


# -- 1. shares ----------------------------------------------------------------------------------

def test_a_lab_file_cannot_share_roots_files(evil: pwd.struct_passwd, shared_tmp: Path, cli: Cli) -> None:
    secret = shared_tmp / "root-only"  # a directory of root's only root may read
    secret.mkdir(mode=0o700)
    (secret / "key").write_text("root's secret\n")
    public = shared_tmp / "roots"  # root's, readable by all
    public.mkdir(mode=0o755)
    theirs = shared_tmp / "theirs"
    as_evil(evil, "mkdir", "-m", "755", str(theirs))
    cache = Path(os.environ.get("LABCTL_CACHE_DIR") or Path.home() / ".cache" / "labctl")
    names = {"/etc": "it is the system directory /etc", "/": "the host's root directory",
             str(public): "belongs to root (uid 0), and the lab file to " + evil.pw_name,
             str(cache): "labctl's cache", str(cli.state_dir): "labctl's state directory",
             str(secret): "belongs to root (uid 0)", str(Path.home()): "your whole home directory"}
    shares = "".join(f"      - {{host: '{h}', mount: /mnt/s{i}, writable: {str(i % 2 == 0).lower()}}}\n"
                     for i, h in enumerate(names))
    text = f"name: r3evil\nnetworks: {{}}\nguests:\n  a:\n    shares:\n{shares}"
    subprocess.run(["runuser", "-u", evil.pw_name, "--", "sh", "-c", f"cat > {theirs}/lab.yaml"], input=text,
                   text=True, check=True, cwd="/")
    # root runs the other user's lab file, even trusting that user's directories
    res = cli("up", str(theirs / "lab.yaml"), "--accel", "tcg", "--trust-dir", str(shared_tmp))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    for i, (host, why) in enumerate(names.items()):
        line = f"lab.yaml:{6 + i}: guests.a.shares[{i}].host: host directory {Path(host).resolve()}"
        assert line in res.stderr and why in res.stderr.split(line, 1)[1].splitlines()[0], (line, res.stderr)
    assert not (cli.state_dir / "labs" / "r3evil").exists()
    # root's own lab file: the system, another user's home and labctl's own directories stay out too
    own = shared_tmp / "own.yaml"
    own.write_text(text.replace("      - {host: '/',", f"      - {{host: '{evil.pw_dir}/x',")
                   .replace(str(secret), "/usr/share"))
    Path(evil.pw_dir, "x").mkdir()
    res = cli("validate", str(own))
    assert res.returncode == 2, res.stdout + res.stderr
    for why in ("system directory /etc", f"is in the home directory of {evil.pw_name}", "labctl's cache",
                "labctl's state directory", "system directory /usr", "your whole home directory"):
        assert why in flat(res.stderr), (why, res.stderr)
    assert str(public) not in flat(res.stderr)  # root's own lab file may share root's own directory


def flat(text: str) -> str:
    """``text`` with its lines joined (the CLI wraps its errors to the terminal's width)."""
    return " ".join(text.split())


def _exported(cli: Cli, ident: str) -> Path:
    """The directory guest a of ``ident`` sees at /mnt/out (labctl status --json)."""
    labs = json.loads(cli("status", ident, "--json", check=True).stdout)["labs"]
    return Path(labs[0]["guests"][0]["shares"][0]["dir"])


def _exec(cli: Cli, ident: str, command: str) -> subprocess.CompletedProcess[str]:
    return cli("exec", ident, "a", "--timeout", "60", "--", "sh", "-c", command, timeout=120)


def test_a_writable_share_shows_the_guest_only_a_new_directory(klass: Klass) -> None:
    before = {p: p.read_bytes() for p in klass.share.rglob("*") if p.is_file()}
    exported = _exported(klass.cli, f"{NAME}@ann")
    assert exported.parent == klass.share and exported.name.startswith(f"{NAME}@ann-a-")
    # the guest, root there, goes for what it finds in the share
    res = _exec(klass.cli, f"{NAME}@ann", "ls -A /mnt/out; echo 'ssh-ed25519 AAAA evil' >> /mnt/out/authorized_keys; "
                                          "mkdir -p /mnt/out/cron.d && echo '* * * * * root id' > /mnt/out/cron.d/x; "
                                          "chmod 4755 /mnt/out/cron.d/x; echo done")
    assert res.returncode == 0 and res.stdout.split() == ["done"], res.stdout + res.stderr  # it saw nothing
    assert {p: p.read_bytes() for p in klass.share.rglob("*") if p.is_file() and exported not in p.parents} == before
    assert not (klass.share / "cron.d" / "x").exists()
    made = exported / "cron.d" / "x"  # what it wrote is in its own directory: a plain 0600 file of root's
    assert made.read_text() == "* * * * * root id\n" and made.stat().st_mode & 0o7777 == 0o600
    assert (exported / "authorized_keys").read_text() == "ssh-ed25519 AAAA evil\n"
    assert _exported(klass.cli, f"{NAME}@bea") not in (exported, klass.share)  # each instance its own


# -- serve ----------------------------------------------------------------------------------------

@dataclass
class Served:
    proc: subprocess.Popen[str]
    urls: dict[str, str]

    @property
    def base(self) -> str:
        return self.urls["base"]

    def token(self, who: str) -> str:
        return self.urls[who].split("?t=", 1)[1]

    def raw(self, who: str, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {self.token(who)}"},
                            timeout=timeout)


@contextlib.contextmanager
def serving(klass: Klass) -> Iterator[Served]:
    """A new ``labctl serve`` of the class (no terminal open yet)."""
    from tests.integration.test_web_tools import read_serve

    with klass.cli.running("serve", "--listen", "127.0.0.1:0") as proc:
        yield Served(proc, read_serve(proc, {*STUDENTS, "trainer", "base"}))


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` in a thread of its own (Playwright's sync API keeps a loop in this one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def chromium(pw: Any) -> Any:
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])


# -- 2. handouts --------------------------------------------------------------------------------

def test_a_students_handout_is_never_read_through_a_link_or_a_fifo(klass: Klass, evil: pwd.struct_passwd) -> None:
    handout = klass.out / "ann"
    subprocess.run(["chown", "-R", f"{evil.pw_uid}:{evil.pw_gid}", str(handout)], check=True)  # given to ann
    shadow_line = Path("/etc/shadow").read_text().splitlines()[0]
    with serving(klass) as served, served.raw("ann") as ann, served.raw("bea") as bea:
        assert "Your own copy of the lab" in ann.get(f"/api/lab/{NAME}@ann").json()["handout"]
        as_evil(evil, "ln", "-sfn", "/etc/shadow", str(handout / "README.md"))
        view = ann.get(f"/api/lab/{NAME}@ann").json()
        assert view["handout"] == "" and "symbolic link" in view["handout_note"], view
        assert shadow_line not in json.dumps(view)
        as_evil(evil, "rm", str(handout / "README.md"))
        as_evil(evil, "mkfifo", str(handout / "README.md"))
        # more requests than serve has worker threads: none may hang on the FIFO
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            views = list(pool.map(lambda _: ann.get(f"/api/lab/{NAME}@ann").json(), range(8)))
        assert all(v["handout_note"] == "the handout is not shown: README.md is not a regular file" for v in views)
        assert bea.get(f"/api/lab/{NAME}@bea").json()["handout"]  # another student's page answers
        with playwright_sync.sync_playwright() as pw:  # the page says why
            browser = chromium(pw)
            page = browser.new_page()
            page.goto(served.urls["ann"])
            playwright_sync.expect(page.locator("#handout-note")).to_have_text(
                "the handout is not shown: README.md is not a regular file", timeout=30_000)
            browser.close()
        as_evil(evil, "rm", str(handout / "README.md"))
        as_evil(evil, "sh", "-c", f"head -c 1000000 /dev/zero | tr '\\0' x > {handout / 'README.md'}")
        view = ann.get(f"/api/lab/{NAME}@ann").json()
        assert len(view["handout"]) == 64 * 1024 and "only its start" in view["handout_note"]


# -- 3. a terminal's output queue -----------------------------------------------------------------

def _rss(pid: int) -> int:
    """Resident memory of ``pid``, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _stalled_terminal(served: Served, who: str, ident: str) -> socket.socket:
    """A websocket to ``ident``'s terminal that will never read (a small receive buffer, no reader)."""
    port = int(served.base.rsplit(":", 1)[1])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /ws/term/{ident}/a?mode=rw&cols=80&rows=24 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {served.token(who)}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    first = s.recv(2)  # its first frame: the mode, sent once the shell is open
    assert first[0] == 0x81 and first[1] < 126, first
    mode = b""
    while len(mode) < first[1]:
        mode += s.recv(first[1] - len(mode))
    assert json.loads(mode) == {"mode": "rw"}, mode
    return s


def _send_frame(s: socket.socket, payload: bytes) -> None:
    """One masked binary websocket frame (what a page sends for keystrokes)."""
    mask = os.urandom(4)
    assert len(payload) < 126
    s.sendall(struct.pack("!BB", 0x82, 0x80 | len(payload)) + mask
              + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def test_a_terminal_that_stops_reading_keeps_serves_memory_flat(klass: Klass) -> None:
    ident = f"{NAME}@bea"
    with serving(klass) as served:
        sock = _stalled_terminal(served, "bea", ident)
        try:
            before = _rss(served.proc.pid)
            # 16 MiB of random bytes as base64: 22 MB of output for a page that reads none of it
            _send_frame(sock, b"head -c 16M /dev/urandom | base64; touch /root/flood-done\r")
            deadline = time.monotonic() + 900
            while _exec(klass.cli, ident, "test -f /root/flood-done").returncode != 0:
                assert time.monotonic() < deadline, "the guest never finished writing"
                time.sleep(2)
            grew = _rss(served.proc.pid) - before
        finally:
            sock.close()
        _exec(klass.cli, ident, "rm -f /root/flood-done")
    print(f"serve's RSS grew {grew / 2**20:.1f} MiB while 22 MB went to a page that did not read")
    assert grew < 10 << 20, f"serve's memory grew {grew / 2**20:.1f} MiB"


# -- 4. one guest's SSH login --------------------------------------------------------------------

def test_a_guest_whose_sshd_never_answers_holds_up_no_other_terminal(klass: Klass) -> None:
    # ann's sshd stops listening for 25 s (a new connection gets no banner), then goes on
    res = _exec(klass.cli, f"{NAME}@ann", "read -r p < /run/sshd.pid && kill -STOP $p && "
                                          "setsid sh -c \"sleep 25; kill -CONT $p\" </dev/null >/dev/null 2>&1 &")
    assert res.returncode == 0, res.stdout + res.stderr
    with serving(klass) as served:
        ws_base = served.base.replace("http", "ws")

        def connect(who: str, ident: str) -> Any:
            return websockets_client.connect(f"{ws_base}/ws/term/{ident}/a",
                                             additional_headers={"Authorization": f"Bearer {served.token(who)}"},
                                             open_timeout=30)

        async def go() -> tuple[bool, str]:
            async with connect("ann", f"{NAME}@ann") as ann:
                await asyncio.sleep(1)  # ann's login under way: waiting for a banner that never comes
                async with connect("bea", f"{NAME}@bea") as bea:
                    first = json.loads(await asyncio.wait_for(bea.recv(), 60))
                    ann_pending = True
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ann.recv(), 0.05)
                        ann_pending = False
                    assert first == {"mode": "rw"}, first
                try:
                    ann_end = str(await asyncio.wait_for(ann.recv(), 60))
                except websockets_errors.ConnectionClosed as exc:
                    ann_end = f"closed {exc}"
                return ann_pending, ann_end

        ann_pending, ann_end = run_async(go())
    assert ann_pending, "bea's terminal opened only once ann's login had failed"
    assert "cannot SSH" in ann_end or "error" in ann_end, ann_end
    # ann's sshd goes on by itself 25 s after it stopped: the tests after this one need only bea's


# -- 6. the trainer's token ----------------------------------------------------------------------

def test_the_trainers_token_reaches_the_current_students_only(klass: Klass) -> None:
    record_path = klass.cli.state_dir / "classes" / f"{NAME}.json"
    record = record_path.read_text()
    with serving(klass) as served, served.raw("trainer") as trainer:
        ws_base = served.base.replace("http", "ws")

        async def terminal(ident: str) -> int:
            try:
                async with websockets_client.connect(
                        f"{ws_base}/ws/term/{ident}/a", open_timeout=30,
                        additional_headers={"Authorization": f"Bearer {served.token('trainer')}"}) as ws:
                    await ws.recv()
                    return 101
            except websockets_errors.InvalidStatus as exc:
                return int(exc.response.status_code)

        assert run_async(terminal(f"{NAME}@bea")) == 101  # a student's, read-write
        assert trainer.get(f"/api/lab/{NAME}@zed").status_code == 403  # the owner's own instance
        try:  # bea leaves the roster (her instance stays up)
            data = json.loads(record)
            data["students"] = ["ann"]
            record_path.write_text(json.dumps(data))
            time.sleep(1.5)  # serve looks at the record again (its answers live 1 s)
            assert trainer.get(f"/api/lab/{NAME}@bea").status_code == 403
            assert run_async(terminal(f"{NAME}@bea")) == 403
            assert trainer.get(f"/api/lab/{NAME}@ann").status_code == 200
        finally:
            record_path.write_text(record)


# -- 8. login CSRF ----------------------------------------------------------------------------------

@contextlib.contextmanager
def attacker_site(link: str) -> Iterator[str]:
    """Another origin (another port of this host) whose page links to ``link``."""
    body = f'<!doctype html><a id="go" href="{link}">a prize</a>'.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def test_another_sites_link_with_a_token_signs_no_browser_in(klass: Klass) -> None:
    with serving(klass) as served, attacker_site(served.urls["ann"]) as evil_page, \
            playwright_sync.sync_playwright() as pw:
        browser = chromium(pw)
        ctx = browser.new_context()
        page = ctx.new_page()
        page.set_default_timeout(30_000)
        page.goto(served.urls["bea"])  # bea signs in with her own link
        assert page.url == f"{served.base}/lab/{NAME}@bea"
        page.goto(evil_page)
        page.click("#go")  # ann's link, from another site
        playwright_sync.expect(page.locator("body")).to_contain_text("Another site opened it")
        assert [c["value"] for c in ctx.cookies() if c["name"] == "labctl_token"] == [served.token("bea")]
        page.goto(served.base + "/")
        assert page.url == f"{served.base}/lab/{NAME}@bea", page.url  # still bea
        page.goto(evil_page)
        page.click("#go")
        page.click("a")  # followed from serve's own page: that is ann's choice
        page.wait_for_url(f"{served.base}/lab/{NAME}@ann")
        browser.close()


# -- 5. bisect's bundle, state and work directory ------------------------------------------------------

def _repo(d: Path) -> list[str]:
    """A small git history with a kernel tree's .config and Makefile: its two commits."""
    d.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    shas = []
    for i in range(2):
        (d / "Makefile").write_text(f"all:\n\t@echo {i}\n")
        (d / ".config").write_text("CONFIG_X=y\n")
        for args in ([] if i else [["init", "-q", "-b", "main"]]) + [["add", "-A"], ["commit", "-q", "-m", f"c{i}"]]:
            subprocess.run(["git", "-C", str(d), *args], check=True, env=env, capture_output=True)
        shas.append(subprocess.run(["git", "-C", str(d), "rev-parse", "HEAD"], check=True, capture_output=True,
                                   text=True).stdout.strip())
    return shas


def test_bisect_trusts_no_bundle_state_or_work_directory_of_another_user(
        evil: pwd.struct_passwd, shared_tmp: Path, cli: Cli, tmp_path: Path) -> None:
    victim = shared_tmp / "victim"  # root's: what a planted state's "work" would have root delete
    (victim / "wt").mkdir(parents=True)
    (victim / "wt" / "precious").write_text("root's\n")
    quickstart = str(Path(__file__).resolve().parents[2] / "labs" / "quickstart.yaml")
    state = {"version": 1, "lab_file": quickstart, "tree": str(tmp_path), "good": "a" * 40, "bad": "b" * 40,
             "oracle": {"kind": "panic"}, "work": str(victim), "trust_dirs": []}
    theirs = shared_tmp / "evil-bundle"
    as_evil(evil, "mkdir", "-m", "755", str(theirs))
    subprocess.run(["runuser", "-u", evil.pw_name, "--", "sh", "-c", f"cat > {theirs}/state.json"],
                   input=json.dumps(state), text=True, check=True, cwd="/")
    for args in (("--continue", str(theirs)), ("--log", str(theirs))):
        res = cli("bisect", *args)
        assert res.returncode == 3 and "refusing" in res.stderr and str(theirs) in flat(res.stderr), res.stderr
        assert "Traceback" not in res.stderr
    open_bundle = shared_tmp / "open-bundle"  # root's, but anyone may write in it
    open_bundle.mkdir(mode=0o777)
    open_bundle.chmod(0o777)
    (open_bundle / "state.json").write_text(json.dumps(state))
    res = cli("bisect", "--continue", str(open_bundle))
    assert res.returncode == 3 and "writable by other users" in flat(res.stderr), res.stderr
    assert (victim / "wt" / "precious").read_text() == "root's\n"

    # root's own bundle whose state says to trust the other user's kernel tree: it does not widen trust
    tree = shared_tmp / "evil-tree"
    as_evil(evil, "mkdir", "-m", "755", str(tree))
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"name: r3bis\nkernel: {{tree: {tree}}}\nnetworks: {{}}\nguests:\n  a: {{}}\n")
    mine = tmp_path / "bundle"
    mine.mkdir()
    (mine / "state.json").write_text(json.dumps({**state, "lab_file": str(lab), "tree": str(tree),
                                                 "work": str(tmp_path / "work"), "trust_dirs": [str(tree)]}))
    res = cli("bisect", "--continue", str(mine))
    assert res.returncode == 2 and f"kernel tree {tree} is not trusted" in flat(res.stderr), res.stdout + res.stderr

    # a shared --work with a "prepared kernel" and a ready worktree planted in it
    work = shared_tmp / "work"
    as_evil(evil, "mkdir", "-m", "755", str(work))
    as_evil(evil, "sh", "-c", f"mkdir {work}/wt && touch {work}/wt/.git && echo x > {work}/wt.ready && "
                              f"echo '{{}}' > {work}/builds.json")
    good, bad = _repo(tmp_path / "linux")
    out = tmp_path / "out"
    res = cli("bisect", quickstart, "--tree", str(tmp_path / "linux"), "--good", good, "--bad", bad, "--panic",
              "--work", str(work), "--out", str(out))
    assert res.returncode == 3 and "refusing" in res.stderr and str(work) in flat(res.stderr), res.stdout + res.stderr
    assert not (out / "state.json").exists()


# -- 7. copies capped in entries ---------------------------------------------------------------------
# (a step's copy-back: test_security.py's hostile guest, whose run has steps, makes 10 050 files)

def test_cp_max_size_caps_entries_as_well_as_bytes(klass: Klass, tmp_path: Path) -> None:
    assert _exec(klass.cli, f"{NAME}@bea", "mkdir -p /root/few && cd /root/few && touch $(seq 10)").returncode == 0
    res = klass.cli("cp", f"{NAME}@bea", "a:/root/few", str(tmp_path), "--max-size", "1K", "--json")
    got = json.loads(res.stdout)  # ten empty files: no data, but 512 bytes of tar header each
    assert res.returncode == 1 and got["files"] <= 2, res.stdout + res.stderr
    assert "over the copy budget of 1 KiB" in got["skipped"][-1]["reason"], got["skipped"]
    assert sum(len(files) for _, _, files in os.walk(tmp_path / "few")) == got["files"]


# -- 8. a libvirt class's shared state: a squatted SSH port --------------------------------------------
# Checked, not real. A student may dig the shared state's throwaway host key out of their own guest
# (its RAM and disk came from that state; the first instance of a host even has it in fw_cfg), but
# the only use labctl makes of it is the key handover after a restore, over the guest's SSH port,
# and that port is QEMU's own from the restore on: libvirt's QEMU binds it with the management NIC
# (labctl's mgmt_nic_args, as below) before labctl connects. A port squatted between the stop and
# the restore makes the restore fail (nothing handed over); once QEMU holds it, nobody else can
# listen there. What that rests on is shown with the real QEMU and a real second user: the full
# class (docs/training.md, test_libvirt_class.py) needs libvirtd.

_SQUAT = """\
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
    print("listening", flush=True)
except OSError as exc:
    print(f"refused: {exc.strerror}", flush=True)
s.settimeout(float(sys.argv[2]))
try:
    c, _ = s.accept()
    print("got", c.recv(64), flush=True)
except OSError:
    print("nothing", flush=True)
"""


def _squat(user: pwd.struct_passwd, port: int, wait: float) -> subprocess.Popen[str]:
    """The other user binding ``port`` (SO_REUSEADDR, as a squatter would) and listening, for ``wait``
    seconds; its first line says whether it listens, its last whether a connection came."""
    p = subprocess.Popen(["python3", "-c", _SQUAT, str(port), str(wait)], user=user.pw_uid, group=user.pw_gid,
                         extra_groups=[], stdout=subprocess.PIPE, text=True, cwd="/")  # no runuser: kill() ends it
    assert p.stdout is not None
    return p


def _qemu_with_ssh_port(port: int) -> subprocess.Popen[str]:
    from types import SimpleNamespace

    from labctl.backends.qemu.argv import mgmt_nic_args

    args = mgmt_nic_args(SimpleNamespace(ssh_port=port, mgmt_mac="52:54:00:12:34:56"))  # type: ignore[arg-type]
    return subprocess.Popen(["qemu-system-x86_64", "-machine", "q35", "-nodefaults", "-display", "none", "-S",
                             "-monitor", "none", *args], stderr=subprocess.PIPE, text=True)


def test_a_squatted_ssh_port_never_takes_a_restored_guests_keys(evil: pwd.struct_passwd) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    # the other user takes the port in the moment a reset has stopped the guest's QEMU
    squatter = _squat(evil, port, 30)
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "listening"
    qemu = _qemu_with_ssh_port(port)  # the restore: QEMU will not start, so no handover is tried
    try:
        _, err = qemu.communicate(timeout=60)  # it exits at once (a bound only for a QEMU that started)
    except subprocess.TimeoutExpired:
        qemu.kill()
        err = qemu.communicate()[1]
        pytest.fail(f"QEMU started with its SSH port taken by another user: {err}")
    finally:
        squatter.kill()
        squatter.wait()
    assert qemu.returncode != 0 and "host forwarding rule" in err, (qemu.returncode, err)
    # the port free again: QEMU binds it, and holds it against the other user from then on
    qemu = _qemu_with_ssh_port(port)
    try:
        deadline = time.monotonic() + 60
        while True:  # QEMU listening (-S: the machine does not run; the forward is bound already)
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert qemu.poll() is None and time.monotonic() < deadline, "QEMU never bound the port"
            time.sleep(0.2)
        squatter = _squat(evil, port, 3)
        assert squatter.stdout is not None
        first = squatter.stdout.readline().strip()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:  # what labctl's handover does
            conn.sendall(b"SSH-2.0-labctl\r\n")
        last = squatter.stdout.read().strip()
        squatter.wait(timeout=30)
    finally:
        qemu.kill()
        qemu.wait()
    assert first == "refused: Address already in use", first
    assert last == "nothing", last
