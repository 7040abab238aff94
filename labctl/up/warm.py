"""A guest's life around its post-boot snapshot: setup and snapshot after a cold boot, restore
instead of a boot (warm start, reset), and resuming a restored guest as this lab's.

No guest's own key is ever in a snapshot. A guest whose boot is to become
the post-boot snapshot boots with a throwaway host key (``boot_host_key``,
fresh for that boot, never any guest's own key; labctl pins it in
``boot_known_hosts`` for its setup commands). Once the snapshot is taken,
:func:`hand_over_keys` gives the guest its own host key (the standby sshd the
agent started just before the snapshot takes it; guest/init) and
``boot_host_key`` becomes a copy of it for any later boot of that QEMU. So the
snapshot's RAM and disk hold only the throwaway key, which no guest ever
serves again.

A libvirt class shares a post-boot state the same way, with throwaway keys,
over SSH (a libvirt guest has no agent): :func:`boot_shared`,
:func:`hand_over_shared`, :func:`shared_templates`.

A restored guest is made indistinguishable from a booted one: QEMU loads the
state (its NICs reattach to this lab's links, its management NIC to a new
SSH port), the guest agent installs this lab's client key and this guest's
own host key and sets the wall clock (:func:`adopt`, every restore), and the
caller then checks SSH with the lab's pinned keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import labctl.up.agent as agent  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.snapshots as snapshots  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import GUEST_MEMORY, get_backend, load_state, qmp_execute
from labctl.endpoint import Endpoint
from labctl.errors import GuestError, LabctlError, SnapshotBroken
from labctl.image import AGENT_BUILTINS
from labctl.paths import atomic_write
from labctl.state import LabState, recorded_snapshots
from labctl.up.keys import known_hosts_line, new_keypair
from labctl.up.snapshots import Snapshot

AGENT_WAIT = 20.0  # the agent starts in the background at boot (it loads virtio_console first)
STANDBY_WAIT = 20.0  # the agent starts a standby sshd (0.4-0.6 s under TCG, more on a busy host)
HOST_KEY, BOOT_KEY, BOOT_KNOWN_HOSTS = "ssh_host_ed25519_key", "boot_host_key", "boot_known_hosts"
CONFIG, STANDBY_RECORD = "guest.conf", "sshd standby"  # the guest's configuration (labctl.up.guestconf)
# A libvirt class's shared post-boot state (labctl.backends.libvirt.saved.Template): the throwaway
# client key it authorizes (private, never in a handout) and its throwaway host key's public line.
SHARED_CLIENT_KEY, SHARED_HOST_PUB = "shared_client_key", "shared_host_key.pub"


def run_setup(ep: Endpoint, commands: tuple[str, ...], timeout: float = 300.0,
              abort: Callable[[], str | None] | None = None) -> None:
    """Run a guest's ``setup`` commands in order, over SSH (``abort``: polled meanwhile, a reason
    ends the wait, as :meth:`labctl.ssh.Session.run` says).

    :raise GuestError: when one fails (its status and the end of its output).
    """
    if not commands:
        return
    from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

    with Session(ep) as s:
        for i, command in enumerate(commands):
            res = s.run(command, timeout=timeout, abort=abort)
            if res.status != 0:
                tail = (res.stderr or res.stdout).decode(errors="replace").strip()[-500:]
                raise GuestError(f"guest {ep.guest}: setup[{i}] exited with status {res.status}: {command}"
                                 + (f"\n{tail}" if tail else ""))


def snapshot_after_boot(qmp: Path, overlay: Path, agent_channel: Path, snapshot_key: str, guest: str,
                        drivers: dict[str, str], lab: str = "", emulator: str = "unknown") -> Snapshot | str:
    """Take the guest's post-boot snapshot; the snapshot, or why there is none (a warning).

    The guest must have booted with a throwaway host key (:func:`boot_with_throwaway`); its
    public line is recorded (``boot_host_key`` in the snapshot's meta), nothing else of a key;
    so is the QEMU that saved it (``emulator``, its version line).
    """
    if not agent.wait_ready(agent_channel, AGENT_WAIT):
        return (f"guest {guest}: no post-boot snapshot (its agent did not answer: the kernel needs "
                "CONFIG_VIRTIO_CONSOLE); later ups boot it cold")
    # A second sshd waiting for its host key (guest/init): each restore hands it the guest's own
    # key instead of making sshd start again. Without one, restores reload sshd (slower).
    try:
        agent.call(agent_channel, "standby", timeout=STANDBY_WAIT)
        standby = True
    except GuestError:
        standby = False
    try:
        snap = snapshots.take(qmp, overlay, snapshot_key, {"lab": lab, "guest": guest, "drivers": drivers,
                                                           "boot_host_key": _boot_public(overlay.parent),
                                                           "standby_sshd": standby, "qemu": emulator},
                              console=overlay.parent / "console.log")
        with contextlib.suppress(OSError):  # older snapshots that stay are only disk space
            snapshots.prune_older(snap, recorded_snapshots())
        return snap
    except LabctlError as exc:
        return f"guest {guest}: no post-boot snapshot: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - a snapshot is an optimisation: never fail the up for it
        return f"guest {guest}: no post-boot snapshot: {exc}"


def load(qmp: Path, state_file: Path, paused: bool = False, snapshot: bool = False) -> float:
    """Load a saved state into a QEMU started with ``-incoming defer`` and (unless ``paused``)
    let the guest run; seconds taken. ``snapshot``: a post-boot snapshot's device state, its
    RAM already mapped from the snapshot's memory file (:func:`restore_disk`); else a whole
    stream (a checkpoint's), loaded over whatever the guest maps."""
    t0 = time.monotonic()
    load_state(qmp, state_file, ignore_shared=snapshot)
    if not paused:
        qmp_execute(qmp, "cont")
    return time.monotonic() - t0


def _boot_public(guest_dir: Path) -> str:
    try:
        return (guest_dir / (BOOT_KEY + ".pub")).read_text().strip()
    except OSError:
        return ""


def boot_with_throwaway(guest_dir: Path, comment: str) -> str:
    """A fresh throwaway ``boot_host_key`` for a boot that becomes the post-boot snapshot (no
    guest ever serves it after that boot); its public line."""
    return new_keypair(guest_dir / BOOT_KEY, comment).public_line


def boot_with_own_key(guest_dir: Path) -> None:
    """``boot_host_key`` a copy of the guest's own host key: a boot that is not snapshotted
    (and every later start of its QEMU) comes up with its own key, and with an sshd that listens
    (a reset that boots it because its snapshot is gone: nobody would hand a standby its key)."""
    atomic_write(guest_dir / BOOT_KEY, (guest_dir / HOST_KEY).read_bytes(), 0o600)
    (guest_dir / (BOOT_KEY + ".pub")).unlink(missing_ok=True)
    conf = guest_dir / CONFIG
    try:
        text = conf.read_text()
    except OSError:
        return
    if STANDBY_RECORD in text.splitlines():
        atomic_write(conf, "".join(ln for ln in text.splitlines(keepends=True) if ln.strip() != STANDBY_RECORD), 0o644)


def write_boot_known_hosts(guest_dir: Path, port: int, public: str = BOOT_KEY + ".pub") -> None:
    """Pin the throwaway boot key (``boot_known_hosts``; its public line in ``public``) for the
    guest's SSH port."""
    line = (guest_dir / public).read_text().strip()
    atomic_write(guest_dir / BOOT_KNOWN_HOSTS, known_hosts_line(port, line) + "\n", 0o600)


def boot_endpoint(ep: Endpoint, guest_dir: Path) -> Endpoint:
    """``ep`` pinning the throwaway boot key instead of the guest's own (and logging in with
    the throwaway client key of a shared libvirt state, when the guest has one)."""
    shared = guest_dir / SHARED_CLIENT_KEY
    return dataclasses.replace(ep, known_hosts=guest_dir / BOOT_KNOWN_HOSTS,
                               key=shared if shared.exists() else ep.key)


def boot_shared(guest_dir: Path, authorized_keys: Path, comment: str) -> None:
    """Throwaway keys for a libvirt boot whose post-boot state is to be shared: a host key
    (``boot_host_key``, its public line kept as ``shared_host_key.pub``) and a client key
    (``shared_client_key``, its line in ``authorized_keys``, which the guest boots with)."""
    line = boot_with_throwaway(guest_dir, comment)
    atomic_write(guest_dir / SHARED_HOST_PUB, line + "\n", 0o600)
    client = new_keypair(guest_dir / SHARED_CLIENT_KEY, comment)
    atomic_write(authorized_keys, client.public_line + "\n", 0o600)


# A standby sshd (guest/init's spawn_standby) started over SSH, waiting in open() of its key
# FIFO: what a libvirt guest's shared post-boot state is saved with, so that each restore's key
# handover starts no program (the standby binds port 22 once it reads its key).
_STANDBY_SCRIPT = (
    "sd=/run/labctl-sshd && mkdir -p -m 0700 $sd && rm -f $sd/host_key $sd/host_key.new && "
    "mkfifo -m 0600 $sd/host_key && { setsid /usr/sbin/sshd -D -r -h $sd/host_key </dev/null >/dev/null 2>&1 & "
    "p=$!; } && exec {nap}<> <(:) && for ((i = 0; i < 1500; i++)); do w= nr=; "
    "read -r w 2>/dev/null < /proc/$p/wchan; read -r nr _ 2>/dev/null < /proc/$p/syscall; "
    "{ [ \"$w\" = wait_for_partner ] || [ \"$nr\" = 257 ]; } && exit 0; kill -0 $p 2>/dev/null || break; "
    "read -r -t 0.01 -u $nap; done; kill -KILL $p 2>/dev/null; rm -f $sd/host_key; exit 1")


def start_standby(boot_ep: Endpoint, timeout: float = 30.0) -> str | None:
    """Start a standby sshd in a libvirt guest about to be saved as a shared post-boot state
    (over SSH, the throwaway keys pinned); None, or why there is none (a warning: each restore
    then has sshd re-execute itself to read its key, slower)."""
    try:
        from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

        with Session(boot_ep, timeout=timeout) as s:
            res = s.run(_STANDBY_SCRIPT, timeout=timeout)
    except GuestError as exc:
        return f"guest {boot_ep.guest}: no standby sshd in its shared post-boot state: {exc.message}"
    if res.status != 0:
        return (f"guest {boot_ep.guest}: no standby sshd in its shared post-boot state (status {res.status}): "
                + (res.stderr or res.stdout).decode(errors="replace").strip()[-300:])
    return None


def take_shared_keys(template_dir: Path, guest_dir: Path) -> None:
    """The throwaway keys of the shared state a guest is to start from (``template_dir``: the
    guest that saved it), to hand it its own keys with. :raise GuestError: when they are gone."""
    try:
        for name in (SHARED_CLIENT_KEY, SHARED_HOST_PUB):
            atomic_write(guest_dir / name, (template_dir / name).read_bytes(), 0o600)
    except OSError as exc:
        raise GuestError(f"the shared post-boot state's keys are gone from {template_dir}: {exc}") from exc


def hand_over_shared(guest_dir: Path, ep: Endpoint, deadline: float) -> None:
    """A libvirt guest restored from a shared post-boot state (it answers with the state's
    throwaway keys): its own host key and the lab's client key, and the host's clock, over SSH.

    :raise GuestError: when that fails until ``deadline``.
    """
    write_boot_known_hosts(guest_dir, ep.port, SHARED_HOST_PUB)
    boot_ep = dataclasses.replace(ep, key=guest_dir / SHARED_CLIENT_KEY, known_hosts=guest_dir / BOOT_KNOWN_HOSTS)
    keys = agent.keys_command(*own_keys(guest_dir))
    try:
        while True:
            try:
                _keys_over_ssh(boot_ep, keys, max(1.0, min(30.0, deadline - time.monotonic())))
                return
            except (GuestError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise GuestError(f"guest {ep.guest}: its own keys could not be handed over after its "
                                     f"restore: {exc}") from exc
                time.sleep(0.2)
    finally:
        (guest_dir / BOOT_KNOWN_HOSTS).unlink(missing_ok=True)


def own_keys(guest_dir: Path) -> tuple[bytes, bytes]:
    """The lab's authorized_keys line and the guest's own host key (private)."""
    return (guest_dir / "authorized_keys").read_bytes(), (guest_dir / HOST_KEY).read_bytes()


def hand_over_keys(guest_dir: Path, boot_ep: Endpoint, agent_wait: float, timeout: float = 30.0) -> None:
    """Give a guest that booted with the throwaway key its own host key, and the host's time:
    through its agent, or, when the agent does not answer within ``agent_wait`` (a kernel without
    virtio-console), over SSH with the throwaway key pinned. sshd listens again with it when this
    returns. (A boot's clock is 0 to 2 s behind the host's, as QEMU starts the RTC at a whole second
    and the kernel reads it whole; a snapshot or a libvirt save since then stopped it meanwhile.)

    :raise GuestError: when neither way works.
    """
    boot_with_own_key(guest_dir)  # later starts of its QEMU (a reset that boots) read its own key
    keys = agent.keys_command(*own_keys(guest_dir))
    channel = agent.channel_of(guest_dir)
    try:
        if agent.wait_ready(channel, agent_wait):
            agent.set_clock(channel, timeout)
            agent.exchange(channel, [keys], timeout)
        else:
            _keys_over_ssh(boot_ep, keys, timeout)
    finally:
        (guest_dir / BOOT_KNOWN_HOSTS).unlink(missing_ok=True)


# What the agent's "keys" does (guest/init), as one command for root's bash, with builtins
# only (the image's own among them, _BUILTINS, enabled before it: every program run first after
# a restore costs a fresh translation under TCG): when a standby sshd waits for its key on the
# FIFO (a libvirt class's shared state), it takes over from the listening sshd; else sshd re-executes itself on SIGHUP. Either writes
# its pid file again once it listens.
_KEYS_SCRIPT = (
    "umask 077 && printf '%s\\n' @LINE@ > /root/.ssh/authorized_keys && "
    "printf '%s\\n' @KEY@ > /etc/ssh/ssh_host_ed25519_key && "
    "exec {nap}<> <(:) && sd=/run/labctl-sshd && read -r pid < /run/sshd.pid && "
    "if [ -p $sd/host_key ]; then "
    "exec {kfd}<>$sd/host_key && : > /run/sshd.pid && kill -KILL \"$pid\" && "
    # port 22 free (its listening socket gone from /proc/net/tcp), then the key to the standby
    "for ((i = 0; i < 500; i++)); do l=; while read -r _ a _ _ st _; do "
    "[ \"${a#*:}\" = 0016 ] && [ \"$st\" = 0A ] && l=1; done < /proc/net/tcp; "
    "[ -z \"$l\" ] && break; read -r -t 0.01 -u $nap; done; "
    "printf '%s\\n' @KEY@ > $sd/host_key.new && labctl_rename $sd/host_key.new $sd/host_key && "
    "printf '%s\\n' @KEY@ >&$kfd && exec {kfd}>&-; "
    "else { [ ! -f $sd/host_key ] || printf '%s\\n' @KEY@ > $sd/host_key; } && "
    ": > /run/sshd.pid && kill -HUP \"$pid\"; fi && "
    "for ((i = 0; i < 500; i++)); do read -r pid < /run/sshd.pid; [ -n \"$pid\" ] && exit 0; "
    "read -r -t 0.01 -u $nap; done; exit 1")


# The image's bash builtins labctl_clock and labctl_rename (guest/builtins.c) in root's shell, else
# date and mv in their place: each program run first after a restore costs 0.07-0.2 s under TCG.
_BUILTINS = (f"{{ enable -f {AGENT_BUILTINS} labctl_clock labctl_rename 2>/dev/null || "
             "{ labctl_clock() { date -s \"@$1\" >/dev/null; }; labctl_rename() { mv -f \"$1\" \"$2\"; }; }; }")


def _set_clock() -> str:
    """``labctl_clock`` with the host's time now (the builtins enabled first: :data:`_BUILTINS`)."""
    now = time.time_ns()
    return f"labctl_clock {now // 10**9}.{now % 10**9:09d}"


def clock_command() -> str:
    """A shell command setting the guest's wall clock to the host's now (built once logged in:
    it is off by that session's round trip at most)."""
    return f"{_BUILTINS} && {_set_clock()}"


def _keys_over_ssh(boot_ep: Endpoint, keys: str, timeout: float) -> None:
    """The agent's ``keys`` (guest/init) done over SSH, the throwaway boot key pinned, the guest's
    wall clock set to the host's first (off by the session's round trip at most)."""
    _, kind, blob, pem = keys.split(" ")
    host_key = " ".join(shlex.quote(x) for x in
                        ["-----BEGIN OPENSSH PRIVATE KEY-----", *pem.split(","), "-----END OPENSSH PRIVATE KEY-----"])
    from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

    with Session(boot_ep, timeout=timeout) as s:
        script = _KEYS_SCRIPT.replace("@LINE@", shlex.quote(kind + " " + blob)).replace("@KEY@", host_key)
        res = s.run(f"{_BUILTINS} && {_set_clock()} && {script}", timeout=timeout)
    if res.status != 0:
        raise GuestError(f"guest {boot_ep.guest}: installing its host key failed (status {res.status}): "
                         + (res.stderr or res.stdout).decode(errors="replace").strip()[-300:])


#: seconds: a clock command over SSH that took longer (channel, shell and all) set a stale time, and
#: goes again (at most ``agent.CLOCK_TRIES``). On a loaded host one was seen 2.4 s late (test_warm_reset).
SSH_CLOCK_SLACK = 0.5


def set_clock_over_ssh(ep: Endpoint, timeout: float = 30.0) -> None:
    """The guest's wall clock set to the host's over SSH, after its post-boot state was saved (the
    guest's clock stood still meanwhile; a libvirt guest is even given back the clock it was saved
    with). A command that took longer than :data:`SSH_CLOCK_SLACK` set a time stale by then and is
    sent again, in the same session. :raise GuestError: when that fails."""
    from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

    with Session(ep, timeout=timeout) as s:
        def send() -> None:
            res = s.run(clock_command(), timeout=timeout)
            if res.status != 0:
                raise GuestError(f"guest {ep.guest}: its clock could not be set (date exited {res.status})")

        agent.sent_promptly(send, SSH_CLOCK_SLACK)


def adopt(guest_dir: Path) -> None:
    """Make a restored guest this lab's: the lab's client key, the guest's own host key (a
    snapshot never holds them) and the host's time.

    :raise GuestError: when its agent does not answer.
    """
    agent.adopt(agent.channel_of(guest_dir), own_keys(guest_dir))


def restore_disk(snap: Snapshot, overlay: Path, console: Path | None = None) -> None:
    """The guest's disk as it was at the snapshot: a new overlay on the snapshot's; its RAM the
    snapshot's memory file (``memory`` beside the overlay a link to it, mapped privately); and its
    console starting with the boot the snapshot was taken after (QEMU appends to it).

    :raise SnapshotBroken: when the snapshot's memory file is not as it was saved (nothing changed).
    """
    link_memory(snap, overlay.with_name(GUEST_MEMORY))
    snapshots.restored_overlay(snap, overlay)
    if console is not None:
        try:
            boot = snap.console.read_bytes()
        except OSError:
            boot = b""
        when = snap.meta.get("created_at", "?")
        with open(console, "ab") as f:
            f.write(boot + (b"" if not boot or boot.endswith(b"\n") else b"\n"))
            f.write(f"labctl: restored from the post-boot snapshot {snap.key} (taken {when}); "
                    "the boot above is that one\n".encode())


def check_memory(snap: Snapshot) -> None:
    """:raise SnapshotBroken: with the reason, when the snapshot's memory file is not as it was saved."""
    why = snap.memory_problem()
    if why:
        raise SnapshotBroken(f"the post-boot snapshot {snap.key} cannot be restored: {why}",
                             hint=f"remove {snap.dir}: the next up boots the guest and saves a new one")


def link_memory(snap: Snapshot, dest: Path) -> None:
    """``dest`` a link to the snapshot's memory file, once that file is checked to be as it was
    saved (its size and identity: a truncated one would fault under the guest mapping it).

    :raise SnapshotBroken: with the reason, when it is not.
    """
    check_memory(snap)
    dest.unlink(missing_ok=True)
    dest.symlink_to(snap.memory)


def shared_templates(state: LabState) -> dict[tuple[str, str], Any]:
    """(guest, host name) -> the shared post-boot state each guest of ``state`` (a class instance,
    just up, on a backend that saves states on its hosts) saved with throwaway keys: what the next
    instances on its host start from (:meth:`labctl.backends.Backend.template_of`)."""
    backend = get_backend(state.backend)
    out: dict[tuple[str, str], Any] = {}
    for name, rec in state.guests.items():
        template = backend.template_of(rec, state.lab, state.drivers.get(name, {}))
        if template is not None:
            out[(name, template.host)] = template
    return out
