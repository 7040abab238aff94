"""How a lab NIC's host side is described to QEMU, one kind of netdev per class, registered in
:data:`NETDEVS`.

A NIC's port (:class:`~labctl.net.plan.Port`, :func:`~labctl.net.plan.plan_networks` picks it) is
one of these kinds, told apart by its local end:

=========== ==================================================== =========================================
kind        its host side                                        QEMU's netdev
=========== ==================================================== =========================================
dgram       a unix datagram socket (or a UDP address across      ``dgram,id=..,local.*,remote.*``: QEMU
            hosts); the peer a socket, the lab's switch or a     binds and sends itself
            tunnel's far end
tap         a multiqueue tap on the network's bridge in the      ``tap,id=..,fd[s]=..,vhost=off`` on the
            lab's namespace, opened by labctl                    descriptors QEMU inherits
            (:mod:`labctl.up.taps`)
=========== ==================================================== =========================================

Each kind says: its ``-netdev`` option (:meth:`NetdevKind.netdev`; the libvirt backend passes the
same option through ``<qemu:commandline>``), the device's options it adds (``mq=on`` for several
queues), the descriptors QEMU inherits, what a guest's record keeps to start it again
(:meth:`NetdevKind.kept`), and its option on new descriptors when the guest is started again
(:meth:`NetdevKind.reattach`). The backends ask :func:`netdev_kind` / :func:`kind_of_option`, never
which class a port's local end is. Opening a tap on the host is :mod:`labctl.up.taps`' (it needs the
lab's namespace, made by ``up``).

Pure: builds strings, opens nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from labctl.net.plan import Port, TapDev, UdpAddr


def qemu_opt(value: object) -> str:
    """A value in a QEMU ``key=value,...`` option (``,`` -> ``,,``)."""
    return str(value).replace(",", ",,")


class NetdevKind:
    """One kind of netdev (see the module docstring); the defaults are a netdev QEMU makes itself."""

    name: ClassVar[str] = ""
    prefix: ClassVar[str] = ""  # its -netdev option's first word
    opened_by_labctl: ClassVar[bool] = False  # its host side is descriptors labctl opens (again at a restart)

    def owns(self, port: Port) -> bool:
        """Whether ``port`` is of this kind."""
        raise NotImplementedError

    def netdev(self, netdev_id: str, port: Port) -> str:
        """Its ``-netdev`` option for the NIC whose netdev is ``netdev_id``."""
        raise NotImplementedError

    def device_options(self, port: Port, multiqueue: bool) -> str:
        """What it adds to the NIC's ``-device`` option (``multiqueue``: the model can use several queues)."""
        return ""

    def fds(self, port: Port) -> tuple[int, ...]:
        """The descriptors QEMU inherits for it."""
        return ()

    def kept(self, netdev_id: str, port: Port) -> dict[str, object] | None:
        """What a guest's record keeps of it to start the guest again (None: nothing to keep)."""
        return None

    def reattach(self, option: str, fds: tuple[int, ...]) -> str:
        """Its ``-netdev`` option (as :meth:`netdev` wrote it) when the guest starts again on ``fds``."""
        return option


class DgramNetdev(NetdevKind):
    """A unix datagram socket or a UDP endpoint: QEMU binds its local end and sends to the remote."""

    name = "dgram"
    prefix = "dgram"

    def owns(self, port: Port) -> bool:
        return isinstance(port.local, Path | UdpAddr)

    @staticmethod
    def _addr(side: str, addr: object) -> str:
        if isinstance(addr, UdpAddr):
            return f"{side}.type=inet,{side}.host={qemu_opt(addr.host)},{side}.port={addr.port}"
        return f"{side}.type=unix,{side}.path={qemu_opt(addr)}"

    def netdev(self, netdev_id: str, port: Port) -> str:
        # ``queues`` > 1 needs a multi-queue netdev (tap); a dgram link has one
        # queue pair, so the guest sees one (labctl up warns about it).
        out = f"dgram,id={netdev_id},{self._addr('local', port.local)}"
        return out + (f",{self._addr('remote', port.remote)}" if port.remote is not None else "")


class TapNetdev(NetdevKind):
    """A tap with its queues opened by labctl; QEMU inherits the descriptors and opens nothing."""

    name = "tap"
    prefix = "tap"
    opened_by_labctl = True

    def owns(self, port: Port) -> bool:
        return isinstance(port.local, TapDev)

    @staticmethod
    def _tap(port: Port) -> TapDev:
        assert isinstance(port.local, TapDev)
        return port.local

    @staticmethod
    def _fds_opt(fds: tuple[int, ...]) -> str:
        return f"{'fds' if len(fds) > 1 else 'fd'}={':'.join(str(fd) for fd in fds) or '?'}"

    def netdev(self, netdev_id: str, port: Port) -> str:
        return f"tap,id={netdev_id},{self._fds_opt(self._tap(port).fds)},vhost=off"

    def device_options(self, port: Port, multiqueue: bool) -> str:
        """virtio-net's options for several queue pairs (MSI-X vectors: one per queue, config and control)."""
        queues = self._tap(port).queues
        return f",mq=on,vectors={2 * queues + 2}" if queues > 1 and multiqueue else ""

    def fds(self, port: Port) -> tuple[int, ...]:
        return self._tap(port).fds

    def kept(self, netdev_id: str, port: Port) -> dict[str, object] | None:
        tap = self._tap(port)
        return {"netdev": netdev_id, "name": tap.name, "bridge": tap.bridge, "queues": tap.queues}

    def reattach(self, option: str, fds: tuple[int, ...]) -> str:
        opts = [o for o in option.split(",") if not o.startswith(("fd=", "fds="))]
        opts.insert(2, self._fds_opt(fds))
        return ",".join(opts)


NETDEVS: tuple[NetdevKind, ...] = (DgramNetdev(), TapNetdev())
"""Every netdev kind; a port is of the first that owns it."""


def netdev_kind(port: Port) -> NetdevKind:
    """The kind of ``port``'s netdev.

    :raise ValueError: for a port no kind owns (a new kind of local end not registered here).
    """
    for kind in NETDEVS:
        if kind.owns(port):
            return kind
    raise ValueError(f"no netdev kind for {port.guest}.{port.nic}'s {port.local!r}")


def kind_of_option(option: str) -> NetdevKind | None:
    """The kind whose ``-netdev`` option ``option`` is (None: not a lab NIC's, e.g. the management NIC's)."""
    first = option.partition(",")[0]
    return next((k for k in NETDEVS if k.prefix == first), None)


def option_id(option: str) -> str:
    """The ``id=`` of a ``-netdev`` option ("" when it has none)."""
    return dict(kv.partition("=")[::2] for kv in option.split(",")[1:]).get("id", "")
