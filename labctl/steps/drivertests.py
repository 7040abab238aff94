"""The kernel's driver tests in hardware mode: a ``kselftest:`` step with ``netif`` and ``peer``.

``tools/testing/selftests/drivers/net`` (6.12 and later; ``drivers/net/hw`` too) runs against a real NIC
when its ``net.config`` names one (``NETIF``) and the machine at the other end of its link
(``LOCAL_V4``/``REMOTE_V4``, ``_V6``, ``REMOTE_TYPE=ssh``, ``REMOTE_ARGS``); without it, against netdevsim,
which Debian's kernels do not build. A lab has both: the NIC model under test and a peer guest on its
network. This module:

* says what a target's tests import from outside their directory (:func:`extras`: the ``net`` library in
  Python and shell, the netlink specs and the ynl library, as ``make install`` would lay them out), so
  the build copies them beside the target and hashes them into its key;
* works out the two ends (:func:`endpoints`) from the lab: the guest's NIC ``netif``, the peer's NIC on
  the same network, their addresses;
* lets the guest run commands on its peer by SSH (:func:`ssh_commands`): a key pair made in the guest
  for it (never on the host, never in a bundle), its public half authorised on the peer, the peer's
  host key read through labctl's own (pinned) connection to the peer and written as the only known
  host, a ControlMaster so that the framework's many ``ssh`` calls share one connection;
* keeps the NIC's IPv6 addresses when a test takes its link down (:func:`keep_addresses_command`):
  ``stats.py``'s ``check_down`` sets the NIC down and up again, and the kernel drops the static IPv6
  addresses of a link that goes down (``keep_addr_on_down`` 0), so every later test over IPv6 (``ping.py``
  prefers it) found no route to the guest and waited for a connection until the runner's timeout.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import LabctlError
from labctl.lab import Lab

q = shlex.quote

KEY = "/root/.ssh/labctl_peer"
KNOWN = "/root/.ssh/labctl_peer_known_hosts"
CONFIG = "/root/.ssh/config"
_PUBLIC_KEY = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]{68}={0,2}(?: [A-Za-z0-9@._-]{1,64})?")

# What tests of these targets import from outside their own directory: (path in the tree, path in the
# installed tree). drivers/net/lib/py puts the installed root on sys.path and imports net.lib.py, which
# finds the ynl library and the netlink specs under net/lib when kselftest-list.txt says "installed".
_NET_LIBRARY = (
    ("tools/testing/selftests/net/lib/py", "net/lib/py"),
    ("tools/testing/selftests/net/lib.sh", "net/lib.sh"),
    ("tools/testing/selftests/net/net_helper.sh", "net/net_helper.sh"),
    ("tools/testing/selftests/net/forwarding/lib.sh", "net/forwarding/lib.sh"),
    ("Documentation/netlink/specs", "net/lib/specs"),
    ("tools/net/ynl/lib", "net/lib/ynl/lib"),
)


def extras(target: str) -> tuple[tuple[str, str], ...]:
    """What ``target``'s tests need from elsewhere in the tree (none for most targets)."""
    return _NET_LIBRARY if target == "drivers/net" or target.startswith("drivers/net/") else ()


@dataclass(frozen=True)
class Endpoints:
    """The two ends of the NIC under test's link."""

    netif: str
    peer: str
    local_v4: str = ""
    remote_v4: str = ""
    local_v6: str = ""
    remote_v6: str = ""

    def config(self) -> str:
        """The target's ``net.config`` (shell assignments the framework reads)."""
        values = {"NETIF": self.netif, "LOCAL_V4": self.local_v4, "REMOTE_V4": self.remote_v4,
                  "LOCAL_V6": self.local_v6, "REMOTE_V6": self.remote_v6, "REMOTE_TYPE": "ssh",
                  "REMOTE_ARGS": self.remote_v4 or self.remote_v6}
        return "".join(f"{k}={v}\n" for k, v in values.items() if v)

    @property
    def remotes(self) -> tuple[str, ...]:
        return tuple(a for a in (self.remote_v4, self.remote_v6) if a)


def _bare(address: str) -> str:
    return address.split("/", 1)[0]


def endpoints(lab: Lab, guest: str, netif: str, peer: str) -> Endpoints:
    """The NIC ``netif`` of ``guest`` and ``peer``'s NIC on its network, with their addresses.

    :raise LabctlError: when either is missing or the two share no address family.
    """
    g, p = lab.guests.get(guest), lab.guests.get(peer)
    if g is None or p is None:
        raise LabctlError(f"kselftest: the lab has no guest '{guest if g is None else peer}'")
    nic = next((n for n in g.nics if n.name == netif), None)
    if nic is None:
        raise LabctlError(f"kselftest: guest {guest} has no NIC '{netif}' "
                          f"(it has {', '.join(n.name for n in g.nics) or 'none'})")
    other = next((n for n in p.nics if n.network == nic.network), None)
    if other is None:
        raise LabctlError(f"kselftest: the peer {peer} has no NIC on network {nic.network} ({guest}.{netif}'s)")
    mine, theirs = [str(a) for a in nic.addresses], [str(a) for a in other.addresses]

    def first(addrs: list[str], v6: bool) -> str:
        return next((_bare(a) for a in addrs if (":" in a) == v6), "")

    e = Endpoints(netif, peer, first(mine, False), first(theirs, False), first(mine, True), first(theirs, True))
    if not (e.local_v4 and e.remote_v4) and not (e.local_v6 and e.remote_v6):
        raise LabctlError(f"kselftest: {guest}.{netif} and {peer}.{other.name} share no address family: "
                          "give both an ip (the driver tests reach the peer over it)")
    if not e.local_v4 or not e.remote_v4:
        e = Endpoints(netif, peer, "", "", e.local_v6, e.remote_v6)
    if not e.local_v6 or not e.remote_v6:
        e = Endpoints(netif, peer, e.local_v4, e.remote_v4, "", "")
    return e


def key_command() -> str:
    """In the guest under test: its key for the peer, made once, and its public half printed."""
    return (f"mkdir -p -m 700 /root/.ssh && {{ [ -f {KEY} ] || ssh-keygen -q -t ed25519 -N '' -C labctl-peer "
            f"-f {KEY}; }} && cat {KEY}.pub")


def checked_public_key(text: str, guest: str) -> str:
    """The guest's public key, if it is one (it is written into the peer's authorized_keys).

    :raise LabctlError: for anything else.
    """
    key = text.strip()
    if not _PUBLIC_KEY.fullmatch(key):
        raise LabctlError(f"kselftest: {guest} did not give an ed25519 public key for its peer")
    return key


def authorize_command(public_key: str) -> str:
    """On the peer: ``public_key`` authorised for root (once), and the public half of the host key its
    sshd serves (the one labctl's connection to it pinned) printed."""
    line = q(public_key)
    return (f"mkdir -p -m 700 /root/.ssh && touch /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys "
            f"&& {{ grep -qxF {line} /root/.ssh/authorized_keys || echo {line} >> /root/.ssh/authorized_keys; }} "
            "&& ssh-keygen -y -f /etc/ssh/ssh_host_ed25519_key")  # labctl's guests keep only the private half


def checked_host_key(text: str, peer: str) -> str:
    """The peer's host key (``ssh-ed25519 BASE64``), its comment dropped. :raise LabctlError: otherwise."""
    parts = text.strip().split()
    if len(parts) < 2 or not _PUBLIC_KEY.fullmatch(" ".join(parts[:2])):
        raise LabctlError(f"kselftest: the peer {peer} has no ed25519 host key to pin")
    return " ".join(parts[:2])


def keep_addresses_command(e: Endpoints) -> str:
    """In the guest under test: keep ``netif``'s IPv6 addresses over a down and up (nothing without IPv6).

    Written to ``/proc/sys`` by path: sysctl's dotted names would read a VLAN's ``eth1.100`` as two levels.
    """
    if not e.local_v6:
        return "true"
    return f"echo 1 > {q(f'/proc/sys/net/ipv6/conf/{e.netif}/keep_addr_on_down')}"


def client_command(e: Endpoints, host_key: str, config_path: str) -> str:
    """In the guest under test: the peer's addresses as the only known hosts with its host key, an
    ssh config for them (the key, batch mode, a ControlMaster), ``net.config`` at ``config_path``, the
    NIC's IPv6 addresses kept over a down and up, and one ``ssh`` to the peer to prove it works."""
    known = "".join(f"{a} {host_key}\n" for a in e.remotes)
    hosts = " ".join(e.remotes)
    block = (f"# labctl: the driver tests' peer\nHost {hosts}\n  User root\n  IdentityFile {KEY}\n"
             f"  IdentitiesOnly yes\n  BatchMode yes\n  StrictHostKeyChecking yes\n  UserKnownHostsFile {KNOWN}\n"
             "  ControlMaster auto\n  ControlPath /root/.ssh/labctl-cm-%C\n  ControlPersist 120\n"
             "  ConnectTimeout 20\n# labctl: end\n")
    strip = f"sed -i '/^# labctl: the driver tests/,/^# labctl: end$/d' {CONFIG}"
    return (f"printf %s {q(known)} > {KNOWN} && chmod 600 {KNOWN} && touch {CONFIG} && chmod 600 {CONFIG} && "
            f"{strip} && printf %s {q(block)} >> {CONFIG} && printf %s {q(e.config())} > {q(config_path)} && "
            f"{keep_addresses_command(e)} && ssh {q(e.remotes[0])} true")


def config_path(install_root: str, target: str) -> str:
    return str(Path(install_root) / target / "net.config")
