"""Attaching each NIC's XDP and tc programs (:mod:`labctl.lab.xdp`) once its guest answers SSH, after its
firewall and before its setup commands and its post-boot snapshot (so a warm start and ``reset``
from the snapshot have it attached): a built object is written to ``/run/labctl-xdp/NIC.o`` in the
guest and attached with ``ip link set dev NIC xdpdrv|xdpgeneric obj ... sec SECTION``; xdp-filter is
loaded with ``xdp-filter load -m native|skb -p POLICY NIC`` and given its rules. A reset that boots the
guest again attaches them again. A tc program goes on the NIC's clsact qdisc with ``tc filter replace
dev NIC ingress|egress ... bpf direct-action obj ... sec SECTION``. The guest's refusal (a verifier's log, an xdp-filter error) fails
``up`` at the program's lab line (exit 2).
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from labctl.endpoint import Endpoint
from labctl.errors import GuestError, LabFileError, Problem
from labctl.lab import Nic, Tc, Xdp, nic_tc, nic_xdp

DIR = "/run/labctl-xdp"
TIMEOUT = 120.0
MAX_MESSAGE = 1500


def object_path(nic: str) -> str:
    return f"{DIR}/{nic}.o"


def command(nic: str, x: Xdp) -> str:
    """The guest's shell command that attaches ``x`` to ``nic`` (anything of labctl's there first removed)."""
    q = shlex.quote(nic)
    if x.source is not None:
        obj = object_path(nic)
        flag = "xdpdrv" if x.mode == "native" else "xdpgeneric"
        return " && ".join([
            "umask 077", f"mkdir -p {DIR}",
            f"printf %s {base64.b64encode(x.object).decode()} | base64 -d > {shlex.quote(obj)}",
            f"{{ ip link set dev {q} xdp off 2>/dev/null; true; }}",
            f"ip link set dev {q} {flag} obj {shlex.quote(obj)} sec {shlex.quote(x.section)}"])
    mode = "native" if x.mode == "native" else "skb"
    parts = ["{ mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf; }",
             f"{{ xdp-filter unload {q} >/dev/null 2>&1; true; }}",
             f"xdp-filter load -m {mode} -p {x.policy} {q}"]
    parts += [f"xdp-filter port {p}" for p in x.ports]
    parts += [f"xdp-filter ip -m src {shlex.quote(ip)}" for ip in x.ips]
    return " && ".join(parts)


def tc_command(nic: str, t: Tc) -> str:
    """The guest's shell command that attaches ``t`` to ``nic``'s clsact qdisc (labctl's filter replaced)."""
    q, obj = shlex.quote(nic), shlex.quote(f"{DIR}/{nic}-tc.o")
    return " && ".join([
        "umask 077", f"mkdir -p {DIR}", f"printf %s {base64.b64encode(t.object).decode()} | base64 -d > {obj}",
        f"tc qdisc replace dev {q} clsact",
        (f"tc filter replace dev {q} {t.direction} pref 49152 handle 1 bpf direct-action obj {obj} "
         f"sec {shlex.quote(t.section)}")])


def attach(ep: Endpoint, nics: Sequence[Nic] | Sequence[Mapping[str, Any]], source: str,
           timeout: float = TIMEOUT) -> None:
    """Attach the XDP program of each of ``nics`` (the model's, or their ``to_dict()`` form) in the
    guest of ``ep``; nothing when none has one. ``source``: the lab file, for messages.

    :raise LabFileError: when the guest refuses a program (at its line). :raise GuestError: when it
        cannot be reached.
    """
    todo: list[tuple[str, Xdp | Tc]] = []
    for n in nics:
        if isinstance(n, Nic):
            todo += [(n.name, p) for p in (n.xdp, n.tc) if p is not None]
        else:
            todo += [(str(n.get("name")), p) for p in (nic_xdp(dict(n)), nic_tc(dict(n))) if p is not None]
    if not todo:
        return
    from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

    with Session(ep) as s:
        for name, x in todo:
            res = s.run(command(name, x) if isinstance(x, Xdp) else tc_command(name, x), timeout=timeout)
            if res.status == 0:
                continue
            out = (res.stderr + b"\n" + res.stdout).decode(errors="replace").strip()
            what = f"XDP {x.program} ({x.mode})" if isinstance(x, Xdp) else x.summary()
            message = f"guest {ep.guest}: {name}: the guest refused {what}: {out[-MAX_MESSAGE:]}"
            if x.line:
                raise LabFileError([Problem(source, x.line, x.path, message)])
            raise GuestError(message)
