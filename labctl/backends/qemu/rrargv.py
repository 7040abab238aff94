"""The QEMU argv of a recorded guest, and of its replay, as pure functions of its ordinary argv.

Recording (``recorded_argv``): ``-icount shift=auto,rr=record,rrfile=F`` on single-threaded TCG;
every ``-drive`` behind a ``blkreplay`` node (the device's ``drive=`` names the blkreplay node, so
disk completions are ordered by the recording); a ``filter-replay`` on every ``-netdev`` (the
management one too): the frames each NIC receives go into the recording; every ``virtio-net-pci``
sends on its timer (``tx=timer``), not from a bottom half the recording does not order.

Replaying (``replay_argv``): the same machine with ``rr=replay`` and the same devices in the same
order; what is outside the guest is not needed any more and must not be touched. Each netdev
keeps its kind (seen on QEMU 7.2: a replay whose netdevs were unconnected ``hubport`` ones, or
whose user netdev had no port forward, diverged from its recording and never booted) but nothing
of the recorded lab: a ``dgram`` one binds a socket in the replay's directory and sends to
another there that nobody binds, the user one forwards a fresh local port (``ssh_port``) that
nothing uses. Their frames are dropped: the guest receives the recording's. The guest agent's
FIFOs, the console, monitor, gdbstub, pidfile and fw_cfg files are paths in the replay's
directory. The recording's first instant is the machine's reset: the replay boots a fresh overlay
on the same image (``disk``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labctl.paths import InDir

RRFILE = "replay.bin"  # the recording, in the guest's directory (then in the bundle)


def _opt(value: object) -> str:
    return str(value).replace(",", ",,")


def _split(arg: str) -> list[str]:
    """A QEMU ``a,b=c,d=e`` option split on single commas (``,,`` is an escaped comma)."""
    return [p.replace("\0", ",") for p in arg.replace(",,", "\0").split(",")]


def _join(parts: list[str]) -> str:
    return ",".join(p.replace(",", ",,") for p in parts)


def _get(parts: list[str], key: str) -> str | None:
    return next((p.split("=", 1)[1] for p in parts if p.startswith(key + "=")), None)


def _with(parts: list[str], key: str, value: str) -> list[str]:
    return [f"{key}={value}" if p.startswith(key + "=") else p for p in parts]


def _pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    """``argv[1:]`` as (option, value) pairs (a flag's value None); argv[0] is the binary."""
    out: list[tuple[str, str | None]] = []
    i = 1
    while i < len(argv):
        a = argv[i]
        takes = a in _FLAGS_WITH_VALUE or (a.startswith("-") and i + 1 < len(argv)
                                          and not argv[i + 1].startswith("-") and a not in _BARE_FLAGS)
        out.append((a, argv[i + 1] if takes else None))
        i += 2 if takes else 1
    return out


_BARE_FLAGS = {"-nodefaults", "-no-user-config", "-no-reboot", "-S", "-no-shutdown"}
_FLAGS_WITH_VALUE = {"-append"}  # its value may start with "-"


def _flatten(argv0: str, pairs: list[tuple[str, str | None]]) -> list[str]:
    out = [argv0]
    for a, v in pairs:
        out += [a] if v is None else [a, v]
    return out


def recorded_argv(argv: list[str], rrfile: Path) -> list[str]:
    """``argv`` (labctl's QEMU argv of a one-vCPU TCG guest) recording into ``rrfile``."""
    pairs = _pairs(argv)
    out: list[tuple[str, str | None]] = []
    drives = 0
    for a, v in pairs:
        if a == "-accel" and v is not None and v.startswith("tcg"):
            out.append((a, "tcg,thread=single"))
            out.append(("-icount", f"shift=auto,rr=record,rrfile={_opt(rrfile)}"))
        elif a == "-drive" and v is not None:
            out += _blkreplay(_split(v), drives)
            drives += 1
        elif a == "-netdev" and v is not None:
            out.append((a, v))
            nid = _get(_split(v), "id")
            out.append(("-object", f"filter-replay,id=rr-{nid},netdev={nid}"))
        elif a == "-device" and v is not None and _split(v)[0] == "virtio-net-pci" and _get(_split(v), "tx") is None:
            # virtio-net sends from a bottom half by default, whose run is not ordered by the recording:
            # replays diverged where the guest sent (seen on QEMU 7.2); its timer mode is replayed exactly
            out.append((a, _join([*_split(v), "tx=timer"])))
        else:
            out.append((a, v))
    return _flatten(argv[0], out)


def _blkreplay(parts: list[str], n: int) -> list[tuple[str, str | None]]:
    """``-drive file=...,if=virtio,...`` as a backend drive, a blkreplay node on it and the device."""
    iface = _get(parts, "if") or "virtio"
    if iface != "virtio":
        raise ValueError(f"a recorded guest's disks are virtio ones (this drive is if={iface})")
    readonly = _get(parts, "readonly") == "on"
    direct = [p for p in parts if not p.startswith("if=")] + ["if=none", f"id=rr-disk{n}"]
    layered = f"driver=blkreplay,if=none,image=rr-disk{n},id=rr-blk{n}" + (",readonly=on" if readonly else "")
    return [("-drive", _join(direct)), ("-drive", layered), ("-device", f"virtio-blk-pci,drive=rr-blk{n}")]


@dataclass(frozen=True)
class ReplayFiles:
    """Where a replay's files are: its directory's recording, disk, console, sockets and fw_cfg files."""

    dir: Path
    rrfile: Path
    disk: Path
    fw_cfg: dict[str, Path]  # fw_cfg name -> the bundle's copy

    console = InDir("console.log")
    qmp = InDir("qmp.sock")
    gdb = InDir("gdb.sock")
    pidfile = InDir("qemu.pid")


def replay_argv(recorded: list[str], files: ReplayFiles, ssh_port: int, paused: bool = False) -> list[str]:
    """The replay of the recording ``recorded`` (a :func:`recorded_argv`) from ``files``, its user
    netdev forwarding ``ssh_port`` (unused); ``paused``: the machine waits for gdb (``-S``) before its
    first instruction.

    :raise ValueError: when ``recorded`` is no recording's argv.
    """
    pairs = _pairs(recorded)
    if not any(a == "-icount" and v is not None and "rr=record" in v for a, v in pairs):
        raise ValueError("not the argv of a recorded guest (no -icount rr=record)")
    out: list[tuple[str, str | None]] = []
    socks = 0
    edits: dict[str, Callable[[list[str]], list[str]]] = {
        "serial0": lambda p: [q for q in _with(p, "path", str(files.console)) if q != "append=on"],
        "gdb0": lambda p: _with(p, "path", str(files.gdb)),
    }
    for a, v in pairs:
        if v is None:
            out.append((a, v))
            continue
        parts = _split(v)
        if a == "-icount":
            v = _join(_with(parts, "rrfile", str(files.rrfile))).replace("rr=record", "rr=replay")
        elif a == "-netdev" and parts[0] == "user":
            v = _join([re.sub(r"tcp:127\.0\.0\.1:\d+-", f"tcp:127.0.0.1:{ssh_port}-", q) for q in parts])
        elif a == "-netdev" and parts[0] == "dgram":
            if _get(parts, "local.type") != "unix":
                raise ValueError("a recorded netdev is a dgram one on unix sockets")
            v = _join(_with(_with(parts, "local.path", str(files.dir / f"net{socks}.sock")),
                            "remote.path", str(files.dir / f"net{socks}-peer.sock")))
            socks += 1
        elif a == "-netdev":
            raise ValueError(f"a recorded netdev of kind {parts[0]} (labctl records user and dgram ones)")
        elif a == "-drive" and parts[0].startswith("file=") and _get(parts, "readonly") != "on":
            v = _join(_with(parts, "file", str(files.disk)))
        elif a == "-chardev" and parts[0] == "pipe":
            v = _join(_with(parts, "path", str(files.dir / "agent")))
        elif a == "-chardev" and (_get(parts, "id") or "") in edits:
            v = _join(edits[_get(parts, "id") or ""](parts))
        elif a == "-qmp":
            v = f"unix:{_opt(files.qmp)},server=on,wait=off"
        elif a == "-pidfile":
            v = str(files.pidfile)
        elif a == "-fw_cfg":
            name = _get(parts, "name") or ""
            if name not in files.fw_cfg:
                raise ValueError(f"the recording has no copy of its fw_cfg file {name}")
            v = _join(_with(parts, "file", str(files.fw_cfg[name])))
        elif a == "-name":
            v = re.sub(r"process=labctl-", "process=labctl-replay-", v)
        out.append((a, v))
    if paused:
        out.append(("-S", None))
    return _flatten(recorded[0], out)


def fw_cfg_files(argv: list[str]) -> dict[str, Path]:
    """The fw_cfg name -> host file of each ``-fw_cfg`` of ``argv``."""
    out = {}
    for a, v in _pairs(argv):
        if a == "-fw_cfg" and v is not None:
            parts = _split(v)
            name, file = _get(parts, "name"), _get(parts, "file")
            if name and file:
                out[name] = Path(file)
    return out


def read_only_files(argv: list[str]) -> list[Path]:
    """The host files the replay reads as they were: ``-kernel``, ``-initrd`` and read-only drives."""
    out = [Path(v) for a, v in _pairs(argv) if a in ("-kernel", "-initrd") and v is not None]
    for a, v in _pairs(argv):
        if a == "-drive" and v is not None:
            parts = _split(v)
            if _get(parts, "readonly") == "on" and _get(parts, "file"):
                out.append(Path(_get(parts, "file") or ""))
    return out
