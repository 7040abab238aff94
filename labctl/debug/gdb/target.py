"""gdb's view of one guest of a running lab: its stub, kernel, module symbols, source, and the init script."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.backends import BackendMonitor, LabState, Monitor, get_backend
from labctl.debug.gdb.stub import GdbStub, target_remote
from labctl.debug.modsyms import add_symbol_file_commands, module_sections
from labctl.errors import DebugError
from labctl.kernel import Kernel
from labctl.lab import SshHop

# -- labs: finding a guest's gdbstub and symbols, the interactive init script --------

@dataclass(frozen=True)
class GdbTarget:
    """Everything gdb needs about one guest of a running lab."""

    lab: str
    guest: str
    socket: str  # the gdbstub's unix socket, on the machine that runs the guest
    vmlinux: Path
    kernel: Kernel  # the prepared kernel the guest runs: symbols, module debug files, source
    monitor: Monitor
    run_dir: Path
    via: SshHop | None = None  # the libvirt host the gdbstub's socket is on

    @property
    def stub(self) -> GdbStub:
        return GdbStub(self.socket, self.via)

    @property
    def debug_modules(self) -> Path:
        return self.kernel.debug_modules

    @property
    def manifest(self) -> dict[str, Any]:
        return self.kernel.manifest

    @property
    def source_dir(self) -> Path | None:
        return find_source_dir(self.kernel.dir)


def gdb_target(state: LabState, guest: str) -> GdbTarget:
    """The gdb view of ``guest`` in a :class:`labctl.state.runstate.LabState`.

    :raise LabStateError: no such guest. :raise DebugError: no gdbstub or no debug kernel.
    """
    hop = state.endpoint(guest).via  # raises for an unknown guest
    rec = state.guests[guest]
    if not rec.gdb:
        raise DebugError(f"guest {guest} of lab {state.lab} has no gdbstub",
                         hint="it was started by an older labctl: labctl down, then up again")
    kernel = state.kernel(guest)
    vmlinux = kernel.vmlinux_debug
    if not vmlinux.is_file():
        raise DebugError(f"guest {guest}'s kernel {kernel.name} has no vmlinux with debug info ({vmlinux})",
                         hint="give the lab's kernel: its debug file (kernel: {image: ..., debug: VMLINUX})")
    return GdbTarget(state.lab, guest, rec.gdb, vmlinux, kernel,
                     BackendMonitor(get_backend(state.backend), rec), Path(rec.dir), hop)


def guest_module_commands(state: LabState, guest: str, debug_modules: Path) -> list[str]:
    """``add-symbol-file`` commands for the modules loaded in ``guest`` (one SSH command)."""
    from labctl.ssh import Session

    with Session(state.endpoint(guest)) as s:
        return add_symbol_file_commands(module_sections(s), debug_modules)


def find_source_dir(image_dir: Path) -> Path | None:
    """The kernel source tree under ``image_dir/source`` (the folder itself, or its
    only subfolder holding a ``Makefile``), or None."""
    src = image_dir / "source"
    if not src.is_dir():
        return None
    if (src / "Makefile").is_file():
        return src
    subs = [d for d in src.iterdir() if d.is_dir() and (d / "Makefile").is_file()]
    return subs[0] if len(subs) == 1 else src


_UPSTREAM = re.compile(r"^(\d+\.\d+(?:\.\d+)?)")


def build_paths(manifest: Mapping[str, Any]) -> list[str]:
    """The directories the Debian kernel's DWARF names files relative to.

    C files are ``drivers/...`` relative to the build directory
    (``debian/build/build_amd64_none_amd64``, absolute for some units);
    assembly files are absolute under ``/build/reproducible-path/linux-X.Y.Z``.
    Longest first, as gdb's substitute-path takes the first matching rule.
    """
    release = str(manifest.get("release") or (manifest.get("kernel") or {}).get("release", ""))
    version = str((manifest.get("debian") or {}).get("version") or (manifest.get("kernel") or {}).get("version", ""))
    featureset = "rt" if "-rt-" in release else "none"
    flavour = "cloud-amd64" if release.endswith("-cloud-amd64") else "amd64"
    build = f"debian/build/build_amd64_{featureset}_{flavour}"
    m = _UPSTREAM.match(version)
    paths = []
    if m:
        root = f"/build/reproducible-path/linux-{m.group(1)}"
        paths += [f"{root}/{build}", root]
    paths.append(build)
    return paths


def source_commands(source: Path | None, manifest: Mapping[str, Any]) -> list[str]:
    """``set substitute-path`` and ``directory`` commands mapping DWARF file names to ``source``."""
    if source is None:
        return []
    cmds = [f"set substitute-path {p} {source}" for p in build_paths(manifest)]
    cmds.append(f"directory {source}")
    return cmds


# gdb's 'kill' sends QEMU the 'k' packet, which ends the QEMU process (the
# guest dies). A hook that fails cancels the command; an error raised from a
# gdb.Command prints just its message.
NO_KILL_HOOK = [
    "python",
    "class LabctlRefuseKill(gdb.Command):",
    "    def __init__(self):",
    "        super().__init__('labctl-refuse-kill', gdb.COMMAND_RUNNING)",
    "    def invoke(self, arg, from_tty):",
    "        raise gdb.GdbError(\"labctl: 'kill' would terminate the guest's QEMU; \"",
    "                           \"'detach' or 'quit' leave the guest running\")",
    "LabctlRefuseKill()",
    "end",
    "define hook-kill",
    "labctl-refuse-kill",
    "end",
]


def init_script(local: str, module_cmds: Sequence[str], source_cmds: Sequence[str] = (),
                interactive: bool = True) -> str:
    """The gdb commands run before the prompt: settings, module symbols, source
    paths, then ``target remote`` to the stub's socket ``local`` on this machine
    (which pauses the guest)."""
    quiet = ["set logging file /dev/null", "set logging redirect on", "set logging enabled on",
             *module_cmds, "set logging enabled off", "set logging redirect off"] if module_cmds else []
    lines = ["# written by labctl gdb", "set pagination off", "set confirm off", "set print pretty on",
             *NO_KILL_HOOK, *source_cmds, *quiet, target_remote(local)]
    if interactive:
        lines += ["set pagination on", "set confirm on",
                  ("echo labctl: the guest is paused while gdb holds it; 'continue' resumes it, "
                   "'detach' or 'quit' leave it running.\\n")]
    return "\n".join(lines) + "\n"


def write_init_script(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path
