"""Following packets on some guests of a lab that is up: the probes in each guest, their clocks, the wire.

:class:`Follower` is used by ``labctl follow`` (live, :mod:`.livefollow`) and by a step's ``follow:``
(:mod:`labctl.steps.follow_kind`). It

1. checks every guest first (tracefs, event probes, kprobes, the kernel's struct offsets) and
   refuses before anything starts when one cannot follow;
2. removes what a killed labctl left in a guest (its event groups and instances), defines the
   probes of :mod:`.probes` with the filter as each event's kernel filter, and enables them in an
   instance of its own;
3. takes rounds of clock samples (:meth:`sync`): the host writes ``R.I`` on one SSH channel, the
   guest writes the marker ``labctl-sync R.I`` into the instance and answers; the marker's time
   in the guest lies between the host's send and receive (:class:`labctl.trace.journey.Clock`);
4. captures each followed NIC on the host side (QEMU's filter-dump, the first
   :data:`WIRE_SNAPLEN` bytes of each frame) for the wire hops;
5. removes everything again (:meth:`stop`), also after an error.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import labctl.follow.probes as pr
import labctl.follow.tunnelprobes as tunnelprobes  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.follow.vlanprobes as vlanprobes  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import paths
from labctl.backends import Backend
from labctl.errors import GuestError, LabctlError, ProcessError, TraceError
from labctl.kernel import Kernel, enum_names, struct_offsets
from labctl.lab import Framing, guest_interfaces
from labctl.live import Capture, CaptureTail, discard_capture, start_capture, stop_capture
from labctl.net import Frame
from labctl.pktfilter import FilterError, Node, parse, refuse_options, tokenize, vlan_of
from labctl.ssh import Pipe, Result, Session
from labctl.state import LabState, load_netstate
from labctl.trace import Clock, Event, Topology, Wire, frame_vlans

log = logging.getLogger(__name__)
WIRE_SNAPLEN = 160
"""Enough for a tunnel's frame to its inner IPv6 header and the 8 bytes after it, behind an outer IPv6
header: 14 + 40 + 8 + 8 + 14 (VXLAN, Geneve; GRETAP's 16-byte header with a checksum, a key and
sequence numbers, behind an outer IPv4 one, less) + 40 + 8."""
#: How long, and how many, frames read on the host side while nothing followed is in flight are kept
#: unparsed: the guest's events for a frame reach labctl through its SSH channel later than QEMU writes
#: the frame (up to seconds on a loaded host); then the frame is part of a journey.
UNLOOKED_NS = 5_000_000_000
UNLOOKED_MAX = 20_000
SYNC_SAMPLES = (10, 40)  # a round's samples: at least, at most
_SEQ = itertools.count(1)
T = TypeVar("T")


@dataclass
class GuestProbes:
    """One guest's probes: its tag (event group ``labctl_TAG``, instance ``labctl-TAG``), the events the
    kernel took and refused, the ruleset when they started."""

    guest: str
    tag: str
    enabled: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    ruleset: str = ""


def parallel(guests: Sequence[str], fn: Callable[[str], T]) -> dict[str, T]:
    """``fn`` on every guest at once (each guest's SSH round trips overlap); the first error is raised."""
    if len(guests) <= 1:
        return {g: fn(g) for g in guests}
    with ThreadPoolExecutor(max_workers=len(guests)) as pool:
        futures = {g: pool.submit(fn, g) for g in guests}
        return {g: f.result() for g, f in futures.items()}


def offsets_of(state: LabState, guest: str) -> dict[str, int]:
    """The struct offsets the probes need, for ``guest``'s kernel (cached per kernel).

    :raise TraceError: when its kernel has no debug info. :raise LabStateError: no record of its kernel.
    """
    kernel = state.kernel(guest)
    cache = _offsets_cache(kernel)
    out = struct_offsets(kernel, pr.OFFSET_FIELDS, pr.OFFSETS_FILE, cache)
    return {**out, **_optional_offsets(kernel, cache)}


def _offsets_cache(kernel: Kernel) -> Path:
    """Where what was read of ``kernel``'s debug info is kept (made when it can be: a read-only
    cache only costs the reads again)."""
    cache = paths.cache_dir() / "struct-offsets" / kernel.key
    with contextlib.suppress(OSError):
        cache.mkdir(parents=True, exist_ok=True)
    return cache


def _optional_offsets(kernel: Kernel, cache: Path) -> dict[str, int]:
    """Netfilter's offsets, each set where the kernel has it: the skb's conntrack entry (vmlinux), the
    nftables chain's and table's names (the nf_tables module's debug file); none on a kernel without
    netfilter or without its modules' debug files (no conntrack state, no nftables hops then)."""
    out: dict[str, int] = {}
    for fields, name, modules in ((pr.CT_FIELDS, pr.CT_OFFSETS_FILE, ()),
                                  (pr.NFT_FIELDS, pr.NFT_OFFSETS_FILE, (pr.NFT_MODULE,))):
        try:
            out.update(struct_offsets(kernel, fields, name, cache, modules=modules))
        except LabctlError as exc:
            log.debug("kernel %s: %s", kernel.name, exc.message)
    return out


def drop_reasons_of(state: LabState, guest: str) -> list[str]:
    """The names of ``guest``'s kernel's drop reasons by number (its ``enum skb_drop_reason``: 6.12's
    is not 6.1's), for the numbers its drop probe records.

    :raise TraceError: when its kernel has no debug info. :raise LabStateError: no record of its kernel.
    """
    kernel = state.kernel(guest)
    return enum_names(kernel, "enum skb_drop_reason", "SKB_DROP_REASON_", pr.REASONS_FILE, _offsets_cache(kernel))


def _drop_reasons(state: LabState, guest: str) -> list[str]:
    """:func:`drop_reasons_of`, or none (6.1's names then) for a kernel whose debug info lacks the enum."""
    try:
        return drop_reasons_of(state, guest)
    except LabctlError:
        return []


def stale_groups(caps: pr.Caps) -> list[str]:
    """labctl's groups in a guest whose labctl (its pid in the tag, ``fPID...``/``dPID...``) is gone."""
    out = []
    for g in caps.groups:
        digits = "".join(itertools.takewhile(str.isdigit, pr.tag_of(g)[1:]))
        if digits and not _alive(int(digits)):
            out.append(pr.tag_of(g))
    return out


class Unlooked:
    """Host-side frames read while nothing followed was in flight, kept unparsed for
    :data:`UNLOOKED_NS` (at most :data:`UNLOOKED_MAX`): QEMU writes a frame before the guest's events
    for it have come through its SSH channel, so a frame read on such a tick may still be part of a
    journey once they do; unrelated traffic costs no parsing."""

    def __init__(self) -> None:
        self.frames: deque[tuple[tuple[str, str], bytes, int]] = deque(maxlen=UNLOOKED_MAX)

    def add(self, nic: tuple[str, str], frames: Sequence[Frame], wall_minus_mono: int) -> None:
        self.frames.extend((nic, f.data, f.ts_us * 1000 - wall_minus_mono) for f in frames)

    def take(self) -> list[tuple[tuple[str, str], bytes, int]]:
        """Every frame kept (NIC, bytes, host monotonic ns), oldest first; none is kept afterwards."""
        out = list(self.frames)
        self.frames.clear()
        return out

    def expire(self) -> None:
        """Let go of the frames older than :data:`UNLOOKED_NS`."""
        horizon = time.monotonic_ns() - UNLOOKED_NS
        while self.frames and self.frames[0][2] < horizon:
            self.frames.popleft()


def _frame(wire: Wire, nic: tuple[str, str], node: Node, tunnels: Mapping[str, tuple[Framing, list[int]]], data: bytes,
           host_ns: int) -> None:
    """A frame QEMU saw on ``nic``'s host side at ``host_ns`` into ``wire`` when ``node`` matches its
    packet (its own, or the inner one of a lab tunnel's packet: :func:`tunnelprobes.frame_header`):
    when, and its VLAN tags."""
    h = tunnelprobes.frame_header(data, node, tunnels)
    if h is None:
        return
    wire.seen.setdefault(nic, {}).setdefault(h.key(), []).append(host_ns)
    if vids := frame_vlans(data):
        wire.tags.setdefault(nic, {}).setdefault(h.key(), set()).update(vids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _definitions(f: Follower, guest: str) -> tuple[list[str], dict[str, str]]:
    """:meth:`Follower.definitions`: the follow points' probes, then the tunnels' (the outer packet,
    encap, decap: :mod:`labctl.follow.tunnelprobes`), then those of tagged frames for a filter with
    ``vlan`` (:mod:`labctl.follow.vlanprobes`)."""
    caps, prefix = f.caps[guest], pr.PREFIX + f.tag
    defs, filters = pr.definitions(prefix, f.node, f.offsets[guest], caps.reason, caps.symbol)
    more, more_filters = tunnelprobes.definitions(prefix, f.node, f.offsets[guest], f.state.resolved, guest,
                                                  caps.reason, caps.symbol)
    tagged, tagged_filters = vlanprobes.definitions(prefix, f.node, f.offsets[guest])
    return defs + more + tagged, {**filters, **more_filters, **tagged_filters}


def _setup_output(guest: str, res: Result) -> str:
    """What the probes' setup printed (``labctl-ok`` and ``labctl-fail`` lines).

    :raise TraceError: when it printed neither: it did not run at all.
    """
    out = res.stdout.decode(errors="replace")
    if "labctl-ok " not in out and "labctl-fail " not in out:
        why = res.stderr.decode(errors="replace").strip()[-300:]
        raise TraceError(f"{guest}: the follow probes' setup did not run (exit status {res.status})"
                         + (f": {why}" if why else ""))
    return out


class Follower:
    """Probes for one filter on ``guests`` of the lab in ``state`` (see the module docstring).
    ``connect`` opens a guest's SSH session (the steps runner passes its own)."""

    def __init__(self, state: LabState, backend: Backend, guests: Sequence[str], node: Node,
                 connect: Callable[[str], Session] | None = None, *, wire: bool = True,
                 purpose: str = "follow") -> None:
        self.state, self.backend, self.guests, self.node = state, backend, list(guests), node
        self.connect = connect or (lambda g: Session(state.endpoint(g)))
        self.wire_on, self.purpose = wire, purpose
        self.tag = f"f{os.getpid()}x{next(_SEQ)}"
        self.probes: dict[str, GuestProbes] = {}
        self.caps: dict[str, pr.Caps] = {}
        self.offsets: dict[str, dict[str, int]] = {}
        self.reasons: dict[str, list[str]] = {}  # each kernel's drop reasons by number
        self.samples: dict[str, dict[str, tuple[int, int]]] = {g: {} for g in self.guests}
        self.sync_pipes: dict[str, Pipe] = {}
        self.captures: list[Capture] = []
        self.tails: dict[tuple[str, str], CaptureTail] = {}
        self.warnings: list[str] = []
        self.rounds = 0
        self.pipes_lock = threading.Lock()  # a clock round and the heartbeats share each guest's channel
        self.wire = Wire()
        self.tunnels = tunnelprobes.framings(state.resolved)  # the wire captures read a tunnel's inner header too
        self.wall_minus_mono = time.time_ns() - time.monotonic_ns()  # captures are stamped in real time
        self._unlooked = Unlooked()
        self._sessions: dict[str, Session] = {}

    # ------------------------------------------------------------------ set up

    def session(self, guest: str) -> Session:
        if guest not in self._sessions:
            self._sessions[guest] = self.connect(guest)
        return self._sessions[guest]

    def check(self) -> None:
        """Whether every guest can follow: tracefs with event probes and kprobes, its kernel's offsets.

        :raise TraceError: naming each guest that cannot, and why.
        """
        def one(g: str) -> tuple[pr.Caps, dict[str, int] | str]:
            caps = pr.Caps.parse(self.session(g).run(pr.caps_command(), timeout=60).stdout.decode(errors="replace"))
            try:
                return caps, offsets_of(self.state, g)
            except LabctlError as exc:
                return caps, exc.message

        problems = []
        for g, (caps, off) in parallel(self.guests, one).items():
            self.caps[g] = caps
            if isinstance(off, str):
                problems.append(f"{g}: {off}")
            elif not caps.tracefs:
                problems.append(f"{g}: no tracefs in its kernel (CONFIG_FTRACE)")
            elif not (caps.eprobes and caps.kprobes):
                problems.append(f"{g}: its kernel lacks {'event probes (Linux 5.15+)' if not caps.eprobes else ''}"
                                f"{' and ' if not caps.eprobes and not caps.kprobes else ''}"
                                f"{'kprobe events (CONFIG_KPROBE_EVENTS)' if not caps.kprobes else ''}")
            else:
                self.offsets[g], self.reasons[g] = off, _drop_reasons(self.state, g) if caps.reason else []
        if problems:
            raise TraceError("cannot follow packets on " + "; ".join(problems),
                             hint="follow needs tracefs, kprobe events and event probes (Linux 5.15 or later) "
                                  "and the kernel's debug info on the host")

    def definitions(self, guest: str) -> tuple[list[str], dict[str, str]]:
        """The guest's ``dynamic_events`` lines and each follow point's filter."""
        return _definitions(self, guest)

    def start(self) -> None:
        """Probes on in every guest (stale ones of a killed labctl removed first), the first clock round,
        the wire captures. On an error everything started is removed again.

        :raise TraceError: when a guest's kernel refused every probe.
        """
        try:
            parallel(self.guests, self._start_guest)
            self.sync()
            if self.wire_on:
                self._start_captures()
        except BaseException:
            self.stop()
            raise

    def _start_guest(self, g: str) -> None:
        defs, filters = self.definitions(g)
        stale = "; ".join(pr.remove_command(t) for t in stale_groups(self.caps[g]))
        extra = (f"echo labctl-ruleset-begin; {pr.RULESET}; echo labctl-ruleset-end",)
        cmd = (stale + "; " if stale else "") + pr.setup_command(self.tag, defs, filters, pr.FOLLOW_BUFFER_KB, extra)
        self.probes[g] = gp = GuestProbes(g, self.tag)
        out = _setup_output(g, self.session(g).run(cmd, timeout=120))
        gp.enabled, gp.refused = pr.results(out)
        gp.ruleset = _between(out, "labctl-ruleset-begin", "labctl-ruleset-end")
        if not gp.ruleset.strip():  # nf_tables not loaded (no ruleset): nothing for its chains' probes to see
            gp.refused = [r for r in gp.refused if r.split()[-1] not in pr.NFT_POINTS]
        if gp.refused:
            self.warnings.append(f"{g}: the kernel refused {', '.join(gp.refused)}; those hops are not shown")
        if not gp.enabled:
            raise TraceError(f"{g}: the kernel refused every follow probe ({', '.join(gp.refused)})")

    def _start_captures(self) -> None:
        for g in self.guests:
            for nic in self._nics(g):
                try:
                    cap = start_capture(self.state, self.backend, g, nic, purpose=self.purpose, maxlen=WIRE_SNAPLEN)
                except LabctlError as exc:
                    self.warnings.append(f"{g}.{nic}: no wire capture: {exc.message}")
                    continue
                self.captures.append(cap)
                self.tails[(g, nic)] = CaptureTail(cap)
                self.wire.captured.add((g, nic))

    def _nics(self, guest: str) -> list[str]:
        spec = self.state.guest_spec(guest)
        return [str(n["name"]) for n in spec["nics"]] if spec else []

    # ------------------------------------------------------------------ clocks

    def sync(self) -> None:
        """One round of clock samples on every guest: at least 10, and more (up to 40, or 2 s) until the
        three fastest round trips are within a quarter of each other (a busy host's slow ones bound
        nothing)."""
        with self.pipes_lock:
            r = self.rounds
            self.rounds += 1
            parallel(self.guests, lambda g: self._sync_guest(g, r))

    def _sync_guest(self, g: str, r: int) -> None:
        pipe = self.sync_pipes.get(g)
        if pipe is None:
            pipe = self.sync_pipes[g] = self.session(g).pipe(pr.sync_command(self.tag))
        buf = b""
        rtts: list[int] = []
        until = time.monotonic() + 2.0
        for i in range(SYNC_SAMPLES[1]):
            if i >= SYNC_SAMPLES[0] and (time.monotonic() > until or sorted(rtts)[2] <= 1.25 * min(rtts)):
                break
            mark = f"{r}.{i}"
            h1 = time.monotonic_ns()
            pipe.send(f"{mark}\n".encode())
            deadline = time.monotonic() + 10
            while True:  # heartbeats' answers may come first
                while b"\n" not in buf:
                    data = pipe.recv(max(0.01, deadline - time.monotonic()))
                    if data == b"" or time.monotonic() > deadline:
                        raise GuestError(f"guest {g} stopped answering labctl's clock samples")
                    buf += data or b""
                line, _, buf = buf.partition(b"\n")
                if line.decode(errors="replace").strip() == mark:
                    break
            self.samples[g][mark] = (h1, time.monotonic_ns())
            rtts.append(self.samples[g][mark][1] - h1)

    def heartbeat(self) -> None:
        """A marker in every guest's trace (``labctl-sync hb``): its stream shows how far it has come even
        when no packet passes there. Skipped while a clock round runs (its markers do the same)."""
        if not self.pipes_lock.acquire(blocking=False):
            return
        try:
            self._beat()
        finally:
            self.pipes_lock.release()

    def _beat(self) -> None:
        for g, pipe in self.sync_pipes.items():
            try:
                pipe.send(b"hb\n")
            except GuestError as exc:
                log.debug("%s: %s", g, exc.message)

    def clock(self, guest: str, markers: list[Event]) -> Clock:
        return Clock.from_samples(self.samples.get(guest, {}), markers)

    # ------------------------------------------------------------------ the lab

    def topology(self) -> Topology:
        """The followed guests' NICs, their networks and labctl's impairments in force now."""
        topo = Topology(guests=tuple(self.guests))
        for g, spec in (self.state.resolved.get("guests") or {}).items():
            for n in spec.get("nics") or []:
                topo.nets[(str(g), str(n["name"]))] = str(n.get("network"))
        for g, spec in (self.state.resolved.get("guests") or {}).items():
            topo.ifaces.update({(str(g), k): v for k, v in iface_roles(spec).items()})
            topo.vlans.update({(str(g), k): v for k, v in vlan_ids(spec).items()})
        for key, values in load_netstate(self.state.path).impair.items():
            g, _, nic = key.partition(".")
            topo.impair[(g, nic)] = {str(k): str(v) for k, v in values.items() if v not in (None, "")}
        return topo

    def read_wire(self, look: bool = True) -> None:
        """The frames the captures hold so far, by identity (:class:`labctl.trace.journey.Wire`); ``look``
        False: nothing followed is in flight yet, so the frames are only kept, unparsed (:class:`Unlooked`)."""
        for nic, tail in self.tails.items():
            self.wire.seen.setdefault(nic, {})
            self._unlooked.add(nic, tail.read(), self.wall_minus_mono)
        if not look:
            self._unlooked.expire()
            return
        for nic, data, host_ns in self._unlooked.take():
            _frame(self.wire, nic, self.node, self.tunnels, data, host_ns)

    def ruleset(self, guest: str) -> str:
        """``nft -a list ruleset`` on the guest now ("" without nftables)."""
        try:
            return self.session(guest).run(pr.RULESET + "; true", timeout=30).stdout.decode(errors="replace")
        except GuestError:
            return ""

    # ------------------------------------------------------------------ reading, stopping

    def read(self, guest: str) -> tuple[str, int]:
        """The guest's recorded events as text (step mode), and how many the buffer had no room for."""
        out = self.session(guest).run(pr.read_command(self.tag), timeout=300).stdout.decode(errors="replace")
        text, _, tail = out.rpartition("labctl-lost ")
        try:
            return text, int(tail.split()[0])
        except (ValueError, IndexError):
            return out, 0

    def pipe(self, guest: str) -> Pipe:
        return self.session(guest).pipe(pr.pipe_command(self.tag))

    def stop(self) -> list[str]:
        """Everything off and removed (probes, instances, captures, channels); best effort, warnings back."""
        with self.pipes_lock:
            for pipe in self.sync_pipes.values():
                pipe.close()
            self.sync_pipes.clear()
        for cap in self.captures:
            try:
                self.warnings += stop_capture(self.state, self.backend, cap)
            except LabctlError as exc:
                self.warnings.append(f"{cap.label}: {exc.message}")
            discard_capture(self.state, cap)
        self.captures.clear()

        def remove(g: str) -> None:
            try:
                self.session(g).run(pr.remove_command(self.tag), timeout=60)
            except LabctlError as exc:
                self.warnings.append(f"{g}: labctl's follow probes could not be removed: {exc.message}")

        parallel([g for g in self.guests if g in self.probes], remove)
        self.probes.clear()
        return self.warnings

    def close(self) -> None:
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()


def iface_roles(guest: Mapping[str, Any]) -> dict[str, str]:
    """What each of a guest's lab interfaces is to another (its ``Guest.to_dict()``): a bridge's ports, a
    bond's members (and its mode), a VLAN on its parent (its ID: :func:`vlan_ids`)."""
    views = guest_interfaces(guest)
    kinds = {v.name: v for v in views}
    out = {}
    for v in views:
        if v.master:
            m = kinds.get(v.master)
            out[v.name] = (f"member of {v.master} ({m.detail.split(' bond of ')[0]})" if m and m.kind == "bond"
                           else f"port of {v.master}")
        elif v.kind == "vlan" and v.parent:
            out[v.name] = f"VLAN {v.detail.split()[1]} on {v.parent}"
    return out


def vlan_ids(guest: Mapping[str, Any]) -> dict[str, int]:
    """The VLAN ID of each of a guest's VLAN devices (its ``Guest.to_dict()``), by device name."""
    out = {}
    for v in guest_interfaces(guest):
        words = v.detail.split()  # "vlan 10 of eth1"
        if v.kind == "vlan" and len(words) > 1 and words[1].isdigit():
            out[v.name] = int(words[1])
    return out


def _between(text: str, begin: str, end: str) -> str:
    _a, _, rest = text.partition(begin + "\n")
    return rest.partition(end)[0] if rest else ""


def libpcap_error(text: str) -> str | None:
    """What libpcap says is wrong with the filter ``text`` (``tcpdump -d -- TEXT``), None when it compiles
    or tcpdump is not there to ask. A filter that starts with ``-`` never reaches tcpdump
    (:func:`labctl.pktfilter.refuse_options`); one with ``vlan`` goes there with its ``vlan`` first
    (:func:`pcap_text`)."""
    from labctl.proc import run

    try:
        refuse_options(text)
    except FilterError as exc:
        return str(exc)
    try:
        res = run(["tcpdump", "-d", "--", pcap_text(text)], timeout=20, check=False)
    except (ProcessError, LabctlError, OSError):
        return None
    if res.returncode == 0:
        return None
    lines = [ln for ln in res.stderr.decode(errors="replace").splitlines() if ln and not ln.startswith("Warning")]
    return lines[-1] if lines else f"tcpdump -d exited with status {res.returncode}"


def pcap_text(text: str) -> str:
    """The filter as libpcap should check it (``tcpdump -d``): a ``vlan [ID]`` that
    :func:`labctl.pktfilter.parse` takes moved to the front, ``vlan 10 and (EXPR)``, where pcap reads
    EXPR inside the tag as labctl does (pcap's ``EXPR and vlan 10`` would read EXPR before the tag:
    "rejects all packets" for ``icmp``); any other filter as it is."""
    try:
        vlan = vlan_of(parse(text))
    except FilterError:
        return text
    if vlan is None:
        return text
    toks = tokenize(text)
    i = next(k for k, t in enumerate(toks) if t.lower() == "vlan")
    j = i + 2 if vlan.id is not None else i + 1  # past the primitive
    while 0 < i and j < len(toks) and toks[i - 1] == "(" and toks[j] == ")":  # (vlan 10) and ...
        i, j = i - 1, j + 1
    if j < len(toks) and toks[j] in ("and", "&&"):
        j += 1
    elif i > 0 and toks[i - 1] in ("and", "&&"):
        i -= 1
    rest = " ".join(toks[:i] + toks[j:])
    return f"{vlan.describe()} and ({rest})" if rest else vlan.describe()
