"""The one way labctl runs and stops host processes.

Every child gets an argv list (never a shell string), a timeout, and its own
process group; on timeout or Ctrl-C the whole group gets SIGTERM, a short
grace period, then SIGKILL. Kinds of children:

* :func:`run` / :func:`run_pipeline`: to completion, with a timeout;
* :func:`run_lines`: to completion, its output line by line as it comes (a build's progress);
* :func:`spawn`: long-lived (QEMU, the L2 switch, relays), output to a log,
  owned by whoever started it;
* :func:`spawn_tied`: a helper that must never outlive labctl (dies with it);
* :func:`start_piped`: a long-lived child labctl talks to over pipes (gdb/MI, addr2line);
* :func:`foreground`: an interactive program on the user's terminal (gdb);
* :func:`replace_with`: an interactive program in labctl's place (``labctl ssh``).

Stopping: :func:`kill_group` for a child this process started,
:func:`stop_pid` for one known only by pid (and a marker in its command
line, against pid reuse), :func:`kill_pids` for several. Nothing else in
labctl imports ``subprocess``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

from labctl.errors import HostError, ProcessError

log = logging.getLogger(__name__)

GRACE_SECONDS = 2.0


def kill_group(proc: subprocess.Popen[Any], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM the child's process group, wait ``grace`` s, then SIGKILL it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def interrupt_group(proc: subprocess.Popen[bytes], wait: float) -> int | None:
    """SIGINT the child's process group (perf then writes its file out) and wait up to
    ``wait`` s for it to exit; SIGTERM/SIGKILL it (:func:`kill_group`) if it does not.
    Returns its exit status, None when it had to be killed."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        return proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return None


def _popen(argv: Sequence[str | os.PathLike[str]], **kw: object) -> subprocess.Popen[bytes]:
    args = [os.fspath(a) for a in argv]
    log.debug("run: %s", shlex.join(args))
    try:
        return subprocess.Popen(args, start_new_session=True, **kw)  # type: ignore[call-overload, no-any-return]
    except FileNotFoundError as exc:
        raise HostError(f"'{args[0]}' is not installed", hint="run the README's setup command") from exc


def run(
    argv: Sequence[str | os.PathLike[str]],
    timeout: float,
    *,
    input: bytes | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    capture: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` to completion within ``timeout`` seconds.

    :raise ProcessError: on timeout, or a non-zero exit when ``check``.
    :raise HostError: when the program does not exist.
    """
    pipe = subprocess.PIPE if capture else None
    proc = _popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                  stdout=pipe, stderr=pipe, cwd=cwd, env=env)
    with _stopped_on_error(proc, argv, timeout):
        out, err = proc.communicate(input=input, timeout=timeout)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out or b"", err or b"")
    if check and proc.returncode != 0:
        tail = (err or out or b"").decode(errors="replace").strip().splitlines()[-15:]
        raise ProcessError(
            f"{shlex.join(str(a) for a in argv)[:200]} exited with status {proc.returncode}",
            output="\n".join(tail),
        )
    return result


def _timed_out(argv: Sequence[str | os.PathLike[str]], timeout: float) -> ProcessError:
    return ProcessError(f"{Path(os.fspath(argv[0])).name} timed out after {timeout:.0f} s")


@contextlib.contextmanager
def _stopped_on_error(proc: subprocess.Popen[Any], argv: Sequence[str | os.PathLike[str]],
                      timeout: float) -> Iterator[None]:
    """``proc``'s group stopped (:func:`kill_group`) when the block raises anything (Ctrl-C too); a
    wait that timed out goes on as the ProcessError of a timeout."""
    try:
        yield
    except subprocess.TimeoutExpired as exc:
        kill_group(proc)
        raise _timed_out(argv, timeout) from exc
    except BaseException:
        kill_group(proc)
        raise


def run_lines(argv: Sequence[str | os.PathLike[str]], on_line: Callable[[str], None], timeout: float, *,
              cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
    """Run ``argv`` (a build: make and its compilers) in a session of its own, every line of its
    output and errors to ``on_line`` as it comes; its exit status. On a timeout or Ctrl-C the whole
    group is stopped (:func:`kill_group`) before the exception goes on.

    :raise ProcessError: on timeout. :raise HostError: when the program does not exist.
    """
    proc = _popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    try:
        with _stopped_on_error(proc, argv, timeout):
            for raw in proc.stdout:
                on_line(raw.decode(errors="replace").rstrip("\n"))
                if time.monotonic() > deadline:
                    raise _timed_out(argv, timeout)
            return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        proc.stdout.close()


def run_pipeline(argvs: Sequence[Sequence[str | os.PathLike[str]]], timeout: float,
                 *, cwd: Path | None = None, stdout: Any = None) -> None:
    """Run ``argv1 | argv2 | ...`` without a shell; every stage must succeed.

    :raise ProcessError: on timeout or when any stage fails.
    """
    procs: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        prev = None
        for i, argv in enumerate(argvs):
            last = i == len(argvs) - 1
            p = _popen(argv, stdin=prev.stdout if prev else subprocess.DEVNULL,
                       stdout=stdout if last else subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
            if prev and prev.stdout:
                prev.stdout.close()
            procs.append(p)
            prev = p
        for p, argv in zip(procs, argvs):
            left = max(0.1, deadline - time.monotonic())
            try:
                _, err = p.communicate(timeout=left)
            except subprocess.TimeoutExpired as exc:
                raise ProcessError(f"{argv[0]} timed out after {timeout:.0f} s") from exc
            if p.returncode != 0:
                raise ProcessError(f"{shlex.join(str(a) for a in argv)[:200]} exited with status {p.returncode}",
                                   output=(err or b"").decode(errors="replace")[-2000:])
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p)


def run_pipeline_output(argvs: Sequence[Sequence[str | os.PathLike[str]]], timeout: float) -> bytes:
    """``argv1 | argv2 | ...`` without a shell; the last stage's standard output.

    :raise ProcessError: on timeout or when any stage fails.
    """
    import tempfile

    with tempfile.TemporaryFile() as out:
        run_pipeline(argvs, timeout, stdout=out)
        out.seek(0)
        return out.read()


def spawn(argv: Sequence[str | os.PathLike[str]], log_path: Path,
          env: dict[str, str] | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start a long-lived child in its own session, output appended to ``log_path``;
    ``pass_fds`` stay open in it under the same numbers (tap queues for QEMU).

    The caller owns the child and must stop it (see :func:`kill_group`).
    """
    with open(log_path, "ab") as logf:
        return _popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                      pass_fds=tuple(pass_fds))


_PR_SET_PDEATHSIG = 1


def _tie_to(parent: int, cpu_seconds: int | None) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL when labctl dies (``PR_SET_PDEATHSIG``),
    even by SIGKILL or the OOM killer, and optionally a hard CPU-time limit."""
    import ctypes  # here, not in the child (an import after fork), nor for every command

    def tie() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # labctl died before the prctl took effect
            os._exit(1)
        if cpu_seconds is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    return tie


def spawn_tied(argv: Sequence[str | os.PathLike[str]], log_path: Path, *, cpu_seconds: int | None = None,
               stdout: int | None = None) -> subprocess.Popen[bytes]:
    """Start a helper that must never outlive labctl (a KVM probe, an SSH
    forward, a capture): in its own process group, killed by the kernel when
    this process dies, and with ``cpu_seconds`` as a hard CPU-time limit of its own.

    The parent-death signal follows the *thread* that started the child, so
    call this from a thread that lives as long as the helper should.
    Its output is appended to ``log_path`` (or stdout goes to ``stdout``).
    """
    with open(log_path, "ab") as logf:
        return _popen(argv, stdin=subprocess.DEVNULL, stdout=logf if stdout is None else stdout,
                      stderr=logf, preexec_fn=_tie_to(os.getpid(), cpu_seconds))


Process = subprocess.Popen
TimeoutExpired = subprocess.TimeoutExpired
PIPE, DEVNULL = subprocess.PIPE, subprocess.DEVNULL  # for start_child's streams


def start_piped(argv: Sequence[str | os.PathLike[str]]) -> subprocess.Popen[bytes]:
    """A long-lived child with stdin, stdout and stderr on pipes, in its own
    session (a Ctrl-C meant for labctl does not reach it). The caller owns it.

    :raise HostError: when the program does not exist.
    """
    return _popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def start_detached(argv: Sequence[str | os.PathLike[str]]) -> int:
    """A child left to run by itself, in its own session, its standard streams on /dev/null
    (``up``'s background login to a guest, :func:`labctl.mux.prewarm`); its pid. Nobody waits for it:
    it goes to the background itself, and init reaps what is left once labctl exits.

    :raise HostError: when the program does not exist.
    """
    return _popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid


def start_child(argv: Sequence[str | os.PathLike[str]], *, stdin: int | IO[bytes] | None = None,
                stdout: int | IO[bytes] | None = None, stderr: int | IO[bytes] | None = None
                ) -> subprocess.Popen[bytes]:
    """A child in labctl's own session (a Ctrl-C at the terminal reaches it too) with the given
    standard streams (None: labctl's own; ``subprocess.PIPE``, ``DEVNULL`` or a file): the
    client of a guest's kept connection (:mod:`labctl.mux`), whose input and output are the
    user's. The caller owns it and waits for it.

    :raise HostError: when the program does not exist.
    """
    args = [os.fspath(a) for a in argv]
    log.debug("start: %s", shlex.join(args))
    try:
        return subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=stderr)
    except FileNotFoundError as exc:
        raise HostError(f"'{args[0]}' is not installed", hint="run the README's setup command") from exc


def replace_with(argv: Sequence[str | os.PathLike[str]]) -> NoReturn:
    """Replace labctl by ``argv`` (``exec``): an interactive program that is the whole rest of the
    command, on this terminal, with labctl's pid and session.

    :raise HostError: when the program does not exist.
    """
    args = [os.fspath(a) for a in argv]
    log.debug("exec: %s", shlex.join(args))
    try:
        os.execvp(args[0], args)
    except FileNotFoundError as exc:
        raise HostError(f"'{args[0]}' is not installed", hint="run the README's setup command") from exc


def foreground(argv: Sequence[str | os.PathLike[str]]) -> int:
    """Run an interactive program on this terminal, in labctl's own session (so
    it gets the keyboard's Ctrl-C), and return its exit status.

    :raise HostError: when the program does not exist.
    """
    args = [os.fspath(a) for a in argv]
    log.debug("foreground: %s", shlex.join(args))
    try:
        return subprocess.run(args, check=False).returncode
    except FileNotFoundError as exc:
        raise HostError(f"'{args[0]}' is not installed", hint="run the README's setup command") from exc


def stop_pid(pid: int, marker: str | None = None, grace: float = GRACE_SECONDS) -> None:
    """Stop the process ``pid`` (its group when it leads one): SIGTERM, ``grace`` s, SIGKILL.

    With ``marker``, only when its command line still contains it (the pid may
    have been reused by another program since it was recorded): a marker that is
    an absolute path must be named whole (as :func:`pids_referencing` matches).
    Never another user's process (see :func:`_ours`).
    """
    if not pid or not pid_alive(pid):
        return
    args = pid_cmdline(pid)
    if not _ours(pid, args):
        return
    if marker is not None and not any(_names_path(a, marker) if marker.startswith("/") else marker in a
                                      for a in args):
        return
    kill_pids([pid], grace)


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state != b"Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def pid_cmdline(pid: int) -> list[str]:
    """The argv of a running process, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _names_path(arg: str, path: str) -> bool:
    """True when argv element ``arg`` names ``path`` or a file under it as a whole path: the
    element itself, or a value in a QEMU option list (``file,id=x,path=/P/console.log``)."""
    under = path + "/"
    tokens = {arg}
    for part in re.split(r"(?<!,),(?!,)", arg):  # QEMU doubles a comma inside a value
        part = part.replace(",,", ",")
        tokens.add(part)
        if "=" in part:
            tokens.add(part.split("=", 1)[1])
    return any(t == path or t.startswith(under) for t in tokens)


def process_uid(pid: int) -> int | None:
    """The effective uid of process ``pid`` (the owner of ``/proc/PID``), None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


SWITCH_MODULE = "labctl.net.switch"


def _ours(pid: int, args: list[str]) -> bool:
    """True when process ``pid`` (command line ``args``) is this user's to stop: it runs as this
    user, or this is root and it is a labctl switch that root started as the guests' QEMU user
    (its ``--user UID:GID`` names the uid it runs as)."""
    uid = process_uid(pid)
    if uid is None:
        return False
    me = os.geteuid()
    if uid == me:
        return True
    if me != 0 or SWITCH_MODULE not in args:
        return False
    return any(a == "--user" and i + 1 < len(args) and args[i + 1].split(":")[0] == str(uid)
               for i, a in enumerate(args))


def pids_referencing(path: Path) -> list[int]:
    """This user's processes (other than this one) whose command line names ``path`` or a file under it.

    A lab's QEMUs and switches all name files in its run directory, so this
    finds them even when labctl was killed before it could record their pids.
    Paths match whole (``/s/labs/foo`` is not ``/s/labs/foobar`` nor
    ``/x/s/labs/foo``), and another user's processes never count (but root's
    switches that run as the guests' QEMU user do: see :func:`_ours`).
    """
    prefix = str(path).rstrip("/") or "/"  # as labctl wrote it into the command lines
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        args = pid_cmdline(pid)
        if any(_names_path(a, prefix) for a in args) and _ours(pid, args):
            found.append(pid)
    return sorted(found)


def files_open_under(path: Path) -> bool:
    """True when a process (that this user may inspect) has a file under ``path`` open:
    a QEMU reading an image's root file system through a guest's overlay, say."""
    prefix = str(path.resolve()) + "/"
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path).startswith(prefix):
                        return True
                except OSError:
                    continue
    return False


def kill_pids(pids: Sequence[int], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM each process (its whole group when it leads one), wait ``grace`` s, then SIGKILL."""
    def signal_all(sig: signal.Signals) -> None:
        for pid in pids:
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        signal_all(sig)
        deadline = time.monotonic() + wait
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not any(pid_alive(p) for p in pids):
            return
