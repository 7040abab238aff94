"""The host's side of the guest agent's protocol (guest/init runs the other side in real guests:
tests/integration/test_warm_reset.py restores guests whose SSH then works with the new keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

import pytest

from labctl.errors import GuestError
from labctl.up import agent
from labctl.up.agent import PEM_BEGIN, PEM_END, keys_command
from labctl.up.keys import new_keypair


def test_keys_line_carries_the_client_key_and_the_host_keys_pem_body(tmp_path: Path) -> None:
    client = new_keypair(tmp_path / "client", "root@lab")
    host = new_keypair(tmp_path / "host", "g0.lab")
    pem = host.private.read_bytes()
    line = keys_command((client.public_line + "\n").encode(), pem)
    verb, kind, blob, body = line.split(" ")
    assert (verb, kind, blob) == ("keys", "ssh-ed25519", client.public_line.split()[1])
    # what the agent writes back (its printf, with commas turned into newlines) is the key file
    rebuilt = "\n".join([PEM_BEGIN, *body.split(","), PEM_END]) + "\n"
    assert rebuilt.encode() == pem
    assert "\n" not in line and all(c.isalnum() or c in "+/=, -" for c in line)


@pytest.mark.parametrize("auth,host", [
    (b"ssh-rsa AAAA x\n", None),
    (b"ssh-ed25519\n", None),
    (None, b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"),
    (None, b""),
])
def test_keys_that_the_agent_cannot_write_are_refused(tmp_path: Path, auth: bytes | None,
                                                      host: bytes | None) -> None:
    good_auth = (new_keypair(tmp_path / "c", "c").public_line + "\n").encode()
    good_host = new_keypair(tmp_path / "h", "h").private.read_bytes()
    with pytest.raises(GuestError):
        keys_command(auth if auth is not None else good_auth, host if host is not None else good_host)


class FakeQemu:
    """QEMU's side of the pipe chardev (it holds both FIFOs open read-write), with a guest agent
    that answers each line it reads with ``reply(line)`` (None: no answer)."""

    def __init__(self, channel: Path, reply) -> None:  # type: ignore[no-untyped-def]
        import os
        import threading

        from labctl.backends.qemu.machines import agent_fifos

        agent_fifos(channel)
        self.fin = os.open(f"{channel}.in", os.O_RDWR)
        self.fout = os.open(f"{channel}.out", os.O_RDWR)
        self.seen: list[str] = []
        self.reply = reply
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import os

        buf = b""
        while True:
            try:
                chunk = os.read(self.fin, 4096)
            except OSError:
                return
            if not chunk or self.stopping:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.seen.append(line.decode())
                answer = self.reply(line.decode())
                if answer is not None:
                    os.write(self.fout, answer.encode() + b"\n")

    def close(self) -> None:
        """Stop the agent's thread, then close its FIFOs. Closing a descriptor that a thread is
        blocked reading does not wake it: it would read, and write, whatever file gets the numbers
        next (another test's), so the thread is woken through its own FIFO and joined first."""
        import os

        self.stopping = True
        os.write(self.fin, b"\n")
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the fake agent's thread did not stop"
        os.close(self.fout)
        os.close(self.fin)


def test_an_exchange_over_the_fifos_skips_stale_replies_and_waits_for_each_answer(tmp_path: Path) -> None:
    import os

    from labctl.up.agent import exchange, wait_ready

    channel = tmp_path / "agent"
    qemu = FakeQemu(channel, lambda line: f"ok {line.split(' ', 1)[0]}")
    try:
        os.write(qemu.fout, b"ok keys\nok ping\n")  # left over from an abandoned exchange
        exchange(channel, ["clock 1.000000000", "ping"], timeout=5)
        assert qemu.seen == ["clock 1.000000000", "ping"]
        assert wait_ready(channel, 2.0)
    finally:
        qemu.close()


def test_a_refusal_an_unanswered_command_and_no_qemu_are_errors(tmp_path: Path) -> None:
    from labctl.up.agent import exchange, wait_ready

    channel = tmp_path / "agent"
    qemu = FakeQemu(channel, lambda line: "err keys" if line.startswith("keys") else None)
    try:
        with pytest.raises(GuestError, match="refused 'keys'"):
            exchange(channel, ["keys a b c"], timeout=5)
        with pytest.raises(GuestError, match="did not answer 'ping' within"):
            exchange(channel, ["ping"], timeout=0.3)
    finally:
        qemu.close()
    with pytest.raises(GuestError, match="did not answer"):  # the FIFOs are there, nobody holds them
        exchange(channel, ["ping"], timeout=0.3)
    assert not wait_ready(tmp_path / "nothing", 0.2)


def test_the_channel_is_only_ever_a_fifo(tmp_path: Path) -> None:
    from labctl.up.agent import exchange

    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "agent.out").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "agent.in").write_text("")
    with pytest.raises(GuestError):
        exchange(tmp_path / "agent", ["ping"], timeout=0.3)
    assert (tmp_path / "elsewhere").read_text() == "" and (tmp_path / "agent.in").read_text() == ""


def test_a_clock_line_answered_late_is_sent_again_until_one_is_answered_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restored guest busy for a while answers its first clock lines late, each setting a time stale by
    then: the lines go again until one is answered within CLOCK_SLACK (at most CLOCK_TRIES), then the keys."""
    sent: list[str] = []
    clock = [0.0]

    def call(channel: Path, line: str, timeout: float) -> str:
        sent.append(line.split()[0])
        clock[0] += 1.0 if len([s for s in sent if s == "clock"]) <= 3 and line.startswith("clock") else 0.01
        return "ok"

    monkeypatch.setattr(agent, "call", call)
    monkeypatch.setattr(agent.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(agent, "keys_command", lambda *_: "keys x y z")
    agent.adopt(Path("/nonexistent"), (b"a", b"b"))
    assert sent == ["clock", "clock", "clock", "clock", "keys"]
    sent.clear()
    clock[0] = 100.0

    def slow(channel: Path, line: str, timeout: float) -> str:
        sent.append(line.split()[0])
        clock[0] += 1.0
        return "ok"

    monkeypatch.setattr(agent, "call", slow)
    agent.adopt(Path("/nonexistent"), None)
    assert sent == ["clock"] * agent.CLOCK_TRIES  # a guest that stays slow: not for ever


def test_a_clock_set_over_ssh_that_took_long_is_set_again_in_the_same_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a post-boot save, the clock goes over SSH: a command that took longer than SSH_CLOCK_SLACK (a
    loaded host: a cold guest was then 2.4 s behind) set a stale time and is sent again, each with the
    host's time at its sending; a guest that stays slow is not tried for ever; a failure is an error."""
    from labctl import ssh
    from labctl.endpoint import Endpoint
    from labctl.up import warm

    clock = [0.0]
    sent: list[str] = []
    status = [0]
    slow_ones = [2]

    class Res:
        def __init__(self) -> None:
            self.status = status[0]

    class Session:
        sessions = 0

        def __init__(self, ep: Endpoint, timeout: float) -> None:
            Session.sessions += 1

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def run(self, command: str, timeout: float) -> Res:
            sent.append(command.rsplit("labctl_clock ", 1)[1])
            clock[0] += 2.0 if len(sent) <= slow_ones[0] else 0.1
            return Res()

    monkeypatch.setattr(ssh, "Session", Session)
    monkeypatch.setattr(warm.time, "monotonic", lambda: clock[0])
    ticks = iter(range(10**9, 10**10, 10**9))
    monkeypatch.setattr(warm.time, "time_ns", lambda: next(ticks))
    ep = Endpoint("g", 2222, Path("/nonexistent"), Path("/nonexistent"))
    warm.set_clock_over_ssh(ep)
    assert sent == ["1.000000000", "2.000000000", "3.000000000"] and Session.sessions == 1
    sent.clear()
    slow_ones[0] = 10**6
    warm.set_clock_over_ssh(ep)
    assert len(sent) == agent.CLOCK_TRIES
    sent.clear()
    status[0] = 1
    with pytest.raises(GuestError, match="its clock could not be set"):
        warm.set_clock_over_ssh(ep)
