"""The embedded backend: labctl starts ``qemu-system-x86_64`` itself.

Each guest is one QEMU process in its own session (it outlives ``labctl
up``), with its QMP monitor on a 0600 unix socket in the guest's run
directory, its serial console in ``console.log`` and QEMU's own messages in
``qemu.log``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.backends.base import GUEST_MEMORY as MEMORY
from labctl.backends.base import Backend, GuestPlan, GuestRecord, HostCheck, NetDir, netdev_id
from labctl.backends.qemu import liveness
from labctl.backends.qemu.clone import new_generation, shares_memory, with_share
from labctl.backends.qemu.local_checks import host_checks
from labctl.errors import MachineError, PortTaken
from labctl.net import kind_of_option, netdev_kind, option_id
from labctl.paths import ensure_private_dir
from labctl.proc import pid_alive, run, spawn, stop_pid

if TYPE_CHECKING:
    from labctl.lab import HostPlace

QEMU = "qemu-system-x86_64"
# What QEMU 7.2 says when a port it was told to bind (SSH's hostfwd) is taken meanwhile.
PORT_MESSAGES = ("hostfwd", "forwarding", "Address already in use")


@functools.lru_cache(maxsize=1)
def qemu_version() -> str:
    """The first line of ``qemu-system-x86_64 --version`` ("unknown" when it cannot be run)."""
    try:
        out = run([QEMU, "--version"], timeout=20).stdout.decode()
        return out.splitlines()[0].strip()
    except Exception:  # noqa: BLE001 - the version is informative (and part of snapshot keys)
        return "unknown"


def agent_fifos(channel: Path) -> None:
    """The guest agent's FIFOs ``CHANNEL.in`` and ``CHANNEL.out`` (QEMU's pipe chardev), new and
    empty, mode 0600, in the guest's 0700 directory."""
    for suffix in (".in", ".out"):
        fifo = channel.with_name(channel.name + suffix)
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo, 0o600)


def fresh_memory(path: Path) -> None:
    """A new empty RAM file (0600) for a guest that boots and maps it shared: whatever was there
    (a link to a snapshot's memory file, an older boot's RAM) is unlinked first, never written."""
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def writes_out(argv: list[str]) -> bool:
    """Whether a guest started with ``argv`` has a writable share (a 9p export that stores what the
    guest sets, :func:`labctl.backends.qemu.argv.share_args`): what it writes there outlives it."""
    return any(a.startswith("local,") and "security_model=mapped-xattr" in a for a in argv)



def qmp_execute(socket: Path | str, command: str, args: Mapping[str, object] | None = None,
                timeout: float = 5.0) -> Any:
    """:func:`labctl.backends.monitor.qmp_execute`, loaded at its first use (asyncio and the QMP
    client: ``down`` and ``exec`` need neither)."""
    from labctl.backends.monitor import qmp_execute as execute

    return execute(socket, command, args, timeout=timeout)


class QemuBackend(Backend):
    """Runs guests as local QEMU processes."""

    name = "qemu"
    runs_here = True
    serves_shares = True
    tap_networks = True
    pins_tsc = True
    post_boot_snapshots = True
    guest_agent = True
    shows_argv = True
    memory_dumps = True

    def host_checks(self) -> list[HostCheck]:
        return host_checks()

    def command(self, plan: GuestPlan) -> list[str]:
        from labctl.backends.qemu.argv import build_argv, restores_vlan_filter  # the lab model: not for down

        return build_argv(plan, QEMU, restores_vlan_filter(qemu_version()))

    def network_dir(self, run_dir: Path, lab: str, hosts: dict[str, HostPlace] | None) -> NetDir:
        """``net/`` in the run directory: QEMU runs as labctl's own user."""
        return NetDir(ensure_private_dir(run_dir / "net"))

    def prepare(self, plans: list[GuestPlan]) -> list[str]:
        """Nothing to prepare: QEMU runs here, on the image's own files."""
        return []

    def cleanup(self, guest_dir: Path) -> None:
        """Nothing outside the run directory to remove."""

    def start(self, plan: GuestPlan) -> GuestRecord:
        # A netdev whose host side labctl opened (a tap's queues) is descriptors QEMU inherits (named
        # by number in its argv); the record keeps what each kind needs to open them again at a restart.
        ports = [(nic, plan.ports[nic.name]) for nic in plan.guest.nics]
        kept = [k for nic, port in ports if (k := netdev_kind(port).kept(netdev_id(nic), port)) is not None]
        extra: dict[str, object] = {"taps": kept} if kept else {}
        rec = GuestRecord(name=plan.guest.name, backend=self.name, pid=0, dir=str(plan.dir),
                          console=str(plan.console), qmp=str(plan.qmp_socket),
                          ssh_port=plan.ssh_port, accel=plan.accel, argv=self.command(plan),
                          gdb=str(plan.gdb_socket), extra=extra)
        return self._launch(rec, [fd for _, port in ports for fd in netdev_kind(port).fds(port)])

    def restart(self, rec: GuestRecord, incoming: bool, taps: dict[str, tuple[int, ...]] | None = None) -> GuestRecord:
        """Start a stopped guest again with the command line it was started with, waiting for a
        saved state (``-incoming defer``) when ``incoming``; its new record.

        Its sockets, ports and files keep their paths, so its neighbours' links and its SSH
        endpoint are unchanged. A guest on a tap network needs its taps' queues opened again
        (``taps``: netdev id -> descriptors, see ``labctl.up.taps.reopen``): the first QEMU's
        went with it; the command line then names the new descriptors.

        :raise MachineError: when QEMU exits at start, or a tap netdev has no descriptors.
        """
        argv = list(rec.argv)
        fds: list[int] = []
        for i, arg in enumerate(argv):
            kind = kind_of_option(arg) if i and argv[i - 1] == "-netdev" else None
            if kind is None or not kind.opened_by_labctl:
                continue
            netdev = option_id(arg)
            if not taps or netdev not in taps:
                raise MachineError(f"guest {rec.name}: the {kind.name} of its netdev {netdev} was not opened again")
            argv[i] = kind.reattach(arg, taps[netdev])
            fds += taps[netdev]
        while "-incoming" in argv:
            i = argv.index("-incoming")
            del argv[i:i + 2]
        if incoming:
            argv += ["-incoming", "defer"]
        # a restore maps its memory file privately (a snapshot's, or a checkpoint's stream loaded over it);
        # a boot maps a fresh one of its own, shared
        argv = with_share(argv, not incoming)
        return self._launch(dataclasses.replace(rec, argv=argv, pid=0), fds)

    def _launch(self, rec: GuestRecord, fds: list[int] | None = None) -> GuestRecord:
        """Spawn QEMU for ``rec`` and wait until its monitor answers; the record with its pid."""
        qmp_socket = Path(rec.qmp)
        agent_fifos(Path(rec.dir) / "agent")
        argv, guid = new_generation(rec.argv)  # every start a new VM generation ID: the guest reseeds
        rec = dataclasses.replace(rec, argv=argv, extra={**rec.extra, "vmgenid": guid} if guid else rec.extra)
        if shares_memory(argv):
            fresh_memory(Path(rec.dir) / MEMORY)
        old = os.umask(0o077)  # QMP socket, console and pidfile: owner only
        try:
            proc = spawn(rec.argv, Path(rec.dir) / "qemu.log", pass_fds=fds or [])
        finally:
            os.umask(old)
        rec = dataclasses.replace(rec, pid=proc.pid)
        # QEMU fails fast on bad options or a taken port: catch that here.
        # The QMP socket listens early, but QEMU answers on it only from its
        # main loop, after every port (hostfwd, -gdb) is bound; one answer
        # means the start got past them.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                       else f"status {proc.returncode}")
                why = self.exit_reason(rec)
                error = PortTaken if any(w in why for w in PORT_MESSAGES) else MachineError
                raise error(f"QEMU for guest {rec.name} exited at start ({how}): {why}")
            if qmp_socket.exists():
                try:
                    qmp_execute(qmp_socket, "query-status", timeout=max(0.1, deadline - time.monotonic()))
                    break
                except MachineError:
                    pass  # died meanwhile (seen above on the next turn) or not answering yet
            time.sleep(0.02)
        return rec

    def alive(self, rec: GuestRecord) -> bool:
        return liveness.alive(rec)

    def stop(self, rec: GuestRecord, timeout: float) -> None:
        if not self.alive(rec):
            return
        try:
            # Only a guest with a writable share can leave something on the host after down (its disk is
            # an overlay in its run directory, which down removes): it gets the power button, so that its
            # programs' last writes to the share land (a running guest; a paused or panicked one never
            # answers it). Every other QEMU quits at once (the power-off is 0.3 s under TCG).
            # The others get SIGTERM, which QEMU takes as QMP's quit: down loads no QMP client.
            if writes_out(rec.argv) and qmp_execute(rec.qmp, "query-status", timeout=3.0).get("status") == "running":
                qmp_execute(rec.qmp, "system_powerdown", timeout=3.0)
                if self._wait_gone(rec, timeout):
                    return
        except MachineError:
            pass
        self.kill(rec)

    def kill(self, rec: GuestRecord) -> None:
        # Its -pidfile argument, a whole argv element (stop_pid matches whole paths; the QMP
        # socket is inside "unix:PATH,server=on"): still our QEMU, not a reused pid.
        stop_pid(rec.pid, marker=str(Path(rec.dir) / "qemu.pid"), grace=3.0)

    def _wait_gone(self, rec: GuestRecord, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(rec.pid):
                return True
            time.sleep(0.05)
        return not pid_alive(rec.pid)

    def qmp(self, rec: GuestRecord, command: str, args: Mapping[str, object] | None = None) -> Any:
        """One QMP command on the guest's monitor socket.

        :raise MachineError: when the monitor is unreachable or the command fails.
        """
        return qmp_execute(rec.qmp, command, args)

    def capture_dir(self, rec: GuestRecord) -> Path:
        """The guest's own run directory (0700, labctl's user, which QEMU runs as)."""
        return Path(rec.dir)

    def emulator_version(self) -> str:
        """``qemu-system-x86_64 --version``'s first line."""
        return qemu_version()

    def qemu_log(self, rec: GuestRecord) -> Path | None:
        return Path(rec.dir) / "qemu.log"

    def exit_reason(self, rec: GuestRecord) -> str:
        try:
            with open(os.path.join(rec.dir, "qemu.log"), errors="replace") as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError:
            lines = []
        return lines[-1] if lines else "no message from QEMU"
