"""The drops every step records in every guest: ``skb:kfree_skb`` in an instance of labctl's own.

Cheap enough to be on by default: one event probe (:func:`labctl.follow.probes.drop_definition`), no
filter, in a tracefs instance recording for the step's span, then read; two SSH commands per guest and
step, the guests in parallel. The instance is made once per run (``kept``: a later step empties it and
records again, 0.1 s instead of 0.9 s under TCG) and removed at its end (:func:`remove`). Where a
kernel has no event probes the tracepoint itself is recorded (where as an address, no device or headers); where its debug info is missing, the probe
goes without the device and the headers. The ruleset (``nft -a list ruleset``) is listed at both
ends when the guest has nftables, so that a netfilter drop names its rule
(:func:`labctl.trace.drops.netfilter_note`).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import labctl.follow.probes as pr
from labctl.errors import LabctlError
from labctl.follow.follower import drop_reasons_of, offsets_of, stale_groups
from labctl.ssh import Session
from labctl.state import LabState

_SEQ = itertools.count(1)
_CAPS: dict[tuple[str, str, str], pr.Caps] = {}
BEGIN, END = "labctl-ruleset-begin", "labctl-ruleset-end"
_RULESET = f"command -v nft >/dev/null && {{ echo {BEGIN}; {pr.RULESET}; echo {END}; }}"  # between the markers


@dataclass
class Watch:
    """One guest's drop recording: its tag, how it records (``probe`` or ``tracepoint``), what it lacks,
    the ruleset when it started."""

    guest: str
    tag: str
    mode: str
    notes: list[str]
    ruleset: str = ""
    reasons: list[str] | None = None  # the kernel's drop reasons by number (None: 6.1's, as before)


def _caps(state: LabState, guest: str, session: Session) -> tuple[pr.Caps, list[str]]:
    """The guest's tracefs capabilities and the stale groups of a killed labctl there (asked once per
    lab, guest and kernel in this process: a later step finds what this one left)."""
    key = (str(state.path), guest, state.kernels.get(guest, ""))
    if key in _CAPS:
        return _CAPS[key], []
    caps = pr.Caps.parse(session.run(pr.caps_command(), timeout=60).stdout.decode(errors="replace"))
    _CAPS[key] = caps
    return caps, stale_groups(caps)


def start(state: LabState, guest: str, session: Session, kept: Watch | None = None) -> Watch | None:
    """Start recording ``guest``'s drops; None when its kernel has no tracefs (nothing to record with).
    ``kept``: this run's watch of the guest from an earlier step, emptied and reused while its instance
    is there.

    :raise GuestError: when the guest cannot be reached.
    """
    if kept is not None and kept.mode:
        out = session.run(f"{pr.resume_command(kept.tag)}; {_RULESET}", timeout=60).stdout.decode(errors="replace")
        if "labctl-ok resume" in out:
            kept.ruleset = _between(out)
            return kept
    caps, stale_tags = _caps(state, guest, session)
    if not caps.tracefs:
        return None
    tag = f"d{os.getpid()}x{next(_SEQ)}"
    notes: list[str] = []
    stale = "; ".join(pr.remove_command(t) for t in stale_tags)
    if caps.eprobes:
        try:
            off: dict[str, int] | None = offsets_of(state, guest)
        except LabctlError as exc:
            off = None
            notes.append(f"no device or headers: {exc.message}")
        reasons: list[str] | None = None
        if not caps.reason:
            notes.append("no drop reasons (a kernel before 6.0)")
        else:
            try:
                reasons = drop_reasons_of(state, guest)
            except LabctlError as exc:
                notes.append(f"drop reasons by number only: {exc.message}")
        definition = pr.drop_definition(pr.PREFIX + tag, off, caps.reason, caps.symbol)
        cmd = pr.setup_command(tag, [definition], {}, pr.DROPS_BUFFER_KB, (_RULESET,))
        mode = "probe"
    else:
        notes.append("the kernel has no event probes (Linux 5.15+): locations as addresses, no device or headers")
        cmd = pr.tracepoint_setup_command(tag, pr.DROPS_BUFFER_KB, (_RULESET,))
        mode, reasons = "tracepoint", None  # the tracepoint prints each reason's name
    out = session.run((stale + "; " if stale else "") + cmd, timeout=120).stdout.decode(errors="replace")
    enabled, refused = pr.results(out)
    watch = Watch(guest, tag, mode, notes, _between(out), reasons)
    if not enabled:
        notes.append(f"the kernel refused the drop probe ({', '.join(refused)})")
        session.run(pr.remove_command(tag), timeout=60)
        watch.mode = ""
    return watch


def finish(watch: Watch, session: Session) -> tuple[str, int, str]:
    """Stop and read (the instance stays for the next step: see :func:`remove`): the recorded text, the
    events it had no room for, the ruleset now.

    :raise GuestError: when the guest cannot be reached.
    """
    if not watch.mode:
        return "", 0, ""
    cmd = f"{pr.read_command(watch.tag)}; {_RULESET}"
    out = session.run(cmd, timeout=300).stdout.decode(errors="replace")
    ruleset = _between(out)
    body = out.partition(BEGIN)[0]
    text, _, tail = body.rpartition("labctl-lost ")
    try:
        lost = int(tail.split()[0])
    except (ValueError, IndexError):
        text, lost = body, 0
    return text, lost, ruleset


def remove(watch: Watch, session: Session) -> None:
    """Remove a kept watch's instance and probe from the guest.

    :raise GuestError: when the guest cannot be reached.
    """
    session.run(pr.remove_command(watch.tag), timeout=60)


def _between(text: str) -> str:
    _, found, rest = text.partition(BEGIN + "\n")
    return rest.partition(END)[0] if found else ""
