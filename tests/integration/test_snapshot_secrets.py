"""No instance's secret lives in a post-boot snapshot (security issue 19, item 6).

Three instances of a one-guest lab: the first boots (with a throwaway host key) and takes the
snapshot, the other two are restored from it. Every instance's host key (its ed25519 seed, and
the base64 lines of its OpenSSH file) and the lab's client key are searched for in the
snapshot's state, memory file and disk, and in each running guest's whole RAM (QMP ``pmemsave``): no
snapshot holds any of them, and no guest's RAM holds another instance's. That the search finds
what is there is shown on the throwaway key: its seed is recovered from the snapshot's RAM
(32 bytes followed by the public key it derives), and each guest's own seed is found in its RAM.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from labctl.backends.monitor import qmp_execute
from labctl.up.snapshots import snapshots_root
from tests.conftest import Cli
from tests.integration.conftest import qemu_pids_under

LAB = """\
name: secrets
networks: {{lan: {{}}}}
guests:
  g:
    memory: {memory}
    setup: ["echo {token} > /root/token"]
    nics:
      - {{name: eth1, model: virtio-net-pci, network: lan, ip: 10.64.0.1/24}}
"""
MEMORY = 512
INSTANCES = ("i1", "i2", "i3")


def _raw(key: Ed25519PrivateKey) -> tuple[bytes, bytes]:
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return seed, pub


def needles(key_file: Path) -> tuple[bytes, list[bytes]]:
    """A private key file's ed25519 seed, and every form of its secret to search for: the raw
    seed and each base64 line of its OpenSSH file but the first (which every ed25519 key shares)."""
    pem = key_file.read_bytes()
    key = serialization.load_ssh_private_key(pem, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    seed, _ = _raw(key)
    body = [ln.strip() for ln in pem.splitlines() if ln.strip() and not ln.startswith(b"-----")]
    return seed, [seed, *body[1:]]


def found(data: bytes, patterns: dict[str, list[bytes]]) -> set[str]:
    """The names whose needles occur in ``data`` (one pass)."""
    owner = {n: name for name, ns in patterns.items() for n in ns}
    rx = re.compile(b"|".join(re.escape(n) for n in sorted(owner, key=len, reverse=True)))
    return {owner[m.group(0)] for m in rx.finditer(data)}


MAGIC = base64.b64encode(b"openssh-key-v1\0")[:19]  # how an OpenSSH private key file's body starts
BODY = re.compile(re.escape(MAGIC) + rb"[A-Za-z0-9+/=,\r\n]{200,2000}")


def _string(blob: bytes, at: int) -> tuple[bytes, int]:
    n = int.from_bytes(blob[at:at + 4], "big")
    if at + 4 + n > len(blob):
        raise ValueError("truncated")
    return blob[at + 4:at + 4 + n], at + 4 + n


def recovered_keys(data: bytes) -> set[bytes]:
    """The public keys of every unencrypted ed25519 private key that can be recovered whole from
    ``data`` (the attack of the issue): OpenSSH key files as text (in the page cache, on a disk,
    in a shell's variables; lines split by newlines or commas), each checked by deriving its
    public key from the seed found."""
    out = set()
    for m in BODY.finditer(data):
        text = re.sub(rb"[,\r\n]", b"", m.group(0)).split(b"=")[0]
        text = text[:len(text) // 4 * 4]
        try:
            blob = base64.b64decode(text)
            at = len(b"openssh-key-v1\0")
            cipher, at = _string(blob, at)
            _, at = _string(blob, at)  # kdf name
            _, at = _string(blob, at)  # kdf options
            at += 4  # number of keys
            _, at = _string(blob, at)  # public key blob
            priv, _ = _string(blob, at)
            if cipher != b"none":
                continue
            at = 8  # two check integers
            kind, at = _string(priv, at)
            pub, at = _string(priv, at)
            secret, at = _string(priv, at)
        except (ValueError, IndexError):
            continue
        if kind == b"ssh-ed25519" and len(secret) == 64 and _raw(Ed25519PrivateKey.from_private_bytes(secret[:32]))[1] == pub:
            out.add(pub)
    return out


def _pub(key_file: Path) -> bytes:
    key = serialization.load_ssh_private_key(key_file.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return _raw(key)[1]


def _status(cli: Cli, lab: str) -> dict:
    (data,) = json.loads(cli("status", lab, "--json", check=True).stdout)["labs"]
    return data


def _served_host_key(port: int) -> bytes:
    """The raw ed25519 host key that the sshd on 127.0.0.1:port presents."""
    t = paramiko.Transport(("127.0.0.1", port))
    try:
        t.get_security_options().key_types = ["ssh-ed25519"]
        t.start_client(timeout=30)
        blob = t.get_remote_server_key().asbytes()
    finally:
        t.close()
    return blob[-32:]  # string "ssh-ed25519", string key (32 bytes)


@pytest.fixture
def instances(cli: Cli, image: object, tmp_path: Path) -> Iterator[tuple[Path, dict[str, Path]]]:
    lab = tmp_path / "secrets.yaml"
    # A token of its own: the snapshot's key is new, so the first instance boots and takes it.
    lab.write_text(LAB.format(memory=MEMORY, token=uuid.uuid4().hex))
    snap_dirs: list[Path] = []
    try:
        dirs = {}
        for i, inst in enumerate(INSTANCES):
            up = cli("up", str(lab), "--accel", "tcg", "--instance", inst)
            assert up.returncode == 0, up.stderr
            ident = f"secrets@{inst}"
            started = {g["started_from"] for g in _status(cli, ident)["guests"]}
            assert started == ({"boot"} if i == 0 else {"snapshot"}), (inst, started)
            dirs[inst] = cli.state_dir / "labs" / ident
            if i == 0:
                key = json.loads((dirs[inst] / "state.json").read_text())["snapshots"]["g"]
                snap_dirs.append(snapshots_root() / key)
        yield snap_dirs[0], dirs
    finally:
        for inst in INSTANCES:
            if (cli.state_dir / "labs" / f"secrets@{inst}").exists():
                assert cli("down", f"secrets@{inst}").returncode == 0
        for d in snap_dirs:  # a new token every run: nothing will use it again
            shutil.rmtree(d, ignore_errors=True)
        assert qemu_pids_under(cli.state_dir) == []


def test_no_instances_key_is_in_the_snapshot_or_in_another_instances_ram(
        cli: Cli, instances: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    snap, dirs = instances
    # the snapshot's RAM is its memory file (every restore maps it), its state the devices' (issue 52)
    state, disk = (snap / "state").read_bytes() + (snap / "memory").read_bytes(), (snap / "disk.qcow2").read_bytes()
    meta = json.loads((snap / "meta.json").read_text())
    keys: dict[str, list[bytes]] = {}
    seeds: dict[str, bytes] = {}
    for inst, d in dirs.items():
        gdir = d / "guests" / "g"
        seeds[inst], keys[inst] = needles(gdir / "ssh_host_ed25519_key")
        # Any later boot of its QEMU (a reset without a snapshot) reads its own key, never the throwaway.
        assert (gdir / "boot_host_key").read_bytes() == (gdir / "ssh_host_ed25519_key").read_bytes()
        assert not (gdir / "boot_known_hosts").exists()
        keys[f"{inst}-client"] = needles(d / "id_ed25519")[1]  # the lab's client key never enters a guest
    assert len(set(seeds.values())) == len(INSTANCES)

    # The snapshot holds none of them, in its RAM or on its disk.
    assert found(state, keys) == set() and found(disk, keys) == set()
    assert "keys" not in meta
    # What can be recovered from it whole is the throwaway key it booted with (the search works:
    # it finds that one), whose public half the snapshot records; no instance serves that one.
    kind, blob = meta["boot_host_key"].split()[:2]
    throwaway = base64.b64decode(blob)[-32:]  # string "ssh-ed25519", string key
    assert kind == "ssh-ed25519" and recovered_keys(state) == {throwaway}
    assert recovered_keys(disk) <= {throwaway}  # a qcow2 cluster may split the file
    pubs = {inst: _pub(d / "guests" / "g" / "ssh_host_ed25519_key") for inst, d in dirs.items()}
    assert throwaway not in pubs.values()

    for inst, d in dirs.items():
        gdir = d / "guests" / "g"
        dump = gdir / "ram.dump"  # QEMU writes it (the guest's own 0700 directory)
        qmp_execute(gdir / "qmp.sock", "pmemsave", {"val": 0, "size": MEMORY << 20, "filename": str(dump)},
                    timeout=120)
        ram = dump.read_bytes()
        dump.unlink()
        assert len(ram) == MEMORY << 20
        seen = found(ram, keys)
        # Only its own key: no other instance's, no client key.
        assert seen <= {inst}, (inst, seen)
        # Recovered whole from its RAM: its own key (the search finds a key that is there) and
        # the throwaway one, never another instance's.
        assert pubs[inst] in recovered_keys(ram) <= {throwaway, pubs[inst]}, inst

        # It serves its own host key, the one pinned in its lab's known_hosts.
        port = json.loads((d / "state.json").read_text())["guests"]["g"]["ssh_port"]
        served = _served_host_key(port)
        own = (gdir / "ssh_host_ed25519_key.pub").read_text().split()[1]
        pinned = (d / "known_hosts").read_text().split()
        assert pinned[0] == f"[127.0.0.1]:{port}" and pinned[2] == own
        assert served == base64.b64decode(own)[-32:] == pubs[inst] != throwaway
        assert cli("exec", f"secrets@{inst}", "g", "--", "true").returncode == 0
