"""The host's side of the guest agent's protocol (guest/init runs the other side in real guests:
tests/integration/test_warm_reset.py restores guests whose SSH then works with the new keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.errors import GuestError
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
