"""What only the environment decides about a lab, checked before ``up`` makes or starts anything:
every unix socket fits in ``sun_path``, and no link is an unencrypted tunnel unless the user
accepted that. Each problem names the lab file's line (pure functions of the lab and its plan).
"""

from __future__ import annotations

from pathlib import Path

from labctl.errors import Problem
from labctl.lab import Lab
from labctl.net import UDP, Segment

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


def socket_path_problems(lab: Lab, run_dir: Path, segments: dict[str, Segment]) -> list[Problem]:
    """Every guest's and network's unix socket that would not fit, at the guest's or network's line."""
    problems = []
    for g in lab.guests.values():
        gdir = run_dir / "guests" / g.name
        longest = max((gdir / n for n in ("qmp.sock", "gdb.sock", "gdb-fwd.sock")), key=lambda p: len(bytes(p)))
        if len(bytes(longest)) > MAX_SOCKET_PATH:
            problems.append(Problem(lab.source, g.line, f"guests.{g.name}", _too_long(longest)))
    for name, seg in segments.items():
        paths = [p for port in seg.ports for p in (port.local, port.remote) if isinstance(p, Path)]
        long = [p for p in [*paths, seg.switch_socket] if p is not None and len(bytes(p)) > MAX_SOCKET_PATH]
        if long:
            problems.append(Problem(lab.source, lab.networks[name].line, f"networks.{name}", _too_long(long[0])))
    return problems


def unencrypted_problems(lab: Lab, segments: dict[str, Segment], accepted: bool) -> list[Problem]:
    """Links across hosts are plain UDP: anyone who reaches the port can read and inject frames.
    Each such network (with its line), unless ``accepted`` (``--unencrypted-links``)."""
    if accepted:
        return []
    return [Problem(lab.source, lab.networks[n].line, f"networks.{n}",
                    f"network {n} would be a UDP tunnel between hosts: neither encrypted nor "
                    "authenticated, anyone who reaches its ports can read and inject frames; "
                    "pass --unencrypted-links to accept that")
            for n, seg in segments.items() if seg.mechanism == UDP]


def _too_long(path: Path) -> str:
    return (f"its unix socket {path} would be {len(bytes(path))} bytes long, over the limit of "
            f"{MAX_SOCKET_PATH}; use a shorter state directory ($LABCTL_STATE_DIR), lab or guest name")
