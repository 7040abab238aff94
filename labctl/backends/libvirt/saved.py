"""A libvirt guest's saved states: libvirt's own save and restore (``virDomainSave`` /
``virDomainRestore``), for ``reset`` and checkpoints.

A state called ``LABEL`` is two files in a directory of root's on the
guest's host (``/var/lib/libvirt/labctl-run/<domain>.saved/``, 0700,
journaled before it is made and removed whole at ``down``): ``LABEL.save``,
the machine as libvirt saved it, and ``LABEL.qcow2``, a copy of the guest's
disk overlay made while the machine was stopped. Not in the guest's own
directory there: that one is QEMU's user's, and a QEMU that a guest took
over could put a link in place of the disk copy for root to read from.
The host's SSH login must be root's for a remote host (as ``cp`` of the
disk, owned by QEMU's user, needs). Saving stops the domain (a transient domain is then gone);
it is restored from the file just written at once, so the guest runs on
where it was, its console appended to the same log. Restoring puts the
overlay copy back in place of the guest's disk and restores the machine,
paused until the console relay is attached again.

A state saved by ``reset`` and checkpoints is the guest's own: it holds the
instance's own host key and is never used by another instance. A restored
guest's wall clock starts from where it was when the state was saved (as
after a qemu-backend reset).

A class's post-boot state is shared instead (warm start, :class:`Template`):
the first instance on a host boots with throwaway keys (a host key and a
client key no student ever gets), its post-boot state is saved with those,
and it is then handed its own keys over SSH. Every later instance of that
host starts from a copy of that state whose header names it
(:mod:`.saveimage`), with a copy of the disk, and is handed its own keys the
same way; so is any guest restored from such a state (``throwaway_state``
in its record). No instance's own key is in a shared state.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import labctl.backends.libvirt.host as hostfs
import labctl.backends.libvirt.saveimage as saveimage  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends.base import GuestRecord
from labctl.backends.libvirt.api import (
    CONSOLE_ATTACH_TIMEOUT,
    RELAY,
    connection,
    destroy,
    host_command,
    host_io,
    lookup,
    message,
    qemu_pid,
    wait_gone,
    where,
)
from labctl.backends.libvirt.binding import binding
from labctl.backends.owned import record as record_owned
from labctl.errors import MachineError
from labctl.lab import HostPlace, host_place
from labctl.proc import spawn, stop_pid

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
POSTBOOT = "postboot"


def _host(rec: GuestRecord) -> HostPlace:
    return host_place(str(rec.extra.get("host") or "local"), str(rec.extra["uri"]))


def _files(rec: GuestRecord, label: str) -> tuple[str, str, str]:
    """(the save file, the disk copy, the guest's disk) on its host."""
    if not LABEL.fullmatch(label):
        raise ValueError(f"invalid saved-state label {label!r}")
    base = _states_dir(rec)
    return f"{base}/{label}.save", f"{base}/{label}.qcow2", str(rec.extra["volumes"][0])


def _states_dir(rec: GuestRecord) -> str:
    return states_dir(str(rec.extra["domain"]))


def states_dir(domain: str) -> str:
    """Root's directory of a domain's saved states on its host."""
    return hostfs.guest_run_dir(domain) + ".saved"


def _make_states_dir(rec: GuestRecord, host: HostPlace) -> None:
    make_states_dir(Path(rec.dir), rec.name, str(rec.extra["domain"]), host)


def make_states_dir(guest_dir: Path, guest: str, domain: str, host: HostPlace) -> str:
    """Root's 0700 directory for the guest's states on its host, journaled first; its path.

    :raise HostError: when the host cannot make it.
    """
    path = states_dir(domain)
    record_owned(guest_dir, {"backend": "libvirt", "kind": "host-dir", "uri": host.uri, "host": host.name,
                             "path": path})
    host_command(host, ["sh", "-c", 'mkdir -p -m 0700 -- "$1" && chown 0:0 -- "$1" && chmod 0700 -- "$1"',
                        "sh", path], f"make {path} for the saved states of guest {guest}")
    return path


@dataclass(frozen=True)
class Template:
    """A guest's post-boot state saved with throwaway keys, that the same guest of other
    instances on its host starts from (``class up``)."""

    host: str  # the host's name in the lab ("local" without hosts)
    uri: str
    ident: str  # the instance that saved it
    guest: str
    save: str  # the save file and the disk copy, on the host
    disk: str
    shape: str  # the domain's shape (saveimage.shape): only a guest of the same shape starts from it
    dir: str  # that guest's run directory here: its throwaway keys (labctl.up.warm's SHARED_*)
    drivers: dict[str, str]  # its NICs' drivers, as its boot reported them


def template_of(rec: GuestRecord, ident: str, drivers: dict[str, str]) -> Template | None:
    """The shared post-boot state ``rec`` (a guest of instance ``ident``) saved, if any."""
    if rec.extra.get("throwaway_state") != POSTBOOT or not has_state(rec, POSTBOOT):
        return None
    try:
        xml = (Path(rec.dir) / "domain.xml").read_text()
    except OSError:
        return None
    state, copy, _disk = _files(rec, POSTBOOT)
    return Template(str(rec.extra.get("host") or "local"), str(rec.extra["uri"]), ident, rec.name, state, copy,
                    saveimage.shape(xml, ident), rec.dir, dict(drivers))


def start_from(conn: Any, template: Template, host: HostPlace, guest_dir: Path, guest: str, domain: str,
               ident: str, ssh_port: int, disk: str) -> Any:
    """Start domain ``domain`` (guest ``guest`` of instance ``ident``) paused from ``template``:
    a copy of its state naming this domain becomes the guest's own post-boot state (with a copy
    of its disk, also put in place of ``disk``), and libvirt restores it; the domain.

    :raise MachineError: when the template cannot be read or rewritten, or libvirt refuses it.
        :raise HostError: when the host cannot copy it.
    """
    base = make_states_dir(guest_dir, guest, domain, host)
    state, copy = f"{base}/{POSTBOOT}.save", f"{base}/{POSTBOOT}.qcow2"
    where_ = where(host.uri, host.name)
    blob = host_io(host, ["head", "-c", str(saveimage.READ_FIRST), "--", template.save],
                   f"read the saved state of guest {template.guest} of {template.ident}")
    try:
        header = saveimage.parse(blob)
        new = saveimage.rewrite(header, saveimage.retarget(header.xml, template.ident, ident, ssh_port))
    except (saveimage.SaveImageError, UnicodeDecodeError) as exc:
        raise MachineError(f"guest {guest}: the post-boot state of {template.ident} on {where_} "
                           f"cannot start it: {exc}") from exc
    host_io(host, ["sh", "-c", ('cp --sparse=always -- "$1" "$2" && '
                                'dd of="$2" bs="$3" count=1 conv=notrunc iflag=fullblock status=none && '
                                'cp --sparse=always -- "$4" "$5" && cp --sparse=always -- "$4" "$6"'),
                   "sh", template.save, state, str(len(new)), template.disk, copy, disk],
            f"copy the post-boot state of {template.ident} for guest {guest}", data=new, timeout=120.0)
    lv = binding()
    try:
        conn.restoreFlags(state, None, lv.VIR_DOMAIN_SAVE_PAUSED)
    except lv.libvirtError as exc:
        raise MachineError(f"libvirt ({where_}) could not start guest {guest} from the post-boot state "
                           f"of {template.ident}: {message(exc)}") from exc
    dom = lookup(conn, domain)
    if dom is None:
        raise MachineError(f"guest {guest}: domain {domain} vanished after its restore")
    return dom


def has_state(rec: GuestRecord, label: str) -> bool:
    """True when the guest's record says ``label`` was saved."""
    return label in (rec.extra.get("saved") or [])


def save(rec: GuestRecord, label: str, resume: bool = True) -> GuestRecord:
    """Save the running guest as ``label`` (machine and disk) and let it run on (or stay paused
    unless ``resume``: a checkpoint resumes its guests together); its new record.

    :raise MachineError: when libvirt cannot save or restore it. :raise HostError: when its
        host cannot copy the disk.
    """
    host = _host(rec)
    state, copy, disk = _files(rec, label)
    _make_states_dir(rec, host)
    with connection(host.uri, host.name) as conn:
        dom = lookup(conn, rec)
        if dom is None:
            raise MachineError(f"guest {rec.name}: domain {rec.extra['domain']} is not running on "
                               f"{where(host.uri, host.name)}")
        try:
            dom.save(state)  # the machine stops; the transient domain is gone
        except binding().libvirtError as exc:
            raise MachineError(f"libvirt ({where(host.uri, host.name)}) could not save guest {rec.name}: "
                               f"{message(exc)}") from exc
    _stop_relay(rec)
    host_command(host, ["cp", "--sparse=always", "--", disk, copy], f"keep the disk of guest {rec.name}")
    rec = _restore_file(rec, host, state, fresh_console=False, resume=resume)
    rec.extra["saved"] = sorted({*rec.extra.get("saved", []), label})
    return rec


def restore(rec: GuestRecord, label: str, fresh_console: bool = True, resume: bool = True) -> GuestRecord:
    """Put the guest back to its state ``label``: stop it, its disk the copy, the machine restored
    (and resumed unless ``resume`` is False); its console goes on in a new ``console.log`` (the old
    one kept as ``console.prev.log``), or in the same one unless ``fresh_console``.

    :raise MachineError: when libvirt cannot restore it. :raise HostError: when its host cannot
        copy the disk back.
    """
    host = _host(rec)
    state, copy, disk = _files(rec, label)
    with connection(host.uri, host.name) as conn:
        dom = lookup(conn, rec)
        if dom is not None:
            destroy(dom)
            wait_gone(conn, rec, 5.0)
    _stop_relay(rec)
    console = Path(rec.console)
    if fresh_console and console.exists():
        console.replace(console.with_name("console.prev.log"))
    host_command(host, ["cp", "--sparse=always", "--", copy, disk], f"put back the disk of guest {rec.name}")
    return _restore_file(rec, host, state, fresh_console, resume)


def forget(rec: GuestRecord, label: str) -> GuestRecord:
    """Remove the guest's state ``label`` from its host; its new record.

    :raise HostError: when the host cannot remove it.
    """
    state, copy, _disk = _files(rec, label)
    host_command(_host(rec), ["rm", "-f", "--", state, copy], f"remove the saved state {label} of guest {rec.name}")
    rec.extra["saved"] = [s for s in rec.extra.get("saved", []) if s != label]
    return rec


def resume(rec: GuestRecord) -> None:
    """Let a guest restored paused run. :raise MachineError: when its domain is gone."""
    _domain_call(rec, "resume")


def suspend(rec: GuestRecord) -> None:
    """Pause a running guest (a checkpoint's one instant). :raise MachineError: when its domain is gone."""
    _domain_call(rec, "suspend")


def _domain_call(rec: GuestRecord, verb: str) -> None:
    host = _host(rec)
    with connection(host.uri, host.name) as conn:
        dom = lookup(conn, rec)
        if dom is None:
            raise MachineError(f"guest {rec.name}: domain {rec.extra['domain']} is not running "
                               f"on {where(host.uri, host.name)}")
        getattr(dom, verb)()


def _restore_file(rec: GuestRecord, host: HostPlace, state: str, fresh_console: bool,
                  resume: bool = True) -> GuestRecord:
    lv = binding()
    gdir = Path(rec.dir)
    with connection(host.uri, host.name) as conn:
        try:
            conn.restoreFlags(state, None, lv.VIR_DOMAIN_SAVE_PAUSED)
        except lv.libvirtError as exc:
            raise MachineError(f"libvirt ({where(host.uri, host.name)}) could not restore guest {rec.name} "
                               f"from {state}: {message(exc)}") from exc
        dom = lookup(conn, str(rec.extra["domain"]))
        if dom is None:
            raise MachineError(f"guest {rec.name}: domain {rec.extra['domain']} vanished after its restore")
        uuid = dom.UUIDString()
        relay = attach_console(gdir, rec.name, host, uuid, fresh=fresh_console)
        if resume:
            dom.resume()
    rec.extra.update(uuid=uuid, relay_pid=relay)
    if not host.remote:
        rec.pid = qemu_pid(str(rec.extra["domain"])) or rec.pid
    return rec


def _stop_relay(rec: GuestRecord) -> None:
    pid = int(rec.extra.get("relay_pid") or 0)
    if pid:
        stop_pid(pid, RELAY)


def attach_console(gdir: Path, guest: str, host: HostPlace, uuid: str, fresh: bool) -> int:
    """Start the guest's console relay (journaled) and wait until it is attached; its pid.
    ``fresh``: a new ``console.log``; else the relay appends to the one there.

    :raise MachineError: when the relay exits or does not attach in time.
    """
    from labctl.backends.libvirt.relay import ATTACHED

    console = gdir / "console.log"
    if fresh:
        console.unlink(missing_ok=True)
    log_path = gdir / "console-relay.log"
    before = _count(log_path, ATTACHED)
    proc = spawn([sys.executable, "-m", RELAY, host.uri, uuid, str(console)], log_path)
    record_owned(gdir, {"backend": "libvirt", "kind": "process", "pid": proc.pid, "marker": RELAY})
    deadline = time.monotonic() + CONSOLE_ATTACH_TIMEOUT
    while not (console.exists() and _count(log_path, ATTACHED) > before):
        if proc.poll() is not None or time.monotonic() > deadline:
            text = log_path.read_text(errors="replace").strip() if log_path.exists() else ""
            raise MachineError(f"could not read the console of guest {guest} on "
                               f"{where(host.uri, host.name)}: {text or 'the console relay did not attach'}")
        time.sleep(0.05)
    return proc.pid


def _count(path: Path, text: str) -> int:
    try:
        return path.read_text(errors="replace").count(text)
    except OSError:
        return 0

