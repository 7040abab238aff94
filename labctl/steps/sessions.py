"""The guests of a lab that is up, as a step reaches them: one SSH session per guest, the tools each
has, whether its machine still runs, and why the lab broke when it did.

A guest whose kernel panicked is gone for a step even while QEMU holds it paused for its vmcore
(:mod:`labctl.inspect.crashwatch`): it is not alive, and no new command is sent to it (it would
wait for its whole timeout on a machine that never answers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from labctl import paths
from labctl.backends import Backend
from labctl.bundle import CONSOLE, OOPS_TXT, guest_dir
from labctl.debug import console_end, oops_titles, panicked
from labctl.errors import GuestError, LabctlError
from labctl.ssh import Session
from labctl.state import LabState

TOOLS = ("perf", "trace-cmd", "mpstat", "ethtool", "nstat", "ss", "netstat", "timeout", "bpftrace")


class Sessions:
    """SSH sessions to the guests of ``state`` (opened on first use, by ``connect``), and what the
    ``backend`` and the consoles say about the guests' machines."""

    def __init__(self, state: LabState, backend: Backend, connect: Callable[[str], Session] | None = None) -> None:
        self.state, self.backend = state, backend
        self.connect = connect or (lambda guest: Session(state.endpoint(guest)))
        self.open: dict[str, Session] = {}
        self._tools: dict[str, set[str]] = {}
        #: what a step kind keeps in the guests from one step to the next (the drops' instances), and
        #: what removes it when the run ends (before the sessions close; best effort)
        self.kept: dict[tuple[str, str], object] = {}
        self.at_close: list[Callable[[], None]] = []

    def ssh(self, guest: str) -> Session:
        """The guest's session. :raise GuestError: when its kernel panicked."""
        if self._panicked(guest):
            raise GuestError(self.dead_guests() or f"guest {guest} panicked")
        s = self.open.get(guest)
        if s is None:
            s = self.open[guest] = self.connect(guest)
        return s

    def sh(self, guest: str, command: str, timeout: float = 120) -> int:
        """Run a labctl-made command on ``guest``; its status."""
        return self.ssh(guest).run(command, timeout=timeout).status

    def close(self) -> None:
        for fn in self.at_close:
            try:
                fn()
            except LabctlError:
                pass
        self.at_close.clear()
        for s in self.open.values():
            s.close()
        self.open.clear()

    def alive(self, guest: str) -> bool:
        return self.backend.alive(self.state.guests[guest]) and not self._panicked(guest)

    def _panicked(self, guest: str) -> bool:
        return panicked(console_end(Path(self.state.guests[guest].console)))

    def dead_guests(self) -> str | None:
        """Why the lab is broken (a guest's machine is gone or its kernel panicked), or None."""
        dead = [g for g in self.state.guests if not self.alive(g) or self._panicked(g)]
        if not dead:
            return None
        try:
            titles = oops_titles(Path(self.state.guests[dead[0]].console).read_text(errors="replace"))
        except OSError:
            titles = []
        if titles:
            return f"guest {dead[0]} crashed: {titles[0]}; see {guest_dir(dead[0])}/{OOPS_TXT}"
        return f"guest {', '.join(dead)} stopped (its QEMU exited); see {guest_dir(dead[0])}/{CONSOLE}"

    def tools(self, guest: str) -> set[str]:
        """The tracing and statistics tools installed in ``guest`` (asked once)."""
        if guest not in self._tools:
            res = self.ssh(guest).run(f"for t in {' '.join(TOOLS)}; do "
                                      "command -v $t >/dev/null 2>&1 && echo $t; done", timeout=60)
            self._tools[guest] = set(res.stdout.decode().split())
        return self._tools[guest]

    def cache_dir(self, guest: str) -> Path | None:
        """Where facts of ``guest``'s kernel go when the kernel's directory is read-only (one per kernel)."""
        try:
            d = paths.cache_dir() / "struct-offsets" / self.state.kernel(guest).key
            d.mkdir(parents=True, exist_ok=True)
            return d
        except OSError:
            return None
