"""An idle guest costs nothing that labctl adds: its agent sleeps in a blocking read of the
virtio-serial port (QEMU's pipe chardev keeps the port connected) and wakes only when labctl
writes to it, both after a cold boot and in a guest restored from its post-boot snapshot."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Cli

LAB = """\
name: {name}
networks:
  lan: {{}}
guests:
  a:
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.63.0.1/24}}]
"""

# In the guest: the agent is the process blocked in the virtio port's read; print its
# voluntary context switches, then the same 3 s later (each wakeup is one).
PROBE = r"""
for p in /proc/[0-9]*; do
    [ "$(cat $p/wchan 2>/dev/null)" = port_fops_read ] && pid=${p#/proc/} && break
done
[ -n "$pid" ] || { echo "no process waits in port_fops_read"; ps -eo pid,wchan:24,cmd; exit 3; }
c() { sed -n 's/^voluntary_ctxt_switches:[[:space:]]*//p' /proc/$pid/status; }
a=$(c); sleep 3; b=$(c); echo "$pid $a $b"
"""


def _wakeups(cli: Cli, lab: str) -> int:
    res = cli("exec", lab, "a", "--", PROBE, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    _, before, after = res.stdout.split()
    return int(after) - int(before)


def test_the_idle_agent_never_wakes_cold_or_restored(cli: Cli, image: object, tmp_path: Path) -> None:
    name = "idleagent"
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB.format(name=name))
    cli("up", str(lab), "--accel", "tcg", "--cold", check=True)
    assert _wakeups(cli, name) == 0  # polling every 0.1 s would be about 30
    # the agent still answers: a reset restores the guest and hands it its keys through it
    reset = cli("reset", name, "--json", timeout=300)
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert _wakeups(cli, name) == 0
    cli("down", name, check=True)
