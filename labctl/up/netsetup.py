"""A lab's networks as ``up`` makes them: the plan (:mod:`labctl.net.plan`) for the backend's socket
directory, labctl's L2 switch for each network of three or more guests (run as the guests' QEMUs'
user), and the lab's network namespace, bridges and taps for multi-queue links. Everything started
is recorded in the lab's state first, so that ``down`` finds it whatever happens next."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import labctl.up.taps as taps  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import Backend
from labctl.errors import MachineError
from labctl.lab import HostPlace, Lab
from labctl.net import SWITCH, TAP, Port, Segment, TapDev, plan_networks
from labctl.proc import spawn
from labctl.state import LabState, SwitchRecord
from labctl.up.console import console_tail
from labctl.up.teardown import stop_switches

SWITCH_START_TIMEOUT = 10.0


class LabNetworks:
    """The networks of one ``up`` (see the module docstring); ``close()`` takes back what was made
    when the ``up`` fails."""

    def __init__(self, lab: Lab, run_dir: Path, backend: Backend, hosts: dict[str, HostPlace] | None,
                 warn: Callable[[str], None]) -> None:
        self.lab, self.dir, self.backend, self.hosts, self.warn = lab, run_dir, backend, hosts, warn
        self.switches: list[SwitchRecord] = []
        self.netns: str | None = None  # the lab's network namespace, for tap networks
        self.tap_fds: list[int] = []  # labctl's copies of the taps' queues, closed once QEMU has them

    def make(self, state: LabState) -> dict[str, Segment]:
        """Every network's segment, its switch running and its taps open; recorded in ``state``."""
        net = self.backend.network_dir(self.dir, self.lab.ident, self.hosts)
        no_taps = taps.unavailable(self.backend)
        segments = plan_networks(self.lab, net.path, self.hosts, taps=no_taps is None)
        state.networks = {n: seg.to_dict(self.hosts) for n, seg in segments.items()}
        for seg in segments.values():
            if seg.mechanism == SWITCH:
                self._start_switch(seg, state, net.owner)
        segments = self._make_taps(segments, state)
        for g in self.lab.guests.values():
            for nic in g.nics:
                if nic.queues > 1 and segments[nic.network].mechanism != TAP:
                    self.warn(f"{g.name}.{nic.name}: queues={nic.queues} needs a multi-queue link (tap), "
                              f"which is not possible here ({no_taps or 'a UDP tunnel'}); the dgram link "
                              "gives the guest one queue pair")
        return segments

    def _make_taps(self, segments: dict[str, Segment], state: LabState) -> dict[str, Segment]:
        """The lab's namespace (recorded first), its bridges and taps; segments whose taps have descriptors."""
        tapped = {n: seg for n, seg in segments.items() if seg.mechanism == TAP}
        if not tapped:
            return segments
        self.netns = state.netns = taps.netns_name(self.dir)
        state.save()
        bridges = sorted({p.local.bridge for seg in tapped.values() for p in seg.ports if isinstance(p.local, TapDev)})
        taps.create_netns(self.netns, bridges)
        out = dict(segments)
        for name, seg in tapped.items():
            ports = []
            for p in seg.ports:
                assert isinstance(p.local, TapDev)
                dev = taps.open_tap(self.netns, p.local)
                self.tap_fds += dev.fds
                ports.append(Port(p.guest, p.nic, p.network, dev, None))
            out[name] = Segment(seg.network, seg.mechanism, tuple(ports), None)
        return out

    def _start_switch(self, seg: Segment, state: LabState, owner: tuple[int, int] | None = None) -> None:
        """Start the network's switch; with ``owner`` it runs as that user (the guests' QEMUs')."""
        assert seg.switch_socket is not None
        idx = seg.switch_socket.name.split("-")[0]
        log = self.dir / f"switch-{idx}.log"
        user = ["--user", f"{owner[0]}:{owner[1]}"] if owner else []
        # --lab names the run directory: a switch whose pid was never recorded (up killed) is still found by it
        proc = spawn([sys.executable, "-m", "labctl.net.switch", str(seg.switch_socket), *user, "--lab", str(self.dir)],
                     log)
        self.switches.append(SwitchRecord(seg.network, proc.pid, str(seg.switch_socket)))
        state.switches = self.switches
        state.save()
        deadline = time.monotonic() + SWITCH_START_TIMEOUT
        while not seg.switch_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise MachineError(f"the L2 switch for network {seg.network} did not start: "
                                   f"{console_tail(log, 3)}")
            time.sleep(0.02)

    def handed_over(self) -> None:
        """The guests' QEMUs hold the taps now: labctl's copies are closed."""
        taps.close(tuple(self.tap_fds))
        self.tap_fds = []

    def stop_switches(self) -> None:
        """Stop the switches (a failed ``up``)."""
        stop_switches(self.switches)

    def close(self) -> None:
        """Close the taps, remove the namespace (a failed ``up``, once its QEMUs are gone)."""
        taps.close(tuple(self.tap_fds))
        if self.netns:
            taps.delete_netns(self.netns)
