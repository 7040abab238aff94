"""The backend interface and the backend-independent guest plan.

A :class:`GuestPlan` is everything needed to run one guest (resolved from
the lab, the image and the run directory); a backend starts it and returns
a :class:`GuestRecord`, a JSON-serialisable handle kept in the lab's state so
that later commands (``down``, ``status``, ``gdb``) can find the guest again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from labctl.image.store import Image
from labctl.kernel.kernel_store import Kernel
from labctl.lab.hosts import HostPlace
from labctl.lab.model import Guest
from labctl.net.plan import Port

MGMT_NET = "10.0.2.0/24"
MGMT_ADDR = "10.0.2.15/24"


@dataclass(frozen=True)
class GuestPlan:
    """One guest, fully resolved: what to boot, with which NICs, where."""

    lab: str
    guest: Guest
    dir: Path
    image: Image
    accel: str
    ssh_port: int
    mgmt_mac: str
    ports: dict[str, Port]
    kernel_args: tuple[str, ...]
    kernel: Kernel  # the prepared kernel this guest boots (labctl.kernel)
    initrd: Path  # its initramfs for the image's root file system
    host: HostPlace | None = None  # the libvirt host (None: this machine, the qemu backend)
    warm: bool = False  # started to load a post-boot snapshot (``-incoming defer``), not to boot
    # libvirt: boots with throwaway keys (boot_host_key, boot_authorized_keys) for a shared post-boot state
    boot_keys: bool = False
    template: Any = None  # libvirt: the shared post-boot state it starts from (saved.Template), not a boot

    @property
    def overlay(self) -> Path:
        return self.dir / "disk.qcow2"

    @property
    def console(self) -> Path:
        return self.dir / "console.log"

    @property
    def qmp_socket(self) -> Path:
        return self.dir / "qmp.sock"

    @property
    def gdb_socket(self) -> Path:
        """QEMU's gdbstub: a unix socket in the guest's 0700 directory (never a TCP port)."""
        return self.dir / "gdb.sock"

    @property
    def agent_channel(self) -> Path:
        """labctl's channel to the guest's agent (virtio-serial; see guest/init): the FIFOs
        ``agent.in`` and ``agent.out`` in the guest's 0700 directory, owner only."""
        return self.dir / "agent"

    @property
    def pidfile(self) -> Path:
        return self.dir / "qemu.pid"

    @property
    def config(self) -> Path:
        return self.dir / "guest.conf"

    @property
    def host_key(self) -> Path:
        """The guest's own host key (private; pinned in the lab's known_hosts)."""
        return self.dir / "ssh_host_ed25519_key"

    @property
    def boot_host_key(self) -> Path:
        """The host key a booting guest reads from fw_cfg (qemu backend): a throwaway key while
        its boot is to be the post-boot snapshot (which must hold no guest's own key), else a
        copy of :attr:`host_key`. See :mod:`labctl.up.warm`."""
        return self.dir / "boot_host_key"

    @property
    def authorized_keys(self) -> Path:
        return self.dir / "authorized_keys"

    @property
    def boot_authorized_keys(self) -> Path:
        """The throwaway client key's line a libvirt guest boots with when its post-boot state is
        to be shared (``boot_keys``); labctl holds its private half (``boot_client_key``)."""
        return self.dir / "boot_authorized_keys"


@dataclass(frozen=True)
class NetDir:
    """Where a lab's unix sockets go (links, switches), and whom its switches run as:
    ``owner`` (uid, gid) is the user of the QEMUs that use them, None for labctl's own user."""

    path: Path
    owner: tuple[int, int] | None = None


@dataclass
class GuestRecord:
    """A started guest as the lab's state remembers it."""

    name: str
    backend: str
    pid: int
    dir: str
    console: str
    qmp: str
    ssh_port: int
    accel: str
    argv: list[str] = field(default_factory=list)
    gdb: str | None = None  # the gdbstub's unix socket, on the machine that runs the guest
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GuestRecord:
        return cls(**d)


class Backend(Protocol):
    """What every backend provides."""

    name: str

    def command(self, plan: GuestPlan) -> list[str]:
        """The exact command (or description) that would start the guest."""

    def network_dir(self, run_dir: Path, lab: str, hosts: dict[str, HostPlace] | None) -> NetDir:
        """The directory for the lab's unix sockets, which every guest's QEMU can use
        (made, and journaled if it is outside ``run_dir``).

        :raise HostError: when it cannot be made.
        """

    def prepare(self, plans: list[GuestPlan]) -> list[str]:
        """Get the hosts ready for these guests (reachable, images in place) before any starts.

        Returns one line per notable thing done (an image uploaded...).

        :raise HostError: when a host is unreachable or lacks something.
        """

    def cleanup(self, guest_dir: Path) -> None:
        """Remove what this backend created on its hosts for the guest of ``guest_dir``
        (its ownership journal, :mod:`labctl.backends.owned`): the guest must be stopped first."""

    def start(self, plan: GuestPlan) -> GuestRecord:
        """Start the guest; return as soon as it is launched (not booted).

        :raise MachineError: when it cannot be started.
        """

    def alive(self, rec: GuestRecord) -> bool:
        """True while the guest's machine exists."""

    def stop(self, rec: GuestRecord, timeout: float) -> None:
        """Power the guest off cleanly, hard-stop it after ``timeout`` seconds."""

    def kill(self, rec: GuestRecord) -> None:
        """Stop the guest at once (used on failure and Ctrl-C)."""

    def exit_reason(self, rec: GuestRecord) -> str:
        """Why a dead guest's machine stopped, as far as it is known."""

    def qmp(self, rec: GuestRecord, command: str, args: dict[str, Any] | None = None) -> Any:
        """Run one QMP command on the guest's QEMU; return its ``return`` value.

        :raise MachineError: when the machine is gone or the command fails.
        """

    def capture_dir(self, rec: GuestRecord) -> Path:
        """A directory, on this machine, where the guest's QEMU may create files (packet
        captures) that labctl reads and removes: private to the lab's owner and QEMU's user.

        :raise HostError: when the guest runs where labctl cannot read such files.
        """

    def qemu_log(self, rec: GuestRecord) -> Path | None:
        """QEMU's own messages about the guest, on this machine (None: not readable here)."""

    def emulator_version(self) -> str:
        """The version of the QEMU this backend would start, for when no running guest can be
        asked (``unknown`` when the backend cannot tell)."""
