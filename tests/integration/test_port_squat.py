"""A guest's SSH port squatted while its QEMU restarts (security issue 19, item 7).

Another user binds 127.0.0.1:PORT the moment ``reset`` (then ``checkpoint restore``) lets it
go. The guest must not stay stopped: it comes back on a new port, the user is told, and the
lab's known_hosts, ``labctl ssh-config`` and the student's handout name the new port (plain
OpenSSH logs in with the handout).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.integration.conftest import qemu_pids_under

LAB = """\
name: squat
networks: {lan: {}}
guests:
  g:
    nics:
      - {name: eth1, model: virtio-net-pci, network: lan, ip: 10.65.0.1/24}
"""
# Binds 127.0.0.1:PORT as soon as it can (a tight loop), listens, says so, holds it until stdin closes.
# With SO_REUSEADDR, as a squatter would: when QEMU dies before the SSH client closed a connection to
# the port, the kernel keeps QEMU's end in TIME_WAIT for a minute, and a plain bind() is refused all
# that time (while QEMU's next listener, SO_REUSEADDR too, binds): CI's restore saw it.
SQUAT = """\
import socket, sys, time
port = int(sys.argv[1])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        break
    except OSError:
        s.close()
        time.sleep(0.0005)
else:
    sys.exit(1)
print("bound", flush=True)
sys.stdin.read()
"""
NOBODY = 65534


def _port(cli: Cli, lab: str) -> int:
    (data,) = json.loads(cli("status", lab, "--json", check=True).stdout)["labs"]
    (g,) = data["guests"]
    assert g["state"] == "running", g
    return int(g["ssh"].rsplit(":", 1)[1])


def _squat(port: int) -> subprocess.Popen[str]:
    """Another user (nobody, with the system's Python: labctl's may be under root's home) waiting
    to take ``port``; this user when the tests do not run as root."""
    system = Path("/usr/bin/python3")
    other = os.geteuid() == 0 and system.exists()
    return subprocess.Popen([str(system) if other else sys.executable, "-c", SQUAT, str(port)],
                            user=NOBODY if other else None, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)


def _moved(cli: Cli, lab: str, handout: Path, old: int, squatter: subprocess.Popen[str], stderr: str) -> int:
    """The checks once the guest's port ``old`` was squatted; its new port."""
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "bound"  # it holds ``old``
    new = _port(cli, lab)
    assert new != old
    said = re.sub(r"\s", "", stderr)  # the terminal's line breaks and indents taken out
    assert re.sub(r"\s", "", f"127.0.0.1:{old} was taken by another process") in said
    assert re.sub(r"\s", "", f"now listens on 127.0.0.1:{new}") in said
    assert "Traceback" not in stderr
    assert cli("exec", lab, "g", "--", "true").returncode == 0
    assert f"Port {new}" in cli("ssh-config", lab, check=True).stdout
    assert (cli.state_dir / "labs" / lab / "known_hosts").read_text().startswith(f"[127.0.0.1]:{new} ")
    config = (handout / "ssh_config").read_text()
    assert f"Port {new}" in config and f"Port {old}" not in config
    assert (handout / "known_hosts").read_text().startswith(f"[127.0.0.1]:{new} ")
    # What the student does: plain OpenSSH with the handout, strict host key checking.
    ssh = subprocess.run(["ssh", "-F", str(handout / "ssh_config"), "g", "--", "echo", "hello"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert ssh.returncode == 0 and ssh.stdout.strip() == "hello", ssh.stderr
    return new


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client missing")
def test_a_port_squatted_during_reset_and_restore_moves_the_guest(cli: Cli, image: object, tmp_path: Path) -> None:
    lab_file = tmp_path / "squat.yaml"
    lab_file.write_text(LAB)
    roster = tmp_path / "students.txt"
    roster.write_text("ann\n")
    out = tmp_path / "handouts"
    lab, handout = "squat@ann", out / "ann"
    up = cli("class", "up", str(lab_file), "--roster", str(roster), "--out", str(out), "--accel", "tcg")
    assert up.returncode == 0, up.stdout + up.stderr
    squatters: list[subprocess.Popen[str]] = []
    try:
        old = _port(cli, lab)
        squatters.append(_squat(old))
        reset = cli("reset", lab, "--json")
        assert reset.returncode == 0, reset.stderr
        (back,) = json.loads(reset.stdout)["guests"]
        assert back["guest"] == "g"
        new = _moved(cli, lab, handout, old, squatters[-1], reset.stderr)
        assert any(f"127.0.0.1:{new}" in w for w in json.loads(reset.stdout)["warnings"])

        # The same during a checkpoint restore.
        assert cli("checkpoint", "save", lab, "c1").returncode == 0
        squatters.append(_squat(new))
        restore = cli("checkpoint", "restore", lab, "c1")
        assert restore.returncode == 0, restore.stderr
        _moved(cli, lab, handout, new, squatters[-1], restore.stderr)
    finally:
        for s in squatters:
            s.kill()
            s.wait()
        down = cli("class", "down", "--lab", "squat")
        assert down.returncode == 0, down.stdout + down.stderr
        assert qemu_pids_under(cli.state_dir) == []
