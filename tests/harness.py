"""The test harness's bookkeeping: how a test starts labctl, takes down what it brought up,
and how the run checks at its end that it left nothing of its own behind.

Imported as ``tests.harness`` only (never through a conftest), so that the conftest
modules pytest loads and the ``tests.conftest`` the test modules import share one
registry.

* **Signals.** A process started in the background by a shell without job control
  inherits SIGINT and SIGQUIT as ignored (``nohup`` adds SIGHUP), and every child
  inherits that: a Ctrl-C a test sends would never arrive. :func:`popen` (which
  ``Cli`` uses) starts every child with the signals tests send at their default.
* **Teardown.** Every :class:`Tracked` state directory (each ``Cli``) is taken down
  after its test, whatever the outcome: ``labctl down`` for each of its labs, then
  every process that still names the directory is killed, the labs' network
  namespaces deleted and, for labs whose name carries this run's :data:`RUN_ID`,
  their libvirt domains, volumes and host directories removed.
* **Leftover check.** At the end of the run, :func:`leftovers` lists what the run made
  and left: processes that name one of its state directories or carry its
  :data:`RUN_ID` in their environment, run directories, the network namespaces of its
  state directories, and libvirt domains, volumes and run directories with its
  :data:`RUN_ID` in their name (libvirt tests name their labs with :func:`lab_name`);
  each with the test that made it. Nothing that was there when the run began, and
  nothing of another run or user that came up meanwhile, is looked at.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: Unique to this run of the suite (a nested pytest gets its own): libvirt tests put it in
#: their lab names, which are global on the host, so that a leftover of an earlier run never
#: meets a new one. Children get it as ``LABCTL_TEST_RUN`` (see :func:`begin`).
RUN_ID = secrets.token_hex(3)
RUN_ENV = "LABCTL_TEST_RUN"

#: The signals tests send to the processes they start (SIGKILL and SIGSTOP cannot be ignored).
SENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

LIBVIRT_URI = os.environ.get("LABCTL_LIBVIRT_URI") or "qemu:///system"
LIBVIRT_POOL = "labctl"
LIBVIRT_RUN_ROOT = Path("/var/lib/libvirt/labctl-run")
NETNS_DIR = Path("/run/netns")


def lab_name(base: str) -> str:
    """``base`` made unique to this run: for labs whose names are global on the host (libvirt)."""
    return f"{base}-{RUN_ID}"


# --------------------------------------------------------------------------- signals

def default_signals() -> None:
    """``preexec_fn``: the signals tests send at their default disposition in the child."""
    for sig in SENT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` for a process a test may signal: SIGINT, SIGTERM, SIGHUP and
    SIGQUIT at their default, whatever this process inherited."""
    return subprocess.Popen(argv, preexec_fn=default_signals, **kwargs)  # noqa: PLW1509 - resets the signals only


def run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` with :func:`popen`'s signals."""
    return subprocess.run(argv, preexec_fn=default_signals, **{"check": False, **kwargs})  # noqa: PLW1510


# --------------------------------------------------------------------------- what a test made

@dataclass
class Tracked:
    """A state directory a test gave labctl, and the lab names it used."""

    state_dir: Path
    test: str
    env: dict[str, str]
    labs: set[str] = field(default_factory=set)
    torn_down: bool = False

    def note_args(self, args: Sequence[str]) -> None:
        """Remember the lab names of the lab files in ``args`` (and the names given)."""
        for a in args:
            if a.endswith((".yaml", ".yml")):
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    path = Path(a) if Path(a).is_absolute() else ROOT / a
                    m = re.search(r"(?m)^name:\s*['\"]?([A-Za-z0-9_-]+)", path.read_text())
                    if m:
                        self.labs.add(m.group(1))

    def lab_names(self) -> set[str]:
        names = set(self.labs)
        root = self.state_dir / "labs"
        if root.is_dir():
            names.update(p.name for p in root.iterdir() if p.is_dir())
        return names


_TRACKED: list[Tracked] = []


def current_test() -> str:
    """The node id of the test running now (pytest's PYTEST_CURRENT_TEST), or ``?``."""
    return os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]


def track(state_dir: Path, env: dict[str, str], test: str | None = None) -> Tracked:
    t = Tracked(Path(state_dir), test or current_test(), env)
    _TRACKED.append(t)
    return t


def tracked() -> list[Tracked]:
    return list(_TRACKED)


# --------------------------------------------------------------------------- the host

def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _ours_and_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def processes() -> dict[int, str]:
    """Every other process's command line (not this one's nor its ancestors')."""
    skip = _ours_and_ancestors()
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) not in skip:
            cmd = _cmdline(int(p.name))
            if cmd:
                out[int(p.name)] = cmd
    return out


def describe(pid: int, cmd: str, where: Path | None = None) -> str:
    """``process PID (program, its lab process name) naming WHERE``: a leftover process, in a line."""
    argv = cmd.split()
    prog = Path(argv[0]).name if argv else "?"
    if len(argv) > 2 and argv[1] == "-m":
        prog += f" -m {argv[2]}"
    tag = re.search(r"(?:process|guest)=(labctl-[^,\s]+)", cmd)
    return (f"process {pid} ({prog}" + (f", {tag.group(1)}" if tag else "") + ")"
            + (f" naming {where}" if where else ""))


def _is_lab_process(cmd: str) -> bool:
    return "qemu-system" in cmd or "labctl" in cmd


def pids_naming(path: Path) -> list[int]:
    """Processes whose command line names a file in ``path`` (not a sibling that shares its prefix)."""
    needle = str(path).rstrip("/") + "/"
    return sorted(pid for pid, cmd in processes().items() if needle in cmd + "/")


def kill(pids: list[int], grace: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and _cmdline(p) for p in pids):
            time.sleep(0.1)


def _virsh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("virsh") is None:
        return None
    try:
        return subprocess.run(["virsh", "-c", LIBVIRT_URI, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None


def libvirt_domains() -> set[str]:
    res = _virsh("list", "--all", "--name", timeout=30)
    return {n for n in res.stdout.split() if n.startswith("labctl-")} if res and res.returncode == 0 else set()


def libvirt_volumes() -> set[str]:
    res = _virsh("vol-list", LIBVIRT_POOL, timeout=30)
    if res is None or res.returncode != 0:
        return set()
    return {line.split()[0] for line in res.stdout.splitlines()[2:] if line.strip()}


def libvirt_run_dirs() -> set[str]:
    try:
        return {p.name for p in LIBVIRT_RUN_ROOT.iterdir()}
    except OSError:
        return set()


def netns() -> set[str]:
    try:
        return {p.name for p in NETNS_DIR.iterdir() if p.name.startswith("labctl-")}
    except OSError:
        return set()


def _of_lab(name: str, lab: str) -> bool:
    """True for a libvirt domain, volume or run directory, or a namespace, of lab ``lab``."""
    return name.startswith((f"labctl-{lab}-", f"{lab}."))


# --------------------------------------------------------------------------- teardown

def _labctl(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                   timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def teardown(t: Tracked, say: Callable[[str], None] = lambda _: None) -> None:
    """Take down everything of ``t``: its labs, its processes, its namespaces, and the libvirt
    objects of its labs that carry this run's id. Never raises."""
    if t.torn_down:
        return
    t.torn_down = True
    from labctl.up.taps import netns_name

    names = t.lab_names()
    labs_root = t.state_dir / "labs"
    for name in sorted(p.name for p in labs_root.iterdir() if p.is_dir()) if labs_root.is_dir() else []:
        res = _labctl(t.env, "down", name, "--timeout", "5", timeout=300)
        if res is None or res.returncode != 0:
            say(f"teardown of {t.test}: labctl down {name} failed: "
                + ("timed out" if res is None else (res.stderr or res.stdout).strip()[-500:]))
        else:
            say(f"teardown of {t.test}: lab {name} was still up: taken down")
    pids = pids_naming(t.state_dir)
    if pids:
        say(f"teardown of {t.test}: killing {len(pids)} process(es) that name {t.state_dir}")
        kill(pids)
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            ns = netns_name(labs_root / name)
            if (NETNS_DIR / ns).exists():
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30, check=False)
    if labs_root.is_dir():
        shutil.rmtree(labs_root, ignore_errors=True)
    for name in names:
        if RUN_ID in name:  # global names: only ever this run's own
            remove_libvirt_lab(name)


def remove_libvirt_lab(lab: str) -> None:
    """Destroy and undefine lab ``lab``'s libvirt domains, delete its pool volumes and its
    directories below the host's labctl-run."""
    for dom in sorted(d for d in libvirt_domains() if _of_lab(d, lab)):
        _virsh("destroy", dom)
        _virsh("undefine", dom, "--nvram")
        _virsh("undefine", dom)
    for vol in sorted(v for v in libvirt_volumes() if _of_lab(v, lab)):
        _virsh("vol-delete", vol, "--pool", LIBVIRT_POOL)
    for d in sorted(d for d in libvirt_run_dirs() if _of_lab(d, lab)):
        shutil.rmtree(LIBVIRT_RUN_ROOT / d, ignore_errors=True)
    for pid, cmd in processes().items():
        if "qemu-system" in cmd and f"guest=labctl-{lab}-" in cmd:
            kill([pid])


# --------------------------------------------------------------------------- the run's end

@dataclass
class Baseline:
    """What was on the host when the run began: none of it is this run's."""

    pids: set[int]
    domains: set[str]
    volumes: set[str]
    run_dirs: set[str]
    netns: set[str]


def begin() -> Baseline:
    """Note what the host has before the run; give children this run's id."""
    os.environ[RUN_ENV] = RUN_ID
    return Baseline(set(processes()), libvirt_domains(), libvirt_volumes(), libvirt_run_dirs(), netns())


@dataclass
class Leftover:
    what: str
    test: str
    remove: Callable[[], None] = field(default=lambda: None, repr=False)


def _owner_by_name(name: str) -> str:
    """The test whose lab ``name`` (a domain, volume, directory or command line) belongs to: the
    longest lab name that matches, so that ``quickstart-<id>`` is not taken for ``quickstart``."""
    best, owner = "", "?"
    for t in _TRACKED:
        for lab in t.lab_names():
            if len(lab) > len(best) and (_of_lab(name, lab) or f"guest=labctl-{lab}-" in name):
                best, owner = lab, t.test
    return owner


def leftovers(base: Baseline) -> list[Leftover]:
    """Everything this run made that is still there, each with the test that made it."""
    found: list[Leftover] = []
    procs = processes()
    seen: set[int] = set()
    for t in _TRACKED:
        needle = str(t.state_dir).rstrip("/") + "/"
        for pid, cmd in procs.items():
            if needle in cmd + "/":
                seen.add(pid)
                found.append(Leftover(describe(pid, cmd, t.state_dir), t.test, _killer(pid)))
        runs = t.state_dir / "labs"
        if runs.is_dir():
            found += [Leftover(f"run directory {p}", t.test, _remover(t)) for p in sorted(runs.iterdir()) if p.is_dir()]
    for pid, cmd in procs.items():
        if pid in seen or pid in base.pids or not _is_lab_process(cmd):
            continue
        env = _environ(pid)
        if env.get(RUN_ENV) == RUN_ID:
            test = env.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            found.append(Leftover(describe(pid, cmd), test, _killer(pid)))
        elif "qemu-system" in cmd and "guest=labctl-" in cmd and RUN_ID in cmd:  # libvirt's QEMU of this run
            found.append(Leftover(describe(pid, cmd), _owner_by_name(cmd), _killer(pid)))
    # Host-wide names: only those new since the run began that are certainly this run's: libvirt
    # objects by this run's id in their name (the suite's libvirt labs carry it: lab_name), network
    # namespaces by the hash of one of its state directories. Never another run's or another
    # user's lab of the same name that came up meanwhile, nor the image's volumes (named by their
    # content), which stay for later runs.
    for kind, now, before in (("libvirt domain", libvirt_domains(), base.domains),
                              ("libvirt volume", libvirt_volumes(), base.volumes),
                              ("libvirt run directory", libvirt_run_dirs(), base.run_dirs),
                              ("network namespace", netns(), base.netns)):
        for name in sorted(now - before):
            if kind == "network namespace":
                owner = _netns_owner(name)
                if owner == "?":
                    continue
            elif RUN_ID in name:
                owner = _owner_by_name(name)
            else:
                continue
            where = LIBVIRT_RUN_ROOT / name if kind == "libvirt run directory" else name
            found.append(Leftover(f"{kind} {where}", owner, _GLOBAL_REMOVERS[kind](name)))
    return found


def _netns_owner(name: str) -> str:
    from labctl.up.taps import netns_name

    for t in _TRACKED:
        for lab in t.lab_names():
            with contextlib.suppress(OSError, ValueError):
                if netns_name(t.state_dir / "labs" / lab) == name:
                    return t.test
    return "?"


def _killer(pid: int) -> Callable[[], None]:
    return lambda: kill([pid])


def _remover(t: Tracked) -> Callable[[], None]:
    def remove() -> None:
        t.torn_down = False
        teardown(t)
    return remove


def _remove_domain(name: str) -> Callable[[], None]:
    return lambda: (_virsh("destroy", name), _virsh("undefine", name), None)[-1]


def _remove_volume(name: str) -> Callable[[], None]:
    return lambda: (_virsh("vol-delete", name, "--pool", LIBVIRT_POOL), None)[-1]


def _remove_run_dir(name: str) -> Callable[[], None]:
    return lambda: shutil.rmtree(LIBVIRT_RUN_ROOT / name, ignore_errors=True)


def _remove_netns(name: str) -> Callable[[], None]:
    return lambda: (subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30,
                                   check=False), None)[-1]


_GLOBAL_REMOVERS: dict[str, Callable[[str], Callable[[], None]]] = {
    "libvirt domain": _remove_domain, "libvirt volume": _remove_volume,
    "libvirt run directory": _remove_run_dir, "network namespace": _remove_netns}


def clean(found: list[Leftover]) -> None:
    """Remove what :func:`leftovers` found (labs first, then processes, then the rest), so that
    the next run starts clean. Never raises."""
    for lo in found:
        with contextlib.suppress(Exception):
            lo.remove()
