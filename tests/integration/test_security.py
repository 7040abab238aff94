"""The threat model of a shared host, as real tests.

Who is the adversary, and what may they not do:

* **another local user** must reach no control channel of a lab: no QEMU
  listens on a TCP port that speaks the gdb protocol (which reaches QEMU's
  monitor), the gdbstub and QMP are unix sockets in 0700 directories;
* **a hostile guest** (every step command runs as root in it) must not
  write outside the bundle when its files are copied back, whatever names,
  links or tar stream it sends, nor more than 10 000 entries a step, nor stall the other guests' traffic by
  stopping, nor hang labctl by never finishing a command;
* **a careless or hostile command line or lab file** must not remove
  anything but a lab's run directory (``down ..``, ``down /x``), nor start
  anything it cannot finish, and its text is printed literally;
* **labctl itself being killed** (SIGKILL, OOM) at any point of ``up``
  leaves a lab that ``status`` calls incomplete and ``down`` removes whole.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labctl.backends.monitor import qmp_execute
from tests.conftest import ROOT, Cli
from tests.integration.conftest import pids_matching, qemu_pids_under, wait_for

QUICKSTART = ROOT / "labs" / "quickstart.yaml"  # a, b, c on one switched network


def _listening_tcp_ports(pid: int) -> set[int]:
    """TCP ports the process ``pid`` listens on (from its fds and /proc/net/tcp{,6})."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def _gdb_answers(port: int) -> bytes:
    """What a raw gdb remote-protocol client gets from 127.0.0.1:port (b'' for nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(3)
        s.sendall(b"+$qSupported#37")
        try:
            return s.recv(200)
        except (TimeoutError, ConnectionResetError):
            return b""


def _connect_as_nobody(path: Path) -> str:
    """Try to connect to the unix socket ``path`` as user nobody; the error's name, or 'connected'."""
    nobody = pwd.getpwnam("nobody")
    code = ("import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            "try:\n s.connect(sys.argv[1]); print('connected')\n"
            "except OSError as e: print(type(e).__name__)\n")
    res = subprocess.run(["python3", "-c", code, str(path)], capture_output=True, text=True, timeout=30,
                         user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], check=False)
    return res.stdout.strip()


def test_no_control_channel_for_others_and_no_guest_stalls_the_rest(cli: Cli, image: object,
                                                                   tmp_path: Path) -> None:
    up = cli("up", str(QUICKSTART), "--accel", "tcg", "--json")
    assert up.returncode == 0, up.stderr
    try:
        st = json.loads(up.stdout)
        guests = {g["name"]: g for g in st["guests"]}
        # 1. No QEMU TCP port speaks gdb; the only TCP listener is SSH's forward.
        for g in guests.values():
            ssh_port = int(g["ssh"].rsplit(":", 1)[1])
            assert _listening_tcp_ports(g["pid"]) == {ssh_port}, g["name"]
            assert _gdb_answers(ssh_port).startswith(b"SSH-2.0")  # sshd's banner, not a gdb packet
        # 2. The gdbstub and QMP are unix sockets in 0700 directories, closed to other users.
        lab_dir = cli.state_dir / "labs" / "quickstart"
        for name, g in guests.items():
            gdir = lab_dir / "guests" / name
            assert g["gdb"] == str(gdir / "gdb.sock")
            for d in (cli.state_dir / "labs", lab_dir, gdir):
                assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
            for sock in (gdir / "gdb.sock", gdir / "qmp.sock"):
                assert stat.S_ISSOCK(sock.stat().st_mode)
                assert _connect_as_nobody(sock) == "PermissionError", sock
        # 3. A paused guest (as under gdb) never stops the others' traffic on the switch.
        qmp_execute(lab_dir / "guests" / "b" / "qmp.sock", "stop")
        try:
            # Broadcasts fill b's socket queue first (b reads nothing while paused); then a pings c.
            blast = "ping -b -q -c 400 -i 0.01 -s 1400 -W 1 10.10.0.255 >/dev/null 2>&1"
            ping = cli("exec", "quickstart", "a", "--", f"{blast}; ping -c 3 -W 3 10.10.0.3", timeout=180)
            assert ping.returncode == 0, ping.stdout + ping.stderr
            assert " 0% packet loss" in ping.stdout
        finally:
            qmp_execute(lab_dir / "guests" / "b" / "qmp.sock", "cont")
        # 4. A command that closes its output and never ends cannot hold labctl past --timeout.
        hang = cli("exec", "--timeout", "5", "quickstart", "a", "--", "exec >/dev/null 2>&1; sleep 1000", timeout=120)
        assert hang.returncode != 0 and "no exit status after 5 s" in hang.stderr, hang.stderr
        assert "Traceback" not in hang.stderr
        # 5. Guest text is printed literally.
        lit = cli("exec", "quickstart", "a", "--", "echo '[/] [bold]x[/bold]'", timeout=60)
        assert lit.returncode == 0 and lit.stdout == "[/] [bold]x[/bold]\n", lit.stderr
        # 6. 'down' with anything but a lab name removes nothing (exit 2).
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        (scratch / "keep").write_text("mine")
        for arg in ("..", ".", str(scratch), "../labs", "/tmp", "quickstart/../.."):
            res = cli("down", arg)
            assert res.returncode == 2, (arg, res.stderr)
            assert "invalid lab name" in res.stderr and "Traceback" not in res.stderr
        assert (scratch / "keep").read_text() == "mine"
        assert Path("/tmp").is_dir()
        assert (lab_dir / "state.json").is_file()
        assert cli("status", "--json").returncode == 0
    finally:
        cli("down", "quickstart")
    wait_for(lambda: not qemu_pids_under(cli.state_dir), 30, "QEMU processes to go")


HOSTILE_TAR = r'''
import io, sys, tarfile
out = sys.stdout.buffer
with tarfile.open(fileobj=out, mode="w|") as t:
    def add(name, data=b"x", kind=tarfile.REGTYPE, link=""):
        i = tarfile.TarInfo(name); i.type = kind; i.linkname = link; i.size = len(data) if kind == tarfile.REGTYPE else 0
        t.addfile(i, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    add("ok.txt", b"honest file\n")
    add("SCRATCH/abs-owned")                        # absolute name
    add("../../../../../../../../SCRATCH/rel-owned")  # climbing out
    add("escape", kind=tarfile.SYMTYPE, link="SCRATCH")
    add("escape/through-link")                      # a write through the link just sent
    add("victim", kind=tarfile.SYMTYPE, link="SCRATCH/keep")
    add("victim", b"overwritten through a link\n")  # a file over the link's name
    add("hard", kind=tarfile.LNKTYPE, link="SCRATCH/keep")
    add("null", kind=tarfile.CHRTYPE)
    t.add(".")  # and the step's real files after the crafted ones
'''


def test_a_hostile_guest_cannot_write_outside_the_bundle(cli: Cli, image: object, tmp_path: Path) -> None:
    scratch = tmp_path / "host-scratch"
    scratch.mkdir()
    (scratch / "keep").write_text("mine\n")
    fake_tar = HOSTILE_TAR.replace("SCRATCH", str(scratch))
    plant = textwrap.dedent(f"""\
        ln -s {scratch} evil-dir; ln -s {scratch}/keep evil-file; mkfifo fifo; mknod null c 1 3
        mkdir ..x; touch "$(printf 'a\\nb')"; echo literal > '[bold]x'
        """)
    # The guest's 'tar' (first on root's PATH) is replaced by one that sends a crafted stream.
    install = ("mkdir -p /usr/local/bin && printf '%s' " + _sh_quote(f"#!/usr/bin/python3\n{fake_tar}")
               + " > /usr/local/bin/tar && chmod 755 /usr/local/bin/tar")
    (tmp_path / "lab[").mkdir()
    lab = tmp_path / "lab[" / "].yaml"  # the path reads '.../lab[/].yaml': rich markup, printed literally
    lab.write_text(textwrap.dedent(f"""\
        name: hostile
        networks: {{}}
        guests:
          h: {{}}
        steps:
          - name: plant
            run:
              - {{guest: h, command: {json.dumps(plant)}}}
          - name: many
            run:  # more entries than a step's copy-back takes
              - {{guest: h, command: "seq 10050 | xargs touch"}}
          - name: poison
            run:
              - {{guest: h, command: {json.dumps(install)}}}
              - {{guest: h, command: "echo '[/] not markup'; exit 3"}}
        """))
    out = tmp_path / "runs"
    res = cli("run", str(lab), "--accel", "tcg", "--out", str(out), timeout=900)
    assert res.returncode == 6, res.stderr  # the second step fails on purpose (exit 3)
    assert "Traceback" not in res.stderr, res.stderr
    assert "echo '[/] not markup'" in res.stderr  # the failed command, printed literally
    assert "exited with status 3" in res.stderr
    # The host is untouched.
    assert sorted(p.name for p in scratch.iterdir()) == ["keep"]
    assert (scratch / "keep").read_text() == "mine\n"
    (bundle,) = list(out.iterdir())
    for name in ("manifest.json", "summary.json", "report.md", "report.html"):
        assert (bundle / name).is_file(), name
    for path in bundle.rglob("*"):  # nothing but regular files and directories
        mode = os.lstat(path).st_mode
        assert stat.S_ISREG(mode) or stat.S_ISDIR(mode), path
    plant_dir = bundle / "steps" / "plant" / "_" / "h"
    assert (plant_dir / "[bold]x").read_text() == "literal\n"  # odd names inside the bundle are fine
    assert (plant_dir / "..x").is_dir()
    poison_dir = bundle / "steps" / "poison" / "_" / "h"
    assert (poison_dir / "ok.txt").read_text() == "honest file\n"
    assert (poison_dir / "victim").read_text() == "overwritten through a link\n"  # a plain file, no link
    summary = json.loads((bundle / "summary.json").read_text())
    warnings = "\n".join(w for s in summary["steps"] for w in s["warnings"])
    for bit in ("evil-dir: a symbolic link", "evil-file: a symbolic link", "fifo: a FIFO", "null: a device file",
                "a name outside the step directory", "hard: a hard link",
                "over the cap of 10000 entries; it and the rest were not copied"):
        assert bit in warnings, bit
    # the guest's files (seq's numbers; labctl's own files of the step, drops.json and the like, beside them)
    many = sum(name.isdigit() for _, dirs, files in os.walk(bundle / "steps" / "many" / "_" / "h") for name in dirs + files)
    assert 9_000 < many <= 10_000, many  # a step's copy-back: 10 000 entries at most
    assert "[/] not markup" in (poison_dir / "cmd-1.out").read_text()


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


@pytest.mark.parametrize("point", ["switch", "first-qemu", "booting"])
def test_sigkill_of_up_leaves_an_incomplete_lab_that_down_removes(cli: Cli, image: object, point: str) -> None:
    lab_dir = cli.state_dir / "labs" / "quickstart"
    proc = cli.popen("up", str(QUICKSTART), "--accel", "tcg")
    try:
        if point == "switch":
            wait_for(lambda: list((lab_dir / "net").glob("*switch.sock")) if (lab_dir / "net").is_dir() else [],
                     60, "the switch's socket")
        elif point == "first-qemu":
            wait_for(lambda: qemu_pids_under(cli.state_dir), 60, "a QEMU")
        else:
            wait_for(lambda: len(qemu_pids_under(cli.state_dir)) == 3, 60, "three QEMUs")
            wait_for(lambda: all((lab_dir / "guests" / g / "console.log").exists() for g in "abc"), 60, "consoles")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        status = cli("status", "--json")
        assert status.returncode == 0, status.stderr
        (entry,) = json.loads(status.stdout)["labs"]
        assert entry["state"] == "incomplete"
        plain = cli("status")
        assert "incomplete" in plain.stdout, plain.stdout
        again = cli("up", str(QUICKSTART), "--accel", "tcg")
        assert again.returncode == 5 and "incomplete" in again.stderr  # nothing is started over it
    finally:
        down = cli("down", "quickstart")  # also when an assertion above failed: never leave guests behind
    assert down.returncode == 0, down.stderr
    assert not lab_dir.exists()
    wait_for(lambda: not qemu_pids_under(cli.state_dir), 30, "QEMU processes to go")
    assert pids_matching(f"labctl.net.switch.*{cli.state_dir}") == []


def test_a_socket_path_too_long_is_refused_before_anything_starts(image: object, tmp_path: Path) -> None:
    state = tmp_path / ("s" * (100 - len(str(tmp_path))))
    env = dict(os.environ, LABCTL_STATE_DIR=str(state))
    env.pop("XDG_RUNTIME_DIR", None)
    res = subprocess.run([sys.executable, "-m", "labctl", "up", str(QUICKSTART),
                          "--accel", "tcg"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2, res.stderr
    assert "quickstart.yaml:" in res.stderr and "over the limit of 107" in res.stderr
    assert "Traceback" not in res.stderr
    assert not qemu_pids_under(state)
    assert not (state / "labs" / "quickstart").exists()
