"""Loading a guest's firewall (:mod:`labctl.lab.firewall`) once it answers SSH, before its setup
commands and its post-boot snapshot (so a warm start and ``reset`` from the snapshot have it):
the script, and the lab's nft file, written to ``/run/labctl-fw`` in the guest, checked whole with
``nft -c -f`` there, then loaded with ``nft -f`` (atomic: all of it or none). A reset that boots
the guest again (no snapshot) loads it again.

What nft refuses names its line: ``/run/labctl-fw/main.nft:5:5-9: Error: syntax error...`` becomes
``lab.yaml:12: guests.r.firewall.filter.input.rules[0]: guest r: nft refused rule '...': syntax
error...`` (exit 2), and a line of the nft file its own line in that file.
"""

from __future__ import annotations

import base64
import re

from labctl.endpoint import Endpoint
from labctl.errors import GuestError, LabFileError, Problem
from labctl.lab import Firewall, ScriptLine

DIR = "/run/labctl-fw"
MAIN, FILE = f"{DIR}/main.nft", f"{DIR}/lab-file.nft"
TIMEOUT = 120.0
_ERROR = re.compile(r"^(/run/labctl-fw/(?:main|lab-file)\.nft):(\d+):[\d-]+: Error: (.*)$")


def command(fw: Firewall) -> tuple[str, dict[int, ScriptLine]]:
    """The guest's shell command that writes, checks and loads ``fw``, and the script's line map."""
    script, lines = fw.script(FILE if fw.file is not None else None)

    def put(text: str, path: str) -> str:
        return f"printf %s {base64.b64encode(text.encode()).decode()} | base64 -d > {path}"

    parts = ["exec 2>&1", "umask 077", f"rm -rf {DIR}", f"mkdir -p {DIR}", put(script, MAIN)]
    if fw.file is not None:
        parts.append(put(fw.file.text, FILE))
    parts += [f"nft -c -f {MAIN}", f"nft -f {MAIN}"]
    return " && ".join(parts), lines


def problems(output: str, guest: str, fw: Firewall, lines: dict[int, ScriptLine], source: str) -> list[Problem]:
    """nft's errors in ``output`` as lab-file problems (empty: none it could place)."""
    out = []
    for m in (_ERROR.match(ln.strip()) for ln in output.splitlines()):
        if m is None:
            continue
        where, line, message = m.group(1), int(m.group(2)), m.group(3).strip()
        if where == FILE and fw.file is not None:
            out.append(Problem(fw.file.source or fw.file.name, line, fw.file.path,
                               f"guest {guest}: nft refused line {line} of {fw.file.name}: {message}"))
            continue
        ref = lines.get(line)
        if ref is not None:
            out.append(Problem(source, ref.line, ref.path, f"guest {guest}: nft refused {ref.what}: {message}"))
    return out


def load(ep: Endpoint, fw: Firewall | None, source: str, timeout: float = TIMEOUT) -> None:
    """Check and load ``fw`` in the guest of ``ep`` (nothing when None); ``source``: the lab file.

    :raise LabFileError: when nft refuses a rule (each at its line). :raise GuestError: when the
        guest fails otherwise (no nft, a lost connection).
    """
    if fw is None:
        return
    cmd, lines = command(fw)
    from labctl.ssh import Session  # paramiko: loaded when a guest is spoken to

    with Session(ep) as s:
        res = s.run(cmd, timeout=timeout)
        if res.status != 0 and not (res.stdout + res.stderr).strip():
            # Once in a CI run (a fresh machine, a cold boot) the command ended with status 1
            # and said nothing at all; the command is idempotent (nft -f is atomic), so it is
            # asked once more, and what it says the second time is what is reported.
            res = s.run(cmd, timeout=timeout)
    if res.status == 0:
        return
    output = (res.stderr + b"\n" + res.stdout).decode(errors="replace")
    found = problems(output, ep.guest, fw, lines, source)
    if found:
        raise LabFileError(found)
    raise GuestError(f"guest {ep.guest}: its firewall could not be loaded (status {res.status}): "
                     + output.strip()[-500:])
