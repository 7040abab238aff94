"""The backend interface and the backend-independent guest plan.

A :class:`GuestPlan` is everything needed to run one guest (resolved from
the lab, the image and the run directory); a backend starts it and returns
a :class:`GuestRecord`, a JSON-serialisable handle kept in the lab's state so
that later commands (``down``, ``status``, ``gdb``) can find the guest again.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from labctl.errors import UsageError
from labctl.guestrecord import GuestRecord as GuestRecord  # noqa: PLC0414 - re-exported; a leaf the state reads without this package
from labctl.paths import InDir

if TYPE_CHECKING:
    from labctl.image import Image
    from labctl.kernel import Kernel
    from labctl.lab import Guest, HostPlace, Lab, Nic
    from labctl.net import Port
    from labctl.ssh import Endpoint

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

    overlay = InDir("disk.qcow2")
    console = InDir("console.log")
    qmp_socket = InDir("qmp.sock")
    # QEMU's gdbstub: a unix socket in the guest's 0700 directory (never a TCP port).
    gdb_socket = InDir("gdb.sock")
    # labctl's channel to the guest's agent (virtio-serial; see guest/init): the FIFOs
    # ``agent.in`` and ``agent.out`` in the guest's 0700 directory, owner only.
    agent_channel = InDir("agent")
    pidfile = InDir("qemu.pid")
    config = InDir("guest.conf")
    # The guest's own host key (private; pinned in the lab's known_hosts).
    host_key = InDir("ssh_host_ed25519_key")
    # The host key a booting guest reads from fw_cfg (qemu backend): a throwaway key while
    # its boot is to be the post-boot snapshot (which must hold no guest's own key), else a
    # copy of :attr:`host_key`. See :mod:`labctl.up.warm`.
    boot_host_key = InDir("boot_host_key")
    authorized_keys = InDir("authorized_keys")
    # The throwaway client key's line a libvirt guest boots with when its post-boot state is
    # to be shared (``boot_keys``); labctl holds its private half (``boot_client_key``).
    boot_authorized_keys = InDir("boot_authorized_keys")


@dataclass(frozen=True)
class NetDir:
    """Where a lab's unix sockets go (links, switches), and whom its switches run as:
    ``owner`` (uid, gid) is the user of the QEMUs that use them, None for labctl's own user."""

    path: Path
    owner: tuple[int, int] | None = None


class LabState(Protocol):
    """What the stages after ``up`` (gdb, drgn, dumps, the crash watch) need of a lab that is up:
    :class:`labctl.state.runstate.LabState` is one; they never import the state stage itself."""

    lab: str
    backend: str
    guests: dict[str, GuestRecord]

    def kernel(self, guest: str) -> Kernel: ...

    def endpoint(self, guest: str) -> Endpoint: ...


GUEST_MEMORY = "memory"  # a qemu guest's RAM file in its run directory (a link to a snapshot's when restored)
POSTBOOT = "postboot"  # the label of a guest's state saved once it was up (reset puts it back there)


def netdev_id(nic: Nic) -> str:
    """The QEMU id of a lab NIC's netdev (``set_link`` and ``filter-dump`` name it), on every backend."""
    return f"lab{nic.index}"


@dataclass(frozen=True)
class HostCheck:
    """One of a backend's prerequisites on a host (``labctl doctor``): its name, whether it is met,
    what was found or what to do; ``warn``: met, but less safely than it could be."""

    name: str
    ok: bool
    detail: str
    warn: bool = False


class Backend(abc.ABC):
    """What every backend provides. labctl's other stages never ask a backend's name: what differs
    between backends is a method here, or one of the class attributes that say what its guests can do.
    """

    name: ClassVar[str]
    runs_here: ClassVar[bool] = False
    """Its guests' QEMUs run on this machine as labctl's user: their memory counts in this host's
    capacity (:mod:`labctl.up.capacity`) and their processes can be watched (a step's host cost)."""
    serves_shares: ClassVar[bool] = False
    """Host directories reach its guests (a lab file's ``shares:``)."""
    tap_networks: ClassVar[bool] = False
    """It can link guests with multi-queue taps (``queues:`` > 1), where the host allows it."""
    pins_tsc: ClassVar[bool] = False
    """Its command line gives a TCG guest the host's TSC frequency (a restored guest's clock rate)."""
    post_boot_snapshots: ClassVar[bool] = False
    """labctl keeps post-boot snapshots of its guests here (:mod:`labctl.up.snapshots`), restored
    through the guest agent; reset restarts a guest from one (:meth:`restart`)."""
    guest_agent: ClassVar[bool] = False
    """labctl reaches its guests' agent (virtio-serial): keys and the clock go through it; else over SSH."""
    states_on_hosts: ClassVar[bool] = False
    """It saves its guests' states itself, on their hosts (:meth:`save_state`): a guest's post-boot
    state once up (``--save-state``), checkpoints; else labctl keeps the files."""
    shows_argv: ClassVar[bool] = False
    """:meth:`command` is the exact argv of a process (``up --dry-run`` prints it)."""
    memory_dumps: ClassVar[bool] = False
    """Its QEMU can dump a guest's memory into a vmcore of labctl's that names the guest's kernel
    (a ``vmcoreinfo`` device; the file written as labctl's user): ``labctl dump``, crash vmcores."""

    @abc.abstractmethod
    def command(self, plan: GuestPlan) -> list[str]:
        """The exact command (or description) that would start the guest."""

    @abc.abstractmethod
    def network_dir(self, run_dir: Path, lab: str, hosts: dict[str, HostPlace] | None) -> NetDir:
        """The directory for the lab's unix sockets, which every guest's QEMU can use
        (made, and journaled if it is outside ``run_dir``).

        :raise HostError: when it cannot be made.
        """

    @abc.abstractmethod
    def prepare(self, plans: list[GuestPlan]) -> list[str]:
        """Get the hosts ready for these guests (reachable, images in place) before any starts.

        Returns one line per notable thing done (an image uploaded...).

        :raise HostError: when a host is unreachable or lacks something.
        """

    @abc.abstractmethod
    def cleanup(self, guest_dir: Path) -> None:
        """Remove what this backend created on its hosts for the guest of ``guest_dir``
        (its ownership journal, :mod:`labctl.backends.owned`): the guest must be stopped first."""

    @abc.abstractmethod
    def start(self, plan: GuestPlan) -> GuestRecord:
        """Start the guest; return as soon as it is launched (not booted).

        :raise MachineError: when it cannot be started.
        """

    @abc.abstractmethod
    def alive(self, rec: GuestRecord) -> bool:
        """True while the guest's machine exists."""

    @abc.abstractmethod
    def stop(self, rec: GuestRecord, timeout: float) -> None:
        """Power the guest off cleanly, hard-stop it after ``timeout`` seconds."""

    @abc.abstractmethod
    def kill(self, rec: GuestRecord) -> None:
        """Stop the guest at once (used on failure and Ctrl-C)."""

    @abc.abstractmethod
    def exit_reason(self, rec: GuestRecord) -> str:
        """Why a dead guest's machine stopped, as far as it is known."""

    @abc.abstractmethod
    def qmp(self, rec: GuestRecord, command: str, args: Mapping[str, object] | None = None) -> Any:
        """Run one QMP command on the guest's QEMU; return its ``return`` value.

        :raise MachineError: when the machine is gone or the command fails.
        """

    @abc.abstractmethod
    def capture_dir(self, rec: GuestRecord) -> Path:
        """A directory, on this machine, where the guest's QEMU may create files (packet
        captures) that labctl reads and removes: private to the lab's owner and QEMU's user.

        :raise HostError: when the guest runs where labctl cannot read such files.
        """

    @abc.abstractmethod
    def qemu_log(self, rec: GuestRecord) -> Path | None:
        """QEMU's own messages about the guest, on this machine (None: not readable here)."""

    @abc.abstractmethod
    def emulator_version(self) -> str:
        """The version of the QEMU this backend would start, for when no running guest can be
        asked (``unknown`` when the backend cannot tell)."""

    # -- where guests run, and what a host needs ---------------------------------------------------

    def place(self, lab: Lab, no_verify_host_keys: bool = False) -> dict[str, HostPlace] | None:
        """guest -> the host it runs on (None: this machine, for every guest).

        :raise UsageError: when the lab places guests on hosts this backend cannot reach.
        """
        if lab.uses_hosts:
            raise UsageError(f"lab {lab.ident} places guests on hosts, which needs the libvirt backend "
                             f"(not {self.name})", hint="use --backend libvirt, or drop the lab's hosts")
        return None

    def free_mib(self, host: HostPlace) -> int:
        """What ``host`` has free for new guests (MiB), for a class's placement.

        :raise UsageError: when the backend places no guest on hosts.
        """
        raise UsageError(f"the {self.name} backend runs every guest on this machine")

    def host_checks(self) -> list[HostCheck]:
        """What this backend needs on this machine (``labctl doctor``)."""
        return []

    def lab_checks(self, lab: Lab) -> list[HostCheck]:
        """What this backend needs on the hosts ``lab`` names (``labctl doctor LAB``)."""
        return []

    # -- a guest's states: reset and checkpoints (labctl.training) ---------------------------------

    def suspend(self, rec: GuestRecord) -> None:
        """Pause a running guest. :raise MachineError: when its machine is gone."""
        self.qmp(rec, "stop")

    def resume(self, rec: GuestRecord) -> None:
        """Let a paused guest run. :raise MachineError: when its machine is gone."""
        self.qmp(rec, "cont")

    def restart(self, rec: GuestRecord, incoming: bool, taps: dict[str, tuple[int, ...]] | None = None
                ) -> GuestRecord:
        """Start a stopped guest again with the command line it was started with (waiting for a
        saved state when ``incoming``); its new record (:attr:`post_boot_snapshots` backends).

        :raise UsageError: when this backend cannot. :raise MachineError: when the start fails.
        """
        raise UsageError(f"the {self.name} backend cannot start a guest again with its command line")

    def save_state(self, rec: GuestRecord, label: str, resume: bool = True) -> GuestRecord:
        """Save the running guest as ``label`` on its host (machine and disk), then let it run on
        unless not ``resume``; its new record (:attr:`states_on_hosts` backends).

        :raise UsageError: when this backend keeps no states. :raise MachineError: when the save fails.
        """
        raise UsageError(f"the {self.name} backend keeps no saved states of its guests")

    def restore_state(self, rec: GuestRecord, label: str, fresh_console: bool = True,
                      resume: bool = True) -> GuestRecord:
        """Put the guest back to its state ``label`` (resumed unless not ``resume``; a new
        ``console.log`` when ``fresh_console``, the old one kept); its new record.

        :raise UsageError: when this backend keeps no states. :raise MachineError: when the restore fails.
        """
        raise UsageError(f"the {self.name} backend keeps no saved states of its guests")

    def has_state(self, rec: GuestRecord, label: str) -> bool:
        """Whether the guest's state ``label`` was saved on its host."""
        return False

    def forget_state(self, rec: GuestRecord, label: str) -> GuestRecord:
        """Remove the guest's state ``label`` from its host; its new record."""
        return rec

    def template_of(self, rec: GuestRecord, ident: str, drivers: dict[str, str]) -> Any:
        """The shared post-boot state a guest of a class saved with throwaway keys, which the next
        instances on its host start from (:class:`labctl.up.UpOptions` ``templates``); None."""
        return None
