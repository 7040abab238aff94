"""Impairments as guest commands: netem on the NIC's egress, inside the guest.

Why the guest and not labctl's switch: netem is the kernel's own impairment
and works the same on every link labctl makes (direct unix-dgram links,
switched networks, UDP tunnels across libvirt hosts), both backends and
any NIC model, with the delay, loss and rate semantics users know from
``tc-netem(8)``. The switch only sits in networks of three or more guests
and would need its own timers in Python. The price: the guest's own CPU
runs the qdisc, and the NIC's qdisc is netem instead of the default (a
multiqueue NIC's ``mq`` root is replaced while an impairment is in force).

Pure: command lines from :class:`~labctl.lab.impair.Impairment` values,
every word shell-quoted.
"""

from __future__ import annotations

import shlex

from labctl.lab import Impairment


def netem_argv(nic: str, imp: Impairment) -> list[str]:
    """``tc qdisc replace dev NIC root netem ...`` for a non-empty impairment."""
    argv = ["tc", "qdisc", "replace", "dev", nic, "root", "netem"]
    if imp.limit is not None:
        argv += ["limit", str(imp.limit)]
    if imp.delay is not None:
        argv += ["delay", imp.delay, *([imp.jitter] if imp.jitter else [])]
    for key in ("loss", "duplicate", "corrupt", "reorder", "rate"):
        value = getattr(imp, key)
        if value is not None:
            argv += [key, value]
    return argv


def apply_command(nic: str, imp: Impairment | None) -> str:
    """A shell command that puts ``imp`` in force on ``nic`` (None or empty: the default qdisc again).

    Clearing is idempotent: a NIC without labctl's netem keeps its qdisc.
    """
    if imp is None or imp.empty:
        return (f"if tc qdisc show dev {shlex.quote(nic)} | grep -q '^qdisc netem [0-9a-f]*: root'; "
                f"then tc qdisc del dev {shlex.quote(nic)} root; fi")
    return shlex.join(netem_argv(nic, imp))
