"""Tap networks (real multiqueue): a network namespace of the lab's own, a bridge per network, a tap per NIC.

Only where the host allows it: labctl runs as root, with the qemu backend,
and ``/dev/net/tun`` exists. Everything lives in the namespace
``labctl-<lab>-<hash of the run directory>``: the host's own network sees no
bridge, no tap and no frame, and the bridge has no address (IPv6 is off in
the namespace, so the bridge sends nothing itself). labctl opens each tap's
queues itself, from a thread that entered the namespace (a network namespace
is a per-thread attribute), and hands the descriptors to QEMU, which opens
nothing (its sandbox forbids helpers anyway). A tap lives as long as a
descriptor of it is open: when QEMU exits, its taps go; ``down`` deletes the
namespace, and the bridges with it. The namespace is recorded in the lab's
state before it is made.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import struct
import threading
from pathlib import Path

from labctl.backends import Backend
from labctl.errors import HostError, ProcessError
from labctl.net import TapDev
from labctl.proc import run

NETNS_DIR = Path("/run/netns")
TUN = "/dev/net/tun"
TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR, IFF_MULTI_QUEUE = 0x0002, 0x1000, 0x4000, 0x0100
CLONE_NEWNET = 0x40000000
IP_TIMEOUT = 30


def unavailable(backend: Backend) -> str | None:
    """Why tap networks cannot be used here (None: they can)."""
    if not backend.tap_networks:
        return f"the {backend.name} backend links guests with dgram sockets only"
    if os.geteuid() != 0:
        return "tap devices need root"
    if not os.path.exists(TUN):
        return f"{TUN} is missing"
    return None


def netns_name(run_dir: Path) -> str:
    """The lab's namespace: its name and a hash of its run directory (two state directories never meet)."""
    return f"labctl-{run_dir.name}-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]}"


def _ip(*args: str) -> None:
    run(["ip", *args], timeout=IP_TIMEOUT)


def create_netns(name: str, bridges: list[str]) -> None:
    """The namespace with IPv6 off and the bridges up.

    :raise HostError: when it exists already (another lab's) or cannot be made.
    """
    if (NETNS_DIR / name).exists():
        raise HostError(f"network namespace {name} exists already: a lab of this name and run directory "
                        "was not taken down", hint=f"ip netns del {name}, if no lab uses it")
    try:
        _ip("netns", "add", name)
        run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
             "net.ipv6.conf.default.disable_ipv6=1"], timeout=IP_TIMEOUT)
        for br in bridges:
            _ip("-n", name, "link", "add", br, "type", "bridge")
            _ip("-n", name, "link", "set", br, "up")
    except ProcessError as exc:
        raise HostError(f"could not set up network namespace {name}: {exc.message}: {exc.output}") from exc


def delete_netns(name: str) -> None:
    """Remove the namespace (and its bridges); nothing when it is gone already."""
    if (NETNS_DIR / name).exists():
        run(["ip", "netns", "delete", name], timeout=IP_TIMEOUT, check=False)


def open_tap(netns: str, tap: TapDev) -> TapDev:
    """Create the tap in the namespace, on its bridge, up; the same tap with its queues' descriptors.

    :raise HostError: when the kernel refuses.
    """
    result: dict[str, object] = {}

    def inside() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns failed")
            finally:
                os.close(fd)
            flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | (IFF_MULTI_QUEUE if tap.queues > 1 else 0)
            fds = []
            for _ in range(tap.queues):
                q = os.open(TUN, os.O_RDWR | os.O_CLOEXEC)
                fds.append(q)
                fcntl.ioctl(q, TUNSETIFF, struct.pack("16sH22x", tap.name.encode(), flags))
            result["fds"] = tuple(fds)
        except OSError as exc:
            for q in locals().get("fds", []):
                os.close(q)
            result["error"] = exc

    t = threading.Thread(target=inside, name=f"tap-{tap.name}")  # only this thread enters the namespace
    t.start()
    t.join()
    if "error" in result:
        raise HostError(f"could not create tap {tap.name} in {netns}: {result['error']}")
    fds = result["fds"]
    assert isinstance(fds, tuple)
    try:
        _ip("-n", netns, "link", "set", tap.name, "master", tap.bridge, "up")
    except ProcessError as exc:
        close(fds)
        raise HostError(f"could not put tap {tap.name} on bridge {tap.bridge}: {exc.output}") from exc
    return TapDev(tap.name, tap.bridge, tap.queues, fds)


def reopen(extra: dict[str, object], run_dir: Path) -> dict[str, tuple[int, ...]]:
    """A stopped guest's taps made again in its lab's namespace, on their bridges (the taps a
    guest record's ``extra["taps"]`` names): netdev id -> the queues' descriptors, which the
    caller hands to QEMU and then closes (:func:`close`). Nothing when it had no tap.

    :raise HostError: when the namespace is gone or the kernel refuses.
    """
    listed = extra.get("taps")
    if not isinstance(listed, list) or not listed:
        return {}
    netns = netns_name(run_dir)
    if not (NETNS_DIR / netns).exists():
        raise HostError(f"network namespace {netns} of the lab's tap networks is gone")
    out: dict[str, tuple[int, ...]] = {}
    try:
        for t in listed:
            dev = open_tap(netns, TapDev(str(t["name"]), str(t["bridge"]), int(t["queues"])))
            out[str(t["netdev"])] = dev.fds
    except (HostError, KeyError, TypeError, ValueError) as exc:
        for fds in out.values():
            close(fds)
        raise exc if isinstance(exc, HostError) else HostError(f"a guest's record of its taps is damaged: {exc}")
    return out


def close(fds: tuple[int, ...]) -> None:
    """Close labctl's copies of a tap's descriptors (QEMU keeps its own)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
