"""Making a guest's tunnels and VRFs (:mod:`labctl.lab.tunnels`) once it answers SSH, before its
firewall, its setup commands and its post-boot snapshot (so a warm start and ``reset`` from the
snapshot have them); and handing each wireguard tunnel its key pair and its peer's public key
after that snapshot, on every ``up`` and every ``reset``.

The devices are made by one shell command of ``ip`` argvs (every token validated; quoted all the
same): the VRFs, then each tunnel (its link, MTU, addresses, up), then each VRF's members enslaved
(their IPv6 addresses given back: enslaving takes them away) and its routes added to its table. The
first argv the guest refuses stops it and names its lab line: ``lab.yaml:9: guests.a.tunnels.vx0:
guest a: tunnel vx0 (vxlan 42 to 10.2.0.2:4789 via eth1): Error: Unknown device type.`` (exit 2).

Wireguard keys are made by :func:`make_keys` at ``up`` (X25519, fresh for every ``up``, so two
instances of one lab never share one), kept in the run directory's ``wireguard/`` (0700, files
0600; never in the lab's state, a bundle or a pack), and written into the guest through the
command's standard input (never its command line): :func:`hand_keys`.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from labctl.endpoint import Endpoint
from labctl.errors import GuestError, LabFileError, Problem
from labctl.lab import KINDS, Address, Guest, Tunnel, Vrf, guest_interfaces

TIMEOUT = 120.0
KEY_DIR = "wireguard"
_FAILED = re.compile(r"^labctl-tun-failed (\d+) ?(.*)$")


@dataclass(frozen=True)
class Step:
    """One ``ip`` argv and the lab line it comes from."""

    argv: list[str]
    line: int
    path: str
    what: str


@dataclass(frozen=True)
class GuestNet:
    """What making a guest's tunnels and VRFs needs of it: from the model (``up``) or from the lab's
    recorded state (``reset``, which has no lab file)."""

    name: str
    tunnels: tuple[Tunnel, ...] = ()
    vrfs: tuple[Vrf, ...] = ()
    addresses: tuple[tuple[str, tuple[Address, ...]], ...] = ()

    @classmethod
    def of(cls, g: Guest) -> GuestNet:
        return cls(g.name, g.tunnels, g.vrfs, tuple(g.interfaces()))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GuestNet:
        """From ``Guest.to_dict()``'s form."""
        views = tuple((v.name, tuple(ipaddress.ip_interface(a) for a in v.addresses)) for v in guest_interfaces(d))
        return cls(str(d.get("name")), tuple(Tunnel.from_dict(t) for t in d.get("tunnels") or ()),
                   tuple(Vrf.from_dict(v) for v in d.get("vrfs") or ()), views)


def lab_nets(guests: Mapping[str, Guest] | Mapping[str, Mapping[str, Any]]) -> dict[str, GuestNet]:
    """Each guest's :class:`GuestNet`, from the model's guests or their recorded dicts."""
    return {name: GuestNet.of(g) if isinstance(g, Guest) else GuestNet.from_dict(g) for name, g in guests.items()}


def steps(guest: GuestNet) -> list[Step]:
    """Every argv that makes ``guest``'s VRFs and tunnels, in order (none: it has neither)."""
    out: list[Step] = []
    for v in guest.vrfs:
        out += [Step(a, v.line, v.path, f"VRF {v.name} (table {v.table})") for a in v.commands()]
    for t in guest.tunnels:
        what = f"tunnel {t.name} ({KINDS[t.kind].describe(t)})"
        out += [Step(a, t.line, t.path, what) for a in KINDS[t.kind].commands(t)]
    addresses = dict(guest.addresses)
    for v in guest.vrfs:
        for m in v.members:
            out.append(Step(v.enslave(m), v.line, f"{v.path}.members", f"{m} into VRF {v.name}"))
            out += [Step(["ip", "addr", "replace", str(a), "dev", m], v.line, f"{v.path}.members",
                         f"{m}'s address {a} in VRF {v.name}") for a in addresses.get(m, ()) if a.version == 6]
        out += [Step(v.route(r), r.line, f"{v.path}.routes[{k}]", f"route {r.text()} in VRF {v.name}")
                for k, r in enumerate(v.routes)]
    return out


def command(items: list[Step]) -> str:
    """One shell command running ``items`` in order; the first that fails prints
    ``labctl-tun-failed INDEX MESSAGE`` and ends it (status 3)."""
    parts = []
    for i, s in enumerate(items):
        argv = " ".join(shlex.quote(a) for a in s.argv)
        parts.append(f"o=$({argv} 2>&1) || {{ printf 'labctl-tun-failed {i} %s\\n' \"$(echo $o)\"; exit 3; }}")
    return "; ".join(parts)


def problems(output: str, guest: str, items: list[Step], source: str) -> list[Problem]:
    """The step the guest refused, as a lab-file problem (empty: none named)."""
    out = []
    for m in (_FAILED.match(ln.strip()) for ln in output.splitlines()):
        if m is not None and int(m.group(1)) < len(items):
            s = items[int(m.group(1))]
            out.append(Problem(source, s.line, s.path, f"guest {guest}: {s.what}: {m.group(2).strip() or 'failed'}"))
    return out


def configure(ep: Endpoint, guest: GuestNet, source: str, timeout: float = TIMEOUT) -> None:
    """Make ``guest``'s VRFs and tunnels in the guest of ``ep`` (nothing when it has none).

    :raise LabFileError: when the guest refuses one (at its line). :raise GuestError: otherwise.
    """
    items = steps(guest)
    if not items:
        return
    from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

    with Session(ep) as s:
        res = s.run(command(items), timeout=timeout)
    if res.status == 0:
        return
    output = (res.stdout + b"\n" + res.stderr).decode(errors="replace")
    found = problems(output, guest.name, items, source)
    if found:
        raise LabFileError(found)
    raise GuestError(f"guest {guest.name}: its tunnels could not be made (status {res.status}): {output.strip()[-500:]}")


# --------------------------------------------------------------------------- wireguard keys


Nets = Mapping[str, GuestNet]


def wireguard(lab: Nets) -> list[tuple[str, Tunnel]]:
    """Every wireguard tunnel of the lab, with its guest."""
    return [(g.name, t) for g in lab.values() for t in g.tunnels if t.kind == "wireguard"]


def _key_path(run_dir: Path, guest: str, tunnel: str) -> Path:
    return run_dir / KEY_DIR / f"{guest}.{tunnel}.key"


def make_keys(run_dir: Path, lab: Nets) -> None:
    """A fresh X25519 key pair for each wireguard tunnel of ``lab``, in ``run_dir``'s ``wireguard/``
    (0700; the private key, base64, 0600, its public key beside it)."""
    tunnels = wireguard(lab)
    if not tunnels:
        return
    (run_dir / KEY_DIR).mkdir(mode=0o700, exist_ok=True)
    for guest, t in tunnels:
        key = X25519PrivateKey.generate()
        raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
        pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        path = _key_path(run_dir, guest, t.name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(raw).decode() + "\n")
        path.with_suffix(".pub").write_text(base64.b64encode(pub).decode() + "\n")


def public_key(run_dir: Path, guest: str, tunnel: str) -> str:
    """The public key (base64) of a wireguard tunnel, as :func:`make_keys` made it."""
    return _key_path(run_dir, guest, tunnel).with_suffix(".pub").read_text().strip()


def allowed_ips(lab: Nets, t: Tunnel) -> str:
    """What ``t``'s peer may send: its ``allowed_ips``, else the subnets of the peer's tunnel addresses."""
    if t.opt("allowed_ips"):
        return str(t.opt("allowed_ips"))
    guest, _, name = str(t.opt("peer")).partition(".")
    peer = next(x for x in lab[guest].tunnels if x.name == name)
    return ",".join(str(ipaddress.ip_interface(str(a)).network) for a in peer.addresses) or "0.0.0.0/0"


def key_command(lab: Nets, t: Tunnel, peer_pub: str) -> str:
    """Shell: the private key read from standard input into a 0600 file of ``/run``, ``wg set`` with
    it and the peer, the file removed."""
    port = t.opt("port") or "51820"
    guest, _, name = str(t.opt("peer")).partition(".")
    peer = next(x for x in lab[guest].tunnels if x.name == name)
    endpoint = ["endpoint", f"{t.opt('remote')}:{peer.opt('port') or '51820'}"] if t.opt("remote") else []
    argv = ["wg", "set", t.name, "listen-port", port, "private-key", "/run/labctl-wg/key", "peer", peer_pub,
            *endpoint, "allowed-ips", allowed_ips(lab, t), "persistent-keepalive", "5"]
    return ("umask 077 && mkdir -p /run/labctl-wg && cat > /run/labctl-wg/key && "
            f"{{ {' '.join(shlex.quote(a) for a in argv)}; r=$?; rm -f /run/labctl-wg/key; exit $r; }}")


def hand_keys(run_dir: Path, lab: Nets, guest: str, ep: Endpoint, timeout: float = 30.0) -> None:
    """Give ``guest``'s wireguard tunnels their private keys and their peers' public keys.

    :raise GuestError: when the guest refuses (no wg, a lost connection).
    """
    jobs = key_jobs(run_dir, lab, guest)
    if not jobs:
        return
    from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

    with Session(ep) as s:
        for cmd, key in jobs:
            with s.feed(cmd, timeout) as w:
                w.write(key.read_bytes())


def key_jobs(run_dir: Path, lab: Nets, guest: str) -> list[tuple[str, Path]]:
    """For each wireguard tunnel of ``guest``: the command that sets it up (:func:`key_command`, its
    peer's public key in it) and the private key file its standard input gets."""
    out = []
    for g, t in wireguard(lab):
        if g == guest:
            peer_guest, _, peer_name = str(t.opt("peer")).partition(".")
            out.append((key_command(lab, t, public_key(run_dir, peer_guest, peer_name)), _key_path(run_dir, guest, t.name)))
    return out
