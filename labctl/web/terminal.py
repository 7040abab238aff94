"""Terminals: one interactive shell per lab instance and guest (an SSH channel with a pty, logged in
with the instance's key and pinned host key), shared by every page that shows it.

A :class:`Hub` owns the channel. The student's page writes to it; the trainer's page may look
over their shoulder (read-only: its input is dropped here, on the server) or help (read-write).
Output goes to every subscriber; the last 64 KiB are kept and replayed to a page that connects
or reconnects. Each page's pending output is bounded (:class:`Output`, :data:`PENDING_LIMIT`):
a page that stops reading (its websocket stalled) loses its oldest output and is told so,
while the shell and the other pages go on. A hub nobody watches for :data:`IDLE_CLOSE`
seconds is closed, as is one whose channel ends (the shell exited, the guest went down or was
reset): the pages then reconnect to a new one. While a guest is being reset
(:meth:`Terminals.resetting`) its hubs are closed and no new one is opened: a page that
reconnects meanwhile waits, so that its shell is never a login to the guest on its way out (one
whose channel would take its keystrokes and answer nothing).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import paramiko

from labctl.errors import GuestError
from labctl.ssh import Endpoint, Session

BACKLOG = 64 * 1024
PENDING_LIMIT = 1 << 20  # bytes of output waiting for one page
IDLE_CLOSE = 120.0
CONNECT_TIMEOUT = 10.0
RESET_WAIT = 300.0  # how long a page's login waits for its guest's reset to end
MIN_SIZE, MAX_COLS, MAX_ROWS = 2, 500, 200


def clamp_size(cols: object, rows: object) -> tuple[int, int] | None:
    """A terminal size from a page (numbers within reason), else None."""
    if not isinstance(cols, int) or not isinstance(rows, int) or isinstance(cols, bool) or isinstance(rows, bool):
        return None
    return max(MIN_SIZE, min(cols, MAX_COLS)), max(MIN_SIZE, min(rows, MAX_ROWS))


class Output:
    """A page's output waiting to be sent: at most ``limit`` bytes. When more arrives than the page
    takes (its websocket stopped reading), the oldest goes, and the page gets a line saying how
    much before what follows."""

    def __init__(self, limit: int = PENDING_LIMIT) -> None:
        self.limit = limit
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.dropped = 0
        self.ended = False
        self.ready = asyncio.Event()

    def put_nowait(self, data: bytes | None) -> None:
        """Queue ``data`` (None: the end, after what is queued)."""
        if data is None:
            self.ended = True
        else:
            self.chunks.append(data)
            self.size += len(data)
            while self.size > self.limit:
                over, first = self.size - self.limit, self.chunks[0]
                cut = min(over, len(first))
                if cut == len(first):
                    self.chunks.popleft()
                else:
                    self.chunks[0] = first[cut:]
                self.size -= cut
                self.dropped += cut
        self.ready.set()

    async def get(self) -> bytes | None:
        """What is queued, at once (None once it has ended and nothing is left)."""
        while not self.chunks and not self.dropped:
            if self.ended:
                return None
            self.ready.clear()
            await self.ready.wait()
        out = b"".join(self.chunks)
        self.chunks.clear()
        self.size = 0
        if self.dropped:
            out = (f"\r\n[labctl: {self.dropped} bytes of output dropped: this page fell behind]\r\n"
                   .encode() + out)
            self.dropped = 0
        return out


@dataclass(eq=False)
class Subscriber:
    """One page's view of a hub: its output (bounded; None ends it) and whether it may type."""

    writable: bool
    token: str
    queue: Output = field(default_factory=Output)
    close_code: int = 1000
    close_reason: str = ""

    def end(self, code: int, reason: str) -> None:
        self.close_code, self.close_reason = code, reason
        self.queue.put_nowait(None)


class Hub:
    """One shell on one guest, shared by the pages that show it."""

    def __init__(self, ident: str, guest: str, loop: asyncio.AbstractEventLoop) -> None:
        self.ident, self.guest, self.loop = ident, guest, loop
        self.subscribers: set[Subscriber] = set()
        self.backlog = bytearray()
        self.session: Session | None = None
        self.chan: paramiko.Channel | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self.writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="term-w")
        self.queued = 0  # writes handed to the writer thread and not done yet
        self.fd: int | None = None  # the channel's descriptor the loop watches

    def open(self, ep: Endpoint, cols: int, rows: int) -> None:
        """Log in and start the shell (blocking). :raise GuestError: when the guest cannot be reached."""
        self.session = Session(ep, timeout=CONNECT_TIMEOUT)
        try:
            transport = self.session.client.get_transport()
            if transport is None:
                raise GuestError(f"no SSH transport to {self.guest}")
            transport.set_keepalive(15)
            chan = transport.open_session(timeout=CONNECT_TIMEOUT)
            chan.get_pty(term="xterm-256color", width=cols, height=rows)
            chan.invoke_shell()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.session.close()
            raise GuestError(f"cannot open a shell on {self.guest}: {exc}") from exc
        self.chan = chan

    def start_reading(self) -> None:
        """Read the shell's output in the event loop, woken by the channel's own descriptor (set
        while it holds data or has ended): no thread of its own between the guest and the pages."""
        assert self.chan is not None
        self.fd = self.chan.fileno()
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        chan = self.chan
        if chan is None or self.closed:
            return
        chunks = []
        try:
            while chan.recv_ready():
                chunks.append(chan.recv(32768))
        except (OSError, EOFError, paramiko.SSHException):
            chan.close()
        if chunks:
            self._publish(b"".join(chunks))
        if (chan.eof_received or chan.closed) and not chan.recv_ready():
            self.close(4000, "the shell ended")

    def _publish(self, data: bytes) -> None:
        self.backlog += data
        if len(self.backlog) > BACKLOG:
            del self.backlog[:len(self.backlog) - BACKLOG]
        for sub in self.subscribers:
            sub.queue.put_nowait(data)

    def subscribe(self, writable: bool, token: str) -> Subscriber:
        sub = Subscriber(writable, token)
        if self.backlog:
            sub.queue.put_nowait(bytes(self.backlog))
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers:
            self.idle_since = time.monotonic()

    def write(self, sub: Subscriber, data: bytes) -> bool:
        """Send a page's keystrokes to the shell; False (and nothing sent) for a read-only page."""
        if not sub.writable or self.chan is None or self.closed:
            return False
        chan = self.chan
        if not self.queued and len(data) <= 4096 and chan.send_ready():
            # a keystroke: sent from here (the channel's window has room, so this does not wait)
            try:
                data = data[chan.send(data):]
            except (OSError, EOFError, paramiko.SSHException):
                return True
        if data:  # a long paste, or a full window: the writer thread waits for room, in order
            self.queued += 1
            self.writer.submit(self._send, chan, data).add_done_callback(self._sent)
        return True

    def _sent(self, _: concurrent.futures.Future[None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: serve is ending
            self.loop.call_soon_threadsafe(self._written)

    def _written(self) -> None:
        self.queued -= 1

    @staticmethod
    def _send(chan: paramiko.Channel, data: bytes) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            chan.sendall(data)

    def resize(self, sub: Subscriber, cols: int, rows: int) -> None:
        if sub.writable and self.chan is not None and not self.closed:
            chan = self.chan
            self.writer.submit(lambda: chan.resize_pty(width=cols, height=rows))

    def close(self, code: int = 1001, reason: str = "closed") -> None:
        """End the shell and every page's connection to it (with ``code``)."""
        if self.closed:
            return
        self.closed = True
        if self.fd is not None:
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(self.fd)
            self.fd = None
        for sub in list(self.subscribers):
            sub.end(code, reason)
        self.subscribers.clear()
        self.writer.submit(self._shut, self.chan, self.session)
        self.writer.shutdown(wait=False)

    @staticmethod
    def _shut(chan: paramiko.Channel | None, session: Session | None) -> None:
        with contextlib.suppress(Exception):
            if chan is not None:
                chan.close()
            if session is not None:
                session.close()


@dataclass
class _Held:
    """A guest's resets under way: how many, and set when the last has ended."""
    count: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Terminals:
    """Every open hub, by (instance, guest)."""

    def __init__(self) -> None:
        self.hubs: dict[tuple[str, str], Hub] = {}
        self.locks: dict[tuple[str, str], asyncio.Lock] = {}  # one login at a time per guest, never across
        self.resets: dict[tuple[str, str], _Held] = {}  # guests being reset

    @contextlib.asynccontextmanager
    async def resetting(self, ident: str, guest: str, code: int, reason: str) -> AsyncIterator[None]:
        """While ``ident``'s ``guest`` is reset: its hubs closed (``code``, ``reason``) and no new
        login until the block ends, however it ends (two at once: until both have ended)."""
        key = (ident, guest)
        held = self.resets.setdefault(key, _Held())
        held.count += 1
        self.close_where(lambda i, g: (i, g) == key, code, reason)
        try:
            yield
        finally:
            held.count -= 1
            if not held.count:
                del self.resets[key]
                held.done.set()

    async def _reset_done(self, key: tuple[str, str]) -> None:
        while (held := self.resets.get(key)) is not None:
            try:
                await asyncio.wait_for(held.done.wait(), RESET_WAIT)
            except TimeoutError:
                raise GuestError(f"{key[1]} is still being reset") from None

    async def attach(self, ident: str, guest: str, ep: Endpoint, cols: int, rows: int) -> Hub:
        """The open hub of ``ident``'s ``guest``, opened now if there is none. Pages of the same
        guest wait for one login; another guest's login (one that never answers, say) never
        holds them up: each runs in its hub's own thread, not serve's shared worker pool.

        :raise GuestError: when the shell cannot be opened.
        """
        key = (ident, guest)
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            await self._reset_done(key)
            hub = self.hubs.get(key)
            if hub is not None and not hub.closed:
                return hub
            loop = asyncio.get_running_loop()
            hub = Hub(ident, guest, loop)
            try:
                await loop.run_in_executor(hub.writer, hub.open, ep, cols, rows)
            except BaseException:
                hub.writer.shutdown(wait=False)
                raise
            hub.start_reading()
            self.hubs[key] = hub
            return hub

    def close_where(self, pred: Callable[[str, str], bool], code: int, reason: str) -> int:
        """Close every hub whose (ident, guest) ``pred`` accepts; how many."""
        n = 0
        for key, hub in list(self.hubs.items()):
            if pred(*key):
                hub.close(code, reason)
                self.hubs.pop(key, None)
                n += 1
        return n

    def sweep(self) -> None:
        """Forget closed hubs; close those nobody watched for a while."""
        now = time.monotonic()
        for key, hub in list(self.hubs.items()):
            if not hub.closed and not hub.subscribers and now - hub.idle_since > IDLE_CLOSE:
                hub.close()
            if hub.closed:
                self.hubs.pop(key, None)
        for key, lock in list(self.locks.items()):
            if key not in self.hubs and not lock.locked():
                del self.locks[key]

    def close_all(self) -> None:
        for hub in list(self.hubs.values()):
            hub.close(1001, "the server is stopping")
        self.hubs.clear()
