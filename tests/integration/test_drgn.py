"""``labctl drgn`` and ``labctl dump`` on real guests and real kernels: one booted lab (Debian's
6.1 kernel and its -dbg) shared by every check that only reads it, and one on the test
kernel's tree.

drgn reads what the test has just set inside the guest (a sysctl, a NIC's MTU, a listening
socket's port) and sees it change, while the guest keeps running (its jiffies advance between
two reads of one drgn session, and QMP says running throughout); ``--pause`` stops it (jiffies
stand still) and always resumes it, Ctrl-C included; a vmcore of ``labctl dump`` holds the same
values for ``labctl drgn --core`` and opens in Debian's ``crash``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from labctl.backends.monitor import qmp_execute
from labctl.kernel.cached import Kernel
from tests import harness
from tests.conftest import ROOT, Cli, new_cli
from tests.integration.conftest import qemu_pids_under, require_libvirtd, wait_for

#: With the other files on the suite's kernel tree, on one worker: a test here boots the tree's kernel,
#: and on a new machine the other worker would sit waiting for its build (204 s here, ~10 min on CI).
pytestmark = pytest.mark.xdist_group("kernel-tree")

OVER_3_MIN = ("two kernels (Debian's with its 1 GB -dbg, and the test tree's) each booted once; a vmcore "
              "of 512 MiB written, compressed and read by drgn and crash; a guest crashing during check")
LAB = "drgnlab"
LAB_YAML = (f"name: {LAB}\nnetworks: {{lan: {{}}}}\nguests:\n"
            "  a: {memory: 512, nics: [{name: eth1, model: e1000, network: lan, ip: 10.88.0.1/24}]}\n"
            # graded from the kernel itself: eth1's MTU, and its root qdisc drops nothing
            "checks:\n"
            "  - {name: mtu, guest: a, drgn: \"netdev_get_by_name(prog['init_net'], 'eth1').mtu == 1400\"}\n"
            "  - {name: no-drops, guest: a, drgn: \"netdev_get_by_name(prog['init_net'], 'eth1').qdisc.qstats.drops"
            " == 0\"}\n"
            "  - {name: shell, guest: a, command: 'true'}\n")
PORT = 45678

# What the tests read through drgn, the same code live and on a vmcore: the NIC's MTU, a sysctl
# (net.core.somaxconn), the ports of the TCP sockets python3 processes listen on, and the e1000
# driver's private struct of the NIC (a type only e1000.ko's debug info has) pointing back at it, and
# the lab's out-of-tree module's parameter (buggy_nf.ko, built against the kernel: its debug info); and
# how a crash's summary shows a socket and a netdev pointer (labctl.inspect.summary.describe).
READ = """
import json
from drgn import cast
from drgn.helpers.linux.fs import for_each_file
from drgn.helpers.linux.net import netdev_get_by_name, netdev_priv
from drgn.helpers.linux.pid import for_each_task
from labctl.inspect.summary import describe

net = prog["init_net"]
dev = netdev_get_by_name(net, "eth1")
adapter = netdev_priv(dev, "struct e1000_adapter")
ports, socks = [], []
for task in for_each_task(prog):
    if task.comm.string_() != b"python3":
        continue
    for fd, f in for_each_file(task):
        if f.f_op == prog["socket_file_ops"].address_of_():
            sk = cast("struct socket *", f.private_data).sk
            ports.append(int(sk.__sk_common.skc_num))
            socks.append(describe(sk).split(" ", 1)[1])
try:
    trigger = int(prog["trigger_port"])
except KeyError:
    trigger = None
print(json.dumps({"mtu": int(dev.mtu), "somaxconn": int(net.core.sysctl_somaxconn), "trigger_port": trigger,
                   "ports": sorted(ports), "socks": socks, "dev": describe(dev).split(" ", 1)[1], "jiffies": int(prog["jiffies"]),
                   "e1000": adapter.netdev.value_() == dev.value_()}))
"""
LISTEN = (f"setsid python3 -c 'import socket,time; s=socket.socket(); s.bind((\"0.0.0.0\", {PORT})); "
          "s.listen(); time.sleep(3600)' </dev/null >/dev/null 2>&1 & echo $! >/run/listener.pid")
UNLISTEN = "kill $(cat /run/listener.pid)"


@pytest.fixture(scope="module")
def lab(image: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, dict[str, Any]]]:
    """The one-guest lab, up for the module's checks (they read it or set what they read); always taken down."""
    cli = new_cli(tmp_path_factory, "drg")
    assert cli.tracked is not None
    cli.tracked.test = f"test_drgn lab (first used by {harness.current_test()})"
    lab_file = tmp_path_factory.mktemp("drgnlab") / "lab.yaml"
    lab_file.write_text(LAB_YAML)
    try:
        up = cli("up", str(lab_file))
        assert up.returncode == 0, up.stderr
        state = json.loads((cli.state_dir / "labs" / LAB / "state.json").read_text())
        yield cli, state
    finally:
        harness.teardown(cli.tracked)


# e1000 resets itself on an MTU change: the carrier comes back with its watchdog, up to 2 s later
CARRIER = "for i in $(seq 100); do [ $(cat /sys/class/net/eth1/carrier) = 1 ] && break; sleep 0.1; done"


def guest_sh(cli: Cli, command: str) -> None:
    res = cli("exec", LAB, "a", "--", command, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def drgn(cli: Cli, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return cli("drgn", *args, timeout=timeout)


def read(cli: Cli, *args: str) -> dict[str, Any]:
    res = drgn(cli, *args, "-c", READ)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


class StatusWatch:
    """QMP query-status every 50 ms in a thread: what the guest's run state was meanwhile."""

    def __init__(self, qmp: str) -> None:
        self.qmp, self.seen, self._stop = qmp, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen.append(qmp_execute(self.qmp, "query-status")["status"])
            time.sleep(0.05)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def qmp_of(state: dict[str, Any]) -> str:
    return str(state["guests"]["a"]["qmp"])


def test_live_drgn_reads_what_the_guest_just_set_and_sees_it_change(lab: tuple[Cli, dict[str, Any]]) -> None:
    cli, state = lab
    guest_sh(cli, f"modprobe buggy_nf trigger_port=4321 && ip link set eth1 mtu 1234 && "
                  f"sysctl -qw net.core.somaxconn=1111 && ({LISTEN})")
    with StatusWatch(qmp_of(state)) as watch:
        first = read(cli, LAB, "a")
    assert (first["mtu"], first["somaxconn"], first["ports"], first["e1000"]) == (1234, 1111, [PORT], True)
    assert first["trigger_port"] == 4321
    assert watch.seen and set(watch.seen) == {"running"}  # never paused while drgn read

    guest_sh(cli, f"ip link set eth1 mtu 1300 && sysctl -qw net.core.somaxconn=2222 && {UNLISTEN}")
    then = read(cli, LAB, "a")
    assert (then["mtu"], then["somaxconn"], then["ports"]) == (1300, 2222, [])
    assert then["jiffies"] > first["jiffies"]


def test_the_guest_runs_while_drgn_reads_it(lab: tuple[Cli, dict[str, Any]]) -> None:
    """Two reads of jiffies one second apart in one session: they differ (the guest ran, and a
    live read is never served from a cache)."""
    cli, state = lab
    code = "import time; a = int(prog['jiffies']); time.sleep(1); print(int(prog['jiffies']) - a)"
    with StatusWatch(qmp_of(state)) as watch:
        res = drgn(cli, LAB, "a", "-c", code)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.split()[-1]) > 0
    assert set(watch.seen) == {"running"}


def test_the_shell_has_prog_on_the_running_kernel(lab: tuple[Cli, dict[str, Any]], release: str) -> None:
    """drgn's interactive shell (here on a pipe) with prog, drgn's helpers and labctl's header."""
    cli, _state = lab
    res = subprocess.run([sys.executable, "-m", "labctl", "drgn", LAB, "a"], cwd=ROOT, env=cli.env, text=True,
                         input="print(prog['init_uts_ns'].name.nodename.string_())\n"
                               "print(netdev_get_by_name(prog['init_net'], 'eth1').name.string_())\n",
                         capture_output=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert "b'a'" in res.stdout and "b'eth1'" in res.stdout, res.stdout + res.stderr
    both = res.stdout + res.stderr
    assert f"labctl: drgn on guest a of lab {LAB}, kernel {release}" in both
    assert "debug info: kernel and " in both


def test_a_script_gets_its_arguments_and_exits_with_its_status(lab: tuple[Cli, dict[str, Any]],
                                                               tmp_path: Path) -> None:
    cli, _state = lab
    script = tmp_path / "mtu.py"
    script.write_text("import sys\nfrom drgn.helpers.linux.net import netdev_get_by_name\n"
                      "dev = netdev_get_by_name(prog['init_net'], sys.argv[1])\n"
                      "print(sys.argv[1:], int(dev.mtu))\nsys.exit(int(dev.mtu) % 7)\n")
    guest_sh(cli, "ip link set eth1 mtu 1500")
    res = drgn(cli, LAB, "a", str(script), "eth1", "--pause")  # after SCRIPT, every word is the script's
    assert res.returncode == 1500 % 7, res.stderr
    assert res.stdout.strip() == "['eth1', '--pause'] 1500"
    assert "was paused" not in res.stderr


def test_where_vmcoreinfo_is_is_asked_once_per_qemu_and_checked(lab: tuple[Cli, dict[str, Any]]) -> None:
    """The guest says over SSH where its note is; later sessions of the same QEMU read it there. A
    kept location that holds no note (or is another QEMU's) is asked again, never trusted."""
    cli, state = lab
    kept = Path(state["guests"]["a"]["dir"]) / "vmcoreinfo.json"

    def source() -> str:
        res = drgn(cli, LAB, "a", "--json")
        assert res.returncode == 0, res.stderr
        return str(json.loads(res.stdout)["vmcoreinfo_from"])

    kept.unlink(missing_ok=True)
    assert source() == "ssh"
    assert kept.stat().st_mode & 0o777 == 0o600
    where = json.loads(kept.read_text())
    assert where["pid"] == state["guests"]["a"]["pid"]
    assert source() == "cache"
    kept.write_text(json.dumps({**where, "address": where["address"] + 4096}))  # no note there
    assert source() == "ssh" and json.loads(kept.read_text()) == where
    kept.write_text(json.dumps({**where, "pid": 1}))  # another process's
    assert source() == "ssh"


def test_pause_stops_the_guest_for_the_code_and_resumes_it(lab: tuple[Cli, dict[str, Any]]) -> None:
    cli, state = lab
    code = "import time; a = int(prog['jiffies']); time.sleep(1.5); print(int(prog['jiffies']) - a)"
    with StatusWatch(qmp_of(state)) as watch:
        res = drgn(cli, LAB, "a", "--pause", "-c", code)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.split()[-1]) == 0  # time stood still in the guest while paused
    assert "paused" in watch.seen and watch.seen[-1] == "running"
    assert "guest a was paused for" in res.stderr
    assert qmp_execute(qmp_of(state), "query-status")["status"] == "running"

    failing = drgn(cli, LAB, "a", "--pause", "-c", "import sys; sys.exit(5)")
    assert failing.returncode == 5  # the code's status, and the guest resumed after it
    assert qmp_execute(qmp_of(state), "query-status")["status"] == "running"


def test_ctrl_c_during_pause_resumes_the_guest(lab: tuple[Cli, dict[str, Any]]) -> None:
    cli, state = lab
    with cli.running("drgn", LAB, "a", "--pause", "-c", "import time; time.sleep(120)") as proc:
        wait_for(lambda: qmp_execute(qmp_of(state), "query-status")["status"] == "paused", 120, "the pause")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert qmp_execute(qmp_of(state), "query-status")["status"] == "running"


def test_dump_then_drgn_core_and_crash_read_the_same_kernel(lab: tuple[Cli, dict[str, Any]],
                                                            tmp_path: Path, release: str) -> None:
    cli, state = lab
    guest_sh(cli, f"modprobe buggy_nf trigger_port=4321 && ip link set eth1 mtu 1444 && {CARRIER} && "
                  f"sysctl -qw net.core.somaxconn=3333 && ({LISTEN})")
    live = read(cli, LAB, "a")
    core = tmp_path / "a.vmcore"
    res = cli("dump", LAB, "a", "-o", str(core), "--json", timeout=600)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["path"] == str(core) and info["size"] == core.stat().st_size and info["format"] == "kdump"
    assert info["release"] == release and len(info["build_id"]) == 40
    assert core.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.vmcore"]  # no temporary file left
    assert core.stat().st_size < 128 << 20  # compressed: a fraction of the guest's 512 MiB
    assert qmp_execute(qmp_of(state), "query-status")["status"] == "running"  # QEMU resumed it

    dumped = read(cli, "--core", str(core))
    assert (dumped["mtu"], dumped["somaxconn"], dumped["ports"], dumped["e1000"]) == (1444, 3333, [PORT], True)
    assert dumped["trigger_port"] == 4321
    assert dumped["jiffies"] >= live["jiffies"]
    # a crash summary's view of a socket (TCP, listening) and a netdev pointer
    assert dumped["socks"] == [f"(sock family=2 state=10 local_port={PORT} remote_port=0)"], dumped
    assert re.fullmatch(r"\(net_device eth1 mtu=1444 flags=0x1[0-9a-f]{3}\)", dumped["dev"]), dumped
    guest_sh(cli, f"ip link set eth1 mtu 1500 && {UNLISTEN}")
    assert read(cli, "--core", str(core))["mtu"] == 1444  # the vmcore keeps the instant it was taken
    _the_vmcore_elsewhere(cli, core, Kernel.at(state["kernels"]["a"]), tmp_path / "another-machine")

    summary = drgn(cli, "--core", str(core), "--summary", "--json", "--nic", "eth1")
    assert summary.returncode == 0, summary.stderr
    s = json.loads(summary.stdout)
    assert [n["name"] for n in s["netdevs"]] == ["eth1"] and s["netdevs"][0]["mtu"] == 1444
    assert s["netdevs"][0]["up"] and s["netdevs"][0]["carrier"]
    cpu0 = s["tasks"][0]
    assert not cpu0["crashed"] and cpu0["frames"] and cpu0["frames"][0]["source"]  # registers from the vmcore
    assert "e1000" in s["dmesg"]

    vmlinux = Kernel.at(state["kernels"]["a"]).vmlinux_debug
    out = subprocess.run(["crash", "-s", str(vmlinux), str(core)], input="sys\nnet\nquit\n", capture_output=True,
                         text=True, timeout=600, check=False)
    assert f"RELEASE: {release}" in out.stdout, out.stdout + out.stderr
    assert "NODENAME: a" in out.stdout
    assert any(line.split()[1:3] == ["eth1", "10.88.0.1"] for line in out.stdout.splitlines()
               if len(line.split()) >= 3), out.stdout


def _the_vmcore_elsewhere(cli: Cli, core: Path, kernel: Kernel, cache: Path) -> None:
    """On a machine that has the vmcore and the kernel's debug files but never prepared that kernel
    (an empty cache): without --vmlinux, exit 3 naming it; with --vmlinux and --modules, the same values."""
    def drgn_there(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "labctl", "drgn", "--core", str(core), *args], cwd=ROOT,
                              env={**cli.env, "LABCTL_CACHE_DIR": str(cache)}, capture_output=True, text=True,
                              timeout=300, check=False)

    lost = drgn_there("-c", "1")
    assert lost.returncode == 3 and "no kernel prepared on this machine" in lost.stderr, lost.stderr
    assert "--vmlinux" in lost.stderr and "Traceback" not in lost.stderr
    named = drgn_there("--vmlinux", str(kernel.vmlinux_debug), "--modules", str(kernel.debug_modules), "-c", READ)
    assert named.returncode == 0, named.stderr
    got = json.loads(named.stdout.strip().splitlines()[-1])
    assert (got["mtu"], got["somaxconn"], got["ports"], got["e1000"], got["trigger_port"]) == (1444, 3333, [PORT],
                                                                                                True, 4321)


def test_elf_dumps_open_too_and_unsafe_destinations_are_refused(lab: tuple[Cli, dict[str, Any]],
                                                                tmp_path: Path, release: str) -> None:
    cli, _state = lab
    elf = tmp_path / "a.elf"
    res = cli("dump", LAB, "a", "-o", str(elf), "--format", "elf", "--json", timeout=600)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["release"] == release
    assert elf.stat().st_size >= 512 << 20 and elf.stat().st_mode & 0o777 == 0o600
    assert read(cli, "--core", str(elf))["mtu"] > 0

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by anyone, not sticky: another user could swap the file
    bad = cli("dump", LAB, "a", "-o", str(shared / "x.vmcore"))
    assert bad.returncode == 3 and "writable by other users" in " ".join(bad.stderr.split()), bad.stderr
    assert list(shared.iterdir()) == []


def test_bad_input_is_a_clear_error(lab: tuple[Cli, dict[str, Any]], tmp_path: Path) -> None:
    cli, state = lab
    for args, status, says in (
            ((LAB, "nope", "-c", "1"), 5, "has no guest 'nope'"),
            (("nolab", "a", "-c", "1"), 5, "lab 'nolab' is not up"),
            (("--core", str(tmp_path / "missing.vmcore"), "-c", "1"), 2, "cannot open"),
            (("--core", os.devnull, "-c", "1"), 2, "cannot read"),
            ((LAB,), 2, "needs LAB GUEST")):
        res = drgn(cli, *args)
        assert (res.returncode, says in res.stderr) == (status, True), (args, res.stderr)
        assert "Traceback" not in res.stderr
    assert cli("dump", LAB, "nope").returncode == 5

    core = tmp_path / "a.vmcore"
    assert cli("dump", LAB, "a", "-o", str(core)).returncode == 0
    wrong = drgn(cli, "--core", str(core), "--vmlinux", "/bin/true", "-c", "1")  # not that kernel's vmlinux
    assert wrong.returncode == 2 and "is not the debug file of the kernel" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr
    # the user's own error is the user's traceback, exit 1, and nothing of labctl's
    mine = drgn(cli, LAB, "a", "-c", "prog['no_such_symbol_here']")
    assert mine.returncode == 1 and "could not find 'no_such_symbol_here'" in mine.stderr, mine.stderr
    assert 'File "<-c>", line 1' in mine.stderr and "labctl/" not in mine.stderr
    assert qmp_execute(qmp_of(state), "query-status")["status"] == "running"


def test_drgn_checks_pass_and_fail_as_the_kernels_state_changes(lab: tuple[Cli, dict[str, Any]],
                                                                 tmp_path: Path) -> None:
    """labctl check grades the lab's drgn checks from the running kernel: eth1's MTU, and the drops
    of its root qdisc (netem losing every frame drops them; a fresh qdisc drops nothing again)."""
    cli, _state = lab

    def checks() -> dict[str, dict[str, Any]]:
        res = cli("check", LAB, "--json", "--out", str(tmp_path), timeout=300)
        assert res.returncode in (0, 6), res.stderr
        got = json.loads(res.stdout)
        assert got["bundle"] is None  # no guest crashed meanwhile
        return {c["name"]: c for c in got["checks"]}

    guest_sh(cli, "ip link set eth1 mtu 1400")
    first = checks()
    assert {n: c["status"] for n, c in first.items()} == {"mtu": "pass", "no-drops": "pass", "shell": "pass"}
    guest_sh(cli, "ip link set eth1 mtu 1500 && tc qdisc add dev eth1 root netem loss 100% && "
                  "ip neigh replace 10.88.0.2 lladdr 02:00:00:00:00:02 dev eth1 nud permanent && "
                  "(ping -c 3 -i 0.2 -W 1 10.88.0.2 || true)")  # frames netem drops, no ARP first
    then = checks()
    assert (then["mtu"]["status"], then["no-drops"]["status"], then["shell"]["status"]) == ("fail", "fail", "pass")
    assert then["mtu"]["detail"] == "netdev_get_by_name(prog['init_net'], 'eth1').mtu is (unsigned int)1500"
    drops = re.fullmatch(r"netdev_get_by_name\(prog\['init_net'\], 'eth1'\)\.qdisc\.qstats\.drops is \(__u32\)(\d+)",
                         then["no-drops"]["detail"])
    assert drops and int(drops.group(1)) >= 1, then["no-drops"]
    guest_sh(cli, "tc qdisc del dev eth1 root && ip link set eth1 mtu 1400")
    assert {n: c["status"] for n, c in checks().items()} == {"mtu": "pass", "no-drops": "pass", "shell": "pass"}


def test_a_panicked_guests_vmcore_shows_the_crashing_frame_and_its_skb(lab: tuple[Cli, dict[str, Any]],
                                                                        tmp_path: Path) -> None:
    """buggy_nf's NULL dereference on the receive path of one UDP packet the test sends (5 bytes of
    data: 33 at the IP layer); QEMU pauses a panicked guest (-action panic=pause) rather than end,
    and nothing else stops it while no labctl watches (the lab idle). The vmcore's summary: the
    crashing task's stack, buggy_nf_count on top of the oops, the skb's fields in its callers.
    Last of the module's lab: down then quits the paused QEMU at once."""
    cli, state = lab
    guest_sh(cli, "modprobe buggy_nf trigger_port=4321 && "
                  "(setsid sh -c 'sleep 1; echo boom | nc -u -w1 127.0.0.1 4321' </dev/null >/dev/null 2>&1 &)")
    wait_for(lambda: qmp_execute(qmp_of(state), "query-status")["status"] == "guest-panicked", 120, "the panic")
    core = tmp_path / "crash.vmcore"
    assert cli("dump", LAB, "a", "-o", str(core), timeout=600).returncode == 0
    res = drgn(cli, "--core", str(core), "--summary", "--json")
    assert res.returncode == 0, res.stderr
    (task,) = json.loads(res.stdout)["tasks"]
    assert task["crashed"]
    frames = task["frames"]
    names = [f["function"] for f in frames]
    assert names[0] == "pvpanic_panic_notify" and "panic" in names  # a module without debug info: kallsyms
    count = names.index("buggy_nf_count")
    assert frames[count]["source"] == "guest/modules/buggy_nf/buggy_nf.c:45"  # st->packets++
    assert frames[count]["locals"]["st"] == "(struct port_stats *)0x0"
    assert frames[count]["locals"]["len"] == "(unsigned int)33"
    skbs = {v for f in frames[count:] for k, v in f["locals"].items() if k == "skb" and "skb len=" in v}
    assert skbs and all("(skb len=33 data_len=0 protocol=0x0800 dev=lo 127.0.0.1:" in v
                        and v.endswith(" > 127.0.0.1:4321 udp)") for v in skbs), skbs
    assert "BUG: kernel NULL pointer dereference" in json.loads(res.stdout)["dmesg"]
    text = drgn(cli, "--core", str(core), "--summary")
    assert text.returncode == 0 and "crashed task: pid " in text.stdout
    assert "buggy_nf_count at guest/modules/buggy_nf/buggy_nf.c:45" in text.stdout
    (status,) = json.loads(cli("status", LAB, "--json").stdout)["labs"]
    assert [g["state"] for g in status["guests"]] == ["crashed"]
    t0 = time.monotonic()
    assert cli("down", LAB, timeout=120).returncode == 0
    took = time.monotonic() - t0
    assert qemu_pids_under(cli.state_dir) == []
    print(f"down of a lab whose guest QEMU holds paused on its panic: {took:.1f} s")


@pytest.mark.timeout(3 * 3600)  # a fresh machine builds the tree first
def test_drgn_on_a_trees_kernel(cli: Cli, image: object, tree_kernel: Path, tmp_path: Path) -> None:
    """The same on the test kernel built from source: its vmlinux and .ko files are the debug info;
    and its lab's drgn check, then a guest crashing during labctl check (sysrq's crash, once the
    test asks for it): its vmcore in the check's bundle, crash opens it with the tree's vmlinux.
    TCG: this host's KVM cannot run the test kernel (an emulation failure at its first cmpxchg16b)."""
    lab_file = tmp_path / "tree.yaml"
    lab_file.write_text(f"name: drgntree\nkernel: {{tree: {tree_kernel}}}\nnetworks: {{lan: {{}}}}\n"
                        "guests:\n  a: {memory: 512, nics: [{name: eth1, model: e1000, network: lan, "
                        "ip: 10.89.0.1/24}]}\n"
                        "checks:\n  - {name: mtu, guest: a, drgn: \"netdev_get_by_name(prog['init_net'], 'eth1')"
                        ".mtu == 1321\"}\n"
                        "  - {name: boom, guest: a, command: 'test ! -e /run/boom || echo c > /proc/sysrq-trigger'}\n")
    up = cli("up", str(lab_file), "--accel", "tcg", timeout=1800)
    assert up.returncode == 0, up.stderr
    res = cli("exec", "drgntree", "a", "--", "ip link set eth1 mtu 1321", timeout=120)
    assert res.returncode == 0, res.stderr
    code = ("from drgn.helpers.linux.net import netdev_get_by_name\n"
            "print(int(netdev_get_by_name(prog['init_net'], 'eth1').mtu), "
            "prog['init_uts_ns'].name.release.string_().decode())")
    live = cli("drgn", "drgntree", "a", "--json", timeout=300)
    assert live.returncode == 0, live.stderr
    facts = json.loads(live.stdout)
    assert facts["release"].endswith("-labctl-test") and "e1000" in facts["debug_info"]["modules"]
    res = cli("drgn", "drgntree", "a", "-c", code, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1321", facts["release"]]
    core = tmp_path / "tree.vmcore"
    assert cli("dump", "drgntree", "a", "-o", str(core), timeout=600).returncode == 0
    res = cli("drgn", "--core", str(core), "-c", code, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1321", facts["release"]]
    _tree_checks_and_a_crash_during_them(cli, tmp_path)


def _tree_checks_and_a_crash_during_them(cli: Cli, tmp_path: Path) -> None:
    def check() -> dict[str, Any]:
        res = cli("check", "drgntree", "--json", "--out", str(tmp_path / "runs"), timeout=600)
        assert res.returncode in (0, 6), res.stderr
        return dict(json.loads(res.stdout))

    assert [c["status"] for c in check()["checks"]] == ["pass", "pass"]
    assert cli("exec", "drgntree", "a", "--", "ip link set eth1 mtu 1400", timeout=120).returncode == 0
    failed = check()["checks"][0]
    assert failed["status"] == "fail" and failed["detail"].endswith(".mtu is (unsigned int)1400")
    assert cli("exec", "drgntree", "a", "--", "ip link set eth1 mtu 1321 && touch /run/boom",
               timeout=120).returncode == 0
    crashed = check()
    bundle = Path(crashed["bundle"])
    assert [c["status"] for c in crashed["checks"]] == ["pass", "error"]
    assert "guest a crashed: Kernel panic - not syncing: sysrq triggered crash" in crashed["checks"][1]["detail"]
    (rec,) = json.loads((bundle / "summary.json").read_text())["vmcores"]
    assert (rec["cause"], rec["when"], rec["file"]) == ("panic", "labctl check", "guests/a/vmcore")
    core = bundle / "guests" / "a" / "vmcore"
    assert core.stat().st_mode & 0o777 == 0o600
    digest = json.loads((bundle / "guests" / "a" / "vmcore.json").read_text())
    frames = [f["function"] for f in digest["tasks"][0]["frames"]]
    assert "sysrq_handle_crash" in frames and "write_sysrq_trigger" in frames
    assert "Guest a panicked during labctl check" in (bundle / "report.md").read_text()
    (status,) = json.loads(cli("status", "drgntree", "--json").stdout)["labs"]
    assert [g["state"] for g in status["guests"]] == ["crashed"]
    vmlinux = Kernel.at(status["guests"][0]["kernel"]["dir"]).vmlinux_debug
    out = subprocess.run(["crash", "-s", str(vmlinux), str(core)], input="sys\nbt\nquit\n", capture_output=True,
                         text=True, timeout=600, check=False)
    assert "PANIC: \"Kernel panic - not syncing: sysrq triggered crash" in out.stdout, out.stdout + out.stderr
    assert "sysrq_handle_crash" in out.stdout
    assert cli("down", "drgntree", timeout=120).returncode == 0
    assert qemu_pids_under(cli.state_dir) == []


def test_libvirt_guests_are_read_live_and_refuse_dumps(cli: Cli, image: object, tmp_path: Path) -> None:
    """On this machine's libvirt (QEMU runs as libvirt's user): drgn reads the guest live (labctl runs
    as root here), a dump is refused with exit 3 and a hint, no traceback."""
    require_libvirtd()
    name = harness.lab_name("drgnlv")
    lab_file = tmp_path / "lv.yaml"
    lab_file.write_text(LAB_YAML.replace(f"name: {LAB}\n", f"name: {name}\n", 1))
    up = cli("up", str(lab_file), "--backend", "libvirt", "--accel", "tcg")
    assert up.returncode == 0, up.stdout + up.stderr
    assert cli("exec", name, "a", "--", "ip link set eth1 mtu 1277", timeout=120).returncode == 0
    res = drgn(cli, name, "a", "-c", READ)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["mtu"] == 1277
    dump = cli("dump", name, "a", "-o", str(tmp_path / "a.vmcore"))
    assert dump.returncode == 3 and "qemu backend only" in " ".join(dump.stderr.split()), dump.stderr
    assert "Traceback" not in dump.stderr and not (tmp_path / "a.vmcore").exists()
    assert cli("down", name).returncode == 0
