"""A class spread over two libvirt hosts: this machine's qemu:///system and a qemu+ssh:// host
(the same libvirtd through an sshd on 127.0.0.1, as in test_libvirt_hosts). Four students,
each instance whole on the host with the most memory left, the second on each host started from
the first's post-boot state (saved with throwaway keys), each with its own keys; their handouts reach each guest
with plain OpenSSH (through the host's sshd for the remote ones); one student's guest is
crashed and reset from the state libvirt saved once it was up (its disk and clock checked), and
everyone's checks run; a checkpoint of another is saved and restored on its host;
``class down`` leaves nothing on either host.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from labctl.image.store import Image
from labctl.state.runstate import LabState
from tests import harness
from tests.conftest import Cli
from tests.integration.conftest import pids_matching, wait_for
from tests.integration.test_libvirt_hosts import (  # noqa: F401 - fixtures
    NOTHING,
    RUN_ROOT,
    Sshd,
    _leftovers,
    libvirtd,
    sshd,
)

#: One worker for libvirt's tests: they share libvirtd's pool and its kernel volumes
#: (an up on one worker lost its kernel volume to the other worker's libvirt test once).
pytestmark = pytest.mark.xdist_group("libvirt")

CLASS = harness.lab_name("vclass")
STUDENTS = ["ann", "bea", "cid", "dan"]


def _lab(path: Path, remote_uri: str) -> Path:
    path.write_text(f"""\
name: {CLASS}
hosts:
  h1: {{uri: "qemu:///system"}}
  h2: {{uri: "{remote_uri}"}}
networks: {{}}
guests:
  a: {{memory: 256}}
checks:
  - name: done
    guest: a
    command: test -f /root/done
    hint: write /root/done
""")
    return path


def _ssh(handout: Path, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", str(handout / "ssh_config"), "a", "--", command], capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)


def _clock_off(handout: Path) -> float:
    """How far the guest's wall clock is from this host's, in seconds (one SSH round trip's slack)."""
    t0 = time.time()
    res = _ssh(handout, "date +%s.%N")
    assert res.returncode == 0, res
    return abs(float(res.stdout) - (t0 + time.time()) / 2)


def test_a_class_of_four_over_two_libvirt_hosts(cli: Cli, image: Image, sshd: Sshd, tmp_path: Path,  # noqa: F811
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    lab = _lab(tmp_path / "vclass.yaml", sshd.uri)
    roster = tmp_path / "roster.txt"
    roster.write_text("\n".join(STUDENTS) + "\n")
    out = tmp_path / "handouts"
    idents = [f"{CLASS}@{s}" for s in STUDENTS]
    assert all(_leftovers(i) == NOTHING for i in idents)
    up = cli("class", "up", str(lab), "--roster", str(roster), "--out", str(out), "--accel", "tcg",
             "--no-verify-host-keys", "--json", timeout=1200)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        saved_at = time.time()  # each guest's post-boot state was saved before class up returned
        rows = {r["student"]: r for r in json.loads(up.stdout)["students"]}
        # one libvirtd named twice: the first student goes where free memory read highest (the two reads
        # differ a little) and then the instances alternate, two on each host, each whole on one
        first = rows["ann"]["host"]
        other = {"h1": "h2", "h2": "h1"}[first]
        assert {s: rows[s]["host"] for s in STUDENTS} == {"ann": first, "bea": other, "cid": first, "dan": other}
        assert f"placed by free memory: {first} (" in " ".join(up.stderr.split())
        # the two students on the remote host (through its sshd): one is crashed and reset, one checkpointed
        crash, kept = [s for s in STUDENTS if rows[s]["host"] == "h2"]
        local = next(s for s in STUDENTS if rows[s]["host"] == "h1")
        ci, ki = STUDENTS.index(crash), STUDENTS.index(kept)
        monkeypatch.setenv("LABCTL_STATE_DIR", str(cli.state_dir))
        # each host's first instance (ann, bea) booted and saved the post-boot state, with throwaway keys,
        # that the next one there (cid, dan) started from: a copy whose libvirt header names it
        starts = {s: LabState.load(i).guests["a"].extra.get("started_from") for s, i in zip(STUDENTS, idents)}
        assert starts == {"ann": None, "bea": None, "cid": idents[0], "dan": idents[1]}, starts
        for ident in idents:  # each guest's post-boot state, saved by libvirt on its host
            extra = LabState.load(ident).guests["a"].extra
            assert (extra["saved"], extra["throwaway_state"]) == (["postboot"], "postboot"), ident
            saved = RUN_ROOT / f"labctl-{ident}-a.saved"  # root's, not QEMU's user's
            st = saved.stat()
            assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700), oct(st.st_mode)
            assert sorted(p.name for p in saved.iterdir()) == ["postboot.qcow2", "postboot.save"]
        states = json.loads(cli("status", "--json", check=True).stdout)["labs"]
        by_lab = {st["lab"]: st for st in states}
        for s, ident in zip(STUDENTS, idents):
            (g,) = by_lab[ident]["guests"]
            assert (g["host"], g["state"]) == (rows[s]["host"], "running"), by_lab[ident]
        status = json.loads(cli("class", "status", "--json", check=True).stdout)
        assert {r["student"]: (r["host"], r["state"]) for r in status["students"]} == \
            {s: (rows[s]["host"], "up") for s in STUDENTS}

        for s in STUDENTS:  # plain OpenSSH from the handout, through h2's sshd for the remote two
            res = _ssh(out / s, "hostname")
            assert res.returncode == 0 and res.stdout.strip() == "a", f"{s}: {res.stdout}{res.stderr}"
            # saved and restored, or started from a state saved before: each clock set to the host's
            assert _clock_off(out / s) < 2.5, s
        # every guest has its own host key (each handout pins its own and logs in above); a student's key, or the
        # shared state's throwaway one, opens no other student's guest
        pins = {(out / s / "known_hosts").read_text().split()[-1] for s in STUDENTS}
        assert len(pins) == 4, pins
        started = "cid" if rows["cid"]["host"] == "h1" else "dan"
        template = {"cid": "ann", "dan": "bea"}[started]
        port = LabState.load(idents[STUDENTS.index(started)]).guests["a"].ssh_port
        gdir = cli.state_dir / "labs" / idents[STUDENTS.index(started)] / "guests" / "a"
        for key in (out / template / "id_ed25519", gdir / "shared_client_key", out / started / "id_ed25519"):
            res = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes",
                                  "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                                  "-o", "BatchMode=yes", "-p", str(port), "root@127.0.0.1", "true"],
                                 capture_output=True, text=True, timeout=60, check=False)
            assert res.returncode == (0 if key.parent.name == started else 255), (key, res.stderr)
        proxied = (out / crash / "ssh_config").read_text()
        assert "ProxyCommand" in proxied and "ProxyCommand" not in (out / local / "ssh_config").read_text()

        fresh = cli("class", "check", "--json")
        assert fresh.returncode == 6, fresh.stdout + fresh.stderr
        assert json.loads(fresh.stdout)["done"] == 0
        for s in STUDENTS:
            assert _ssh(out / s, "touch /root/done && sync").returncode == 0

        # a marker in the last block of the crashed student's disk (past what the file system uses), written past the
        # guest's page cache: after the reset that block must hold what it held at class up again
        mark = "$(( $(cat /sys/block/vda/size) / 8 - 1 ))"
        read_mark = f"dd if=/dev/vda bs=4096 skip={mark} count=1 iflag=direct 2>/dev/null | head -c 12"
        assert _ssh(out / crash, read_mark).stdout != "LABCTL-MARK\n"
        wrote = _ssh(out / crash, f"yes LABCTL-MARK | head -c 4096 | dd of=/dev/vda bs=4096 seek={mark} count=1 "
                                  "oflag=direct conv=fsync 2>&1")
        assert wrote.returncode == 0, wrote
        assert _ssh(out / crash, read_mark).stdout == "LABCTL-MARK\n"
        # that guest (on h2) crashes; the class sees it, and a reset brings back her post-boot state
        cli("exec", idents[ci], "a", "--", "echo c > /proc/sysrq-trigger", timeout=60)
        wait_for(lambda: json.loads(cli("class", "status", "--json").stdout)["students"][ci]["state"] != "up",
                 120, "the crash to show")
        crashed = json.loads(cli("class", "status", "--json").stdout)["students"]
        assert [r["state"] for r in crashed] == ["crashed" if s == crash else "up" for s in STUDENTS], crashed
        reset = cli("class", "reset", crash, timeout=300)
        assert reset.returncode == 0, reset.stdout + reset.stderr
        assert f"{idents[ci]} a: reset in" in reset.stdout
        # back to the state of class up, in memory and on disk
        assert _ssh(out / crash, "test -f /root/done").returncode == 1
        block = _ssh(out / crash, read_mark)
        assert block.returncode == 0 and block.stdout != "LABCTL-MARK\n", block
        assert _ssh(out / crash, "uptime").returncode == 0
        # libvirt gave the guest back the clock it was saved with; the reset set it to the host's
        assert time.time() - saved_at > 10
        assert _clock_off(out / crash) < 3.0
        back = json.loads(cli("class", "status", "--json", check=True).stdout)["students"]
        assert [r["state"] for r in back] == ["up"] * 4, back
        prev = cli.state_dir / "labs" / idents[ci] / "guests" / "a" / "console.prev.log"
        assert b"sysrq" in prev.read_bytes().lower()  # the crash's console is kept beside the new one

        partly = cli("class", "check", "--json")
        assert partly.returncode == 6
        assert {r["student"]: r["passed"] for r in json.loads(partly.stdout)["students"]} == \
            {s: int(s != crash) for s in STUDENTS}
        assert _ssh(out / crash, "touch /root/done").returncode == 0
        done = cli("class", "check", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["done"] == 4

        # an instance that started from another's state is reset to it, with its own keys and the host's clock
        assert _ssh(out / started, "touch /root/later").returncode == 0
        cli("class", "reset", started, check=True, timeout=300)
        assert _ssh(out / started, "test -f /root/done || test -f /root/later").returncode == 1
        assert _clock_off(out / started) < 3.0
        assert _ssh(out / started, "touch /root/done").returncode == 0

        # a checkpoint of the other remote student's lab (on h2), saved and restored by libvirt there
        saved = cli("checkpoint", "save", idents[ki], "c1", check=True)
        assert "1 guests saved" in " ".join(saved.stdout.split()), saved.stdout
        assert _ssh(out / kept, "rm /root/done && touch /root/later && sync").returncode == 0
        time.sleep(5)  # so that a clock left at the checkpoint's would be seen
        cli("checkpoint", "restore", idents[ki], "c1", check=True)
        assert _ssh(out / kept, "test -f /root/done && ! test -e /root/later").returncode == 0
        assert _clock_off(out / kept) < 3.0
        assert b"labctl: restored checkpoint c1" in \
            (cli.state_dir / "labs" / idents[ki] / "guests" / "a" / "console.log").read_bytes()
        cli("checkpoint", "delete", idents[ki], "c1", check=True)
        assert LabState.load(idents[ki]).guests["a"].extra["saved"] == ["postboot"]
    finally:
        down = cli("class", "down", timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    for ident in idents:
        assert _leftovers(ident) == NOTHING, ident
        assert not (cli.state_dir / "labs" / ident).exists()
    assert pids_matching(f"labctl.backends.libvirt.relay.*{cli.state_dir}/") == []
