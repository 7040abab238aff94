"""Per-lab SSH keys: a client key for root and a host key for every guest.

Both are fresh ed25519 keys made when a lab comes up; the host key is pinned
in the lab's known_hosts so that labctl never trusts on first use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public_line: str  # "ssh-ed25519 AAAA... comment"


def new_keypair(path: Path, comment: str) -> KeyPair:
    """Write a new ed25519 private key (0600, OpenSSH format) and ``path``.pub."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                        serialization.PublicFormat.OpenSSH).decode()
    line = f"{pub} {comment}"
    path.with_name(path.name + ".pub").write_text(line + "\n")
    return KeyPair(path, line)


def known_hosts_line(port: int, host_public_line: str) -> str:
    """A known_hosts entry for a guest's SSH endpoint on 127.0.0.1:port."""
    kind, blob = host_public_line.split()[:2]
    return f"[127.0.0.1]:{port} {kind} {blob}"
