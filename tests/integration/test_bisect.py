"""``labctl bisect`` on a real kernel: histories of small commits to the e1000 driver of the tree
the suite builds (tests/integration/conftest.py ``tree_kernel``), each bisected by booting the
lab on each candidate's build.

The repository is made once per run from the built tree: a hard-linked copy (nothing here ever
writes a file of it in place: new contents are written to a new file and renamed, git checks
files out the same way, and labctl bisect builds in its own full copy, its worktree), with git
tracking the e1000 driver's sources and the top Makefile. Commit dates are fixed, so the commits
have the same names on every run. The bisections share one worktree and build cache (``--work``):
the first history's commits are built once, by the bisection with a check (interrupted and continued);
the flaky oracle's bisection between them only boots.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Cli, interrupt

OVER_3_MIN = ("three bisections of real kernel histories, each commit built and booted under TCG (the builds "
              "shared through one worktree and cache): one finds a commit by a check, interrupted and "
              "continued, one bisects a throughput figure and ends not confirmed, one a flaky oracle with "
              "--tries auto and a confirmation; a config bisection at one commit (each candidate built "
              "incrementally and booted); and two one-step bisections of one build, by a drgn expression "
              "and by a panic whose vmcore the run keeps")

#: Files on the suite's kernel tree share one worker: on a new machine its build is waited for once.
pytestmark = pytest.mark.xdist_group("kernel-tree")

E1000 = "drivers/net/ethernet/intel/e1000"
MAIN = f"{E1000}/e1000_main.c"
ANCHOR = "single qdisc implementation, we can look at this again.\n\t */\n"
GIT_ENV = {"GIT_AUTHOR_NAME": "labctl tests", "GIT_AUTHOR_EMAIL": "tests@labctl.invalid",
           "GIT_COMMITTER_NAME": "labctl tests", "GIT_COMMITTER_EMAIL": "tests@labctl.invalid",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
BREAKS = 11  # the commit of the first history that drops every frame over 1000 bytes
NO_BUILD = 8  # the one that does not compile (fixed by the next): the first midpoint git picks
SLOW = 5  # the commit of the second history that delays every transmit
SLOW_TOO = 7  # the one that changes that delay (a revert of SLOW then does not apply)
MAX_MTU = "netdev->max_mtu = MAX_JUMBO_FRAME_SIZE - (ETH_HLEN + ETH_FCS_LEN);"


@dataclass(frozen=True)
class Histories:
    repo: Path
    base: str
    net: list[str]  # net[i]: commit i of the first history (net[0] is base)
    slow: list[str]
    mtu: list[str]  # mtu[1] lowers e1000's max_mtu (what drgn reads), mtu[2] is a comment
    work: Path


def _git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                         env={**os.environ, **GIT_ENV}, timeout=600, check=False)
    assert res.returncode == 0, f"git {args}: {res.stderr}"
    return res.stdout.strip()


def _replace(path: Path, text: str) -> None:
    """New contents through a new file: never written into a hard-linked one."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def _history(repo: Path, base: str, branch: str, original: str, count: int,
             change: dict[int, str], no_build: int | None = None,
             rewrite: dict[int, tuple[str, str]] | None = None) -> list[str]:
    """``count`` commits on ``branch`` from ``base``, each adding a comment line to e1000_main.c
    but those of ``change``: from commit N on, ``change[N]`` (a statement, and nothing else) is in
    the transmit path (so that reverting it on the newest commit applies); from commit M on,
    ``rewrite[M]`` (old, new) rewrites a statement; commit ``no_build`` has a syntax error."""
    _git(repo, "checkout", "-q", "-B", branch, base)
    shas = [base]
    for i in range(1, count + 1):
        text = original + "".join(f"/* labctl bisect test: change {k} */\n" for k in range(1, i + 1)
                                  if k not in change)
        active = [stmt for n, stmt in sorted(change.items()) if n <= i]
        if active:
            text = text.replace(ANCHOR, ANCHOR + "".join(active), 1)
        for n, (old, new) in sorted((rewrite or {}).items()):
            if n <= i:
                text = text.replace(old, new, 1)
        if i == no_build:
            text += "this does not compile\n"
        _replace(repo / MAIN, text)
        _git(repo, "add", "-f", MAIN)
        subject = {no_build: "e1000: a typo"}.get(i) or next(
            (f"e1000: transmit change {n}" for n in [*change, *(rewrite or {})] if n == i), f"e1000: comment {i}")
        _git(repo, "commit", "-q", "-m", subject)
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas


@pytest.fixture(scope="session")
def histories(tree_kernel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Histories]:
    """The repository and the bisections' worktree (a 2 GB copy), removed after the run."""
    root = tmp_path_factory.mktemp("bisect")
    try:
        yield _make_histories(tree_kernel, root, "6.1")
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the repository's files are links: the cached tree stays


@pytest.fixture(scope="session")
def histories_612(tree_kernel_612: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Histories]:
    """The same on the suite's 6.12 tree, with only the history that drgn and a panic bisect (the
    others exercise the search, not the kernel: once, on 6.1, is enough)."""
    root = tmp_path_factory.mktemp("bisect612")
    try:
        yield _make_histories(tree_kernel_612, root, "6.12", only_mtu=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _make_histories(tree_kernel: Path, root: Path, series: str, only_mtu: bool = False) -> Histories:
    repo = root / "linux"
    subprocess.run(["cp", "-al", str(tree_kernel), str(repo)], check=True, timeout=600)
    original = (repo / MAIN).read_text()
    assert ANCHOR in original and MAX_MTU in original
    _git(repo, "init", "-q", "-b", "main")
    tracked = [str(p.relative_to(repo)) for p in (repo / E1000).iterdir() if p.suffix in (".c", ".h")]
    _git(repo, "add", "-f", "Makefile", f"{E1000}/Makefile", *tracked)
    _git(repo, "commit", "-q", "-m", f"linux-source-{series} as built")
    base = _git(repo, "rev-parse", "HEAD")
    net: list[str] = []
    slow: list[str] = []
    if not only_mtu:
        drop = "\tif (skb->len > 1000) {\n\t\tdev_kfree_skb_any(skb);\n\t\treturn NETDEV_TX_OK;\n\t}\n"
        net = _history(repo, base, "net-bug", original, 16, {BREAKS: drop}, no_build=NO_BUILD)
        delay = "\tudelay(skb->len * 2);\n"  # at most 4 Mbit/s through it
        # commit SLOW_TOO rewrites the delay: reverting SLOW on the newest commit does not apply
        slow = _history(repo, base, "slow-tx", original, 8, {SLOW: delay},
                        rewrite={SLOW_TOO: (delay, "\tudelay(skb->len * 2 + 1);\n")})
    # a change only the kernel's state shows: e1000 NICs accept an MTU of at most 9000 (16110 before)
    mtu = _history(repo, base, "max-mtu", original, 2, {}, rewrite={1: (MAX_MTU, "netdev->max_mtu = 9000;")})
    _git(repo, "checkout", "-q", "main")  # the user's checkout: bisect never moves it
    assert _git(repo, "rev-parse", "HEAD") == base
    return Histories(repo, base, net, slow, mtu, root / "work")


def _check_lab(tmp: Path, repo: Path) -> Path:
    lab = tmp / "bisect-net.yaml"
    lab.write_text(f"""name: bisect-net
networks:
  lan: {{}}
guests:
  a:
    kernel: {{tree: {repo}}}
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.61.0.1/24}}]
  b:
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.61.0.2/24}}]
steps:
  - name: ping
    run:
      - {{guest: a, command: "ping -c 1 -W 5 10.61.0.2", timeout: 30}}
checks:
  - name: big-ping
    guest: a
    command: ping -c 2 -W 3 -s 1400 10.61.0.2
    timeout: 20
""")
    return lab


def _bisect_args(h: Histories, lab: Path, out: Path) -> list[str]:
    return ["bisect", str(lab), "--tree", str(h.repo), "--good", h.base, "--bad", "net-bug", "--check", "big-ping",
            "--out", str(out), "--work", str(h.work), "--accel", "tcg", "--no-confirm"]


@pytest.mark.timeout(2400)
def test_bisect_with_a_check_interrupted_and_continued_names_the_commit_and_skips_one_that_does_not_build(
        cli: Cli, histories: Histories, tmp_path: Path) -> None:
    """Ctrl-C during the second booted step (after the commit that does not build was skipped): nothing
    is left up, ``--continue`` runs that step once more (not twice) and ends at the same commit with
    the whole bundle."""
    h = histories
    lab = _check_lab(tmp_path, h.repo)
    out = tmp_path / "bisect"
    t0 = time.monotonic()
    proc = cli.popen(*_bisect_args(h, lab, out))
    _interrupt_in_step_2(proc, out)
    state = json.loads((out / "state.json").read_text())
    assert not state["done"] and state["steps"][0]["verdict"] == "skip", state["steps"]
    assert cli("status", "--json", check=True).stdout.count('"bisect-net"') == 0  # nothing left up
    res = cli("bisect", "--continue", str(out), "--json", timeout=2400)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["result"]["first"] == h.net[BREAKS], res.stderr
    assert len({s["commit"] for s in data["steps"]}) == len(data["steps"])  # the interrupted step ran once more, not twice
    assert data["result"]["subject"] == f"e1000: transmit change {BREAKS}"
    steps = {s["commit"]: s for s in data["steps"]}
    typo = steps[h.net[NO_BUILD]]
    assert typo["verdict"] == "skip" and "does not build" in typo["reason"] and "error" in typo["reason"]
    judged = [s for s in data["steps"] if s["verdict"] in ("good", "bad")]
    assert judged and all(s["run"] and (out / s["run"] / "summary.json").is_file() for s in judged)
    assert all(s["verdict"] == ("bad" if h.net.index(s["commit"]) >= BREAKS else "good") for s in judged)
    for s in judged:
        t = s["times"]
        assert t["boot"] > 0 and t["total"] >= t["boot"] and "labctl" in t
    # the bundle: table, answer with its diffstat, the comparison of the last good and first bad runs
    md = (out / "report.md").read_text()
    assert h.net[BREAKS][:12] in md and "does not build" in md
    stat = (out / "first-bad.txt").read_text()
    assert f"transmit change {BREAKS}" in stat and "e1000_main.c" in stat
    assert (out / "compare.html").is_file() and (out / "report.html").is_file()
    assert data["confirmation"] is None and "not confirmed by a revert (--no-confirm)" in data["trust"]
    # the first bad run explained: what the check said of it and of the last good run
    ex = data["explained"]
    assert ex["first_bad"]["commit"] == h.net[BREAKS] and "big-ping" in ex["first_bad"]["reason"], ex
    assert h.net.index(ex["last_good"]["commit"]) < BREAKS and (out / "explained.json").is_file()
    assert f"The first bad run explained: step {ex['first_bad']['step']}" in md
    # the user's checkout was never moved, nor its files changed
    assert _git(h.repo, "rev-parse", "HEAD") == h.base
    assert _git(h.repo, "status", "--porcelain", "--untracked-files=no") == ""
    log = cli("bisect", "--log", str(out), check=True)
    assert h.net[BREAKS][:12] in log.stdout
    print(f"bisect with a check: {len(data['steps'])} steps in {took:.0f} s")


@pytest.mark.timeout(2400)
def test_bisect_with_a_throughput_figure_over_repeats(cli: Cli, histories: Histories, tmp_path: Path) -> None:
    h = histories
    lab = tmp_path / "bisect-slow.yaml"
    lab.write_text(f"""name: bisect-slow
networks:
  lan: {{}}
guests:
  a:
    kernel: {{tree: {h.repo}}}
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.62.0.1/24}}]
  b:
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.62.0.2/24}}]
steps:
  - name: transfer
    nic: a.eth1
    repeat: 2
    run:
      - {{guest: b, command: "iperf3 -s -1 -B 10.62.0.2", background: true, ready_after: 1, timeout: 60}}
      - {{guest: a, command: "iperf3 -c 10.62.0.2 -t 2 -J", timeout: 60}}
""")
    out = tmp_path / "bisect"
    res = cli("bisect", str(lab), "--tree", str(h.repo), "--good", h.base, "--bad", "slow-tx",
              "--figure", "transfer.throughput", "--below", "12", "--out", str(out), "--work", str(h.work),
              "--accel", "tcg", "--json", timeout=2400)
    assert res.returncode == 7, res.stdout + res.stderr  # found, not confirmed
    data = json.loads(res.stdout)
    assert data["result"]["first"] == h.slow[SLOW], res.stderr
    # commit SLOW_TOO rewrote the delay SLOW added: its revert on the bad end does not apply
    conf = data["confirmation"]
    assert conf["status"] == "not confirmed" and "the revert does not apply" in conf["reason"], conf
    assert conf["reverted"] == h.slow[SLOW] and conf["on"] == h.slow[-1] and conf["tries"] == []
    assert "NOT CONFIRMED" in (out / "report.md").read_text()
    judged = [s for s in data["steps"] if s["verdict"] in ("good", "bad")]
    for s in judged:
        fig = s["figure"]
        assert fig["unit"] == "Mbit/s" and len(fig["values"]) == 2 and fig["spread"]["n"] == 2
        assert (max(fig["values"]) < 12) == (s["verdict"] == "bad")
    assert "Mbit/s" in (out / "report.md").read_text()


FLAKY = 'test "$LABCTL_TRY" = 1 || ping -c 2 -W 3 -s 1200 10.61.0.2'


@pytest.mark.timeout(1800)
def test_bisect_with_a_flaky_command_oracle_tries_auto_and_confirmation(
        cli: Cli, histories: Histories, tmp_path: Path) -> None:
    """A command oracle that passes the first try of every commit (so that one run of a bad commit
    says good, as a flaky bug does), in the user's terms, between the commits around the first
    history's culprit: --tries auto reads its failure rate on the bad end (2 of 3 runs) and picks 3
    tries; the culprit, whose first try passes, is bad at its second; the answer is confirmed by its
    revert on the bad end passing all 3 tries. Later tries restore the lab from its post-boot
    snapshot (guest b's, at least: a's kernel changes with the commit)."""
    h = histories
    lab = _check_lab(tmp_path, h.repo)
    out = tmp_path / "bisect"
    t0 = time.monotonic()
    res = cli("bisect", str(lab), "--tree", str(h.repo), "--good", h.net[BREAKS - 1], "--bad", h.net[BREAKS + 1],
              "--command", FLAKY, "--on", "a", "--term-old", "works", "--term-new", "drops", "--tries", "auto",
              "--estimate-runs", "3", "--out", str(out), "--work", str(h.work), "--accel", "tcg", "--json",
              timeout=1500)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["result"]["first"] == h.net[BREAKS], res.stderr
    assert data["terms"] == ["works", "drops"] and "first drops commit" in (out / "report.md").read_text()
    est = data["estimate"]
    assert [r["outcome"] for r in est["log"]] == ["pass", "fail", "fail"] and est["commit"] == h.net[BREAKS + 1]
    assert (est["runs"], est["fails"], est["tries"], data["tries"]) == (3, 2, 3, 3) and est["confidence"] > 0.95
    assert [r["warm"] for r in est["log"]] == [False, True, True], est["log"]  # the later runs restored, not booted
    steps = {s["commit"]: s for s in data["steps"]}
    assert [t["outcome"] for t in steps[h.net[BREAKS]]["tries"]] == ["pass", "fail"]  # the first try misses it
    assert steps[h.net[BREAKS]]["verdict"] == "drops"
    conf = data["confirmation"]
    assert conf["status"] == "confirmed" and conf["reverted"] == h.net[BREAKS], conf
    assert [t["outcome"] for t in conf["tries"]] == ["pass"] * 3 and "works" in conf["reason"]
    assert data["confidence"]["verdict"] == est["confidence"] and not data["confidence"]["below_95"]
    md = (out / "report.md").read_text()
    assert "CONFIRMED" in md and "2: pass FAIL" in md and "--tries auto" in md and "3 tries a commit" in md
    runs = sum(len(s["tries"]) for s in data["steps"]) + len(est["log"]) + len(conf["tries"])
    tries = [*est["log"], *(t for s in data["steps"] for t in s["tries"]), *conf["tries"]]
    print(f"bisect with a flaky oracle: {len(data['steps'])} steps, {runs} runs of the lab in {took:.0f} s; "
          f"booted (boot s, try s): {[(t['boot'], t['seconds']) for t in tries if not t['warm']]}; "
          f"restored: {[(t['boot'], t['seconds']) for t in tries if t['warm']]}")


#: The config pair of the config bisection: the tree's .config with these set. They differ by six options,
#: each a module nothing built in depends on (an incremental build of a candidate compiles a handful of
#: files); the bad one also sets an option olddefconfig drops (its dependency VLAN_8021Q is off), and it
#: turns off the qdisc the lab's check shapes the e1000 NIC's egress with (the culprit).
CULPRIT = "CONFIG_NET_SCH_TBF"
CFG_GOOD = {CULPRIT: "m", "CONFIG_DUMMY": "m", "CONFIG_NET_SCH_PRIO": "m"}
CFG_BAD = {"CONFIG_VETH": "m", "CONFIG_NET_SCH_SFQ": "m", "CONFIG_UNIX_DIAG": "m", "CONFIG_VLAN_8021Q_GVRP": "y"}
SHAPED = "tc qdisc replace dev eth1 root tbf rate 200mbit burst 64kb latency 100ms && ping -c 2 -W 3 10.61.0.2"


def _config_with(text: str, values: dict[str, str]) -> str:
    keep = [ln for ln in text.splitlines() if not any(ln.startswith(f"{k}=") or ln == f"# {k} is not set"
                                                       for k in values)]
    return "\n".join([*keep, *(f"# {k} is not set" if v == "n" else f"{k}={v}" for k, v in values.items())]) + "\n"


@pytest.mark.timeout(2400)
def test_config_bisection_names_the_option_that_breaks_the_lab(cli: Cli, histories: Histories, tmp_path: Path) -> None:
    """Two configs of the tree at one commit, six options apart: the one that turns off the qdisc the check
    shapes the lab's NIC with is named, each candidate put through olddefconfig (which drops an option of
    the bad config: said), built in the worktree and booted."""
    h = histories
    lab = _check_lab(tmp_path, h.repo)
    lab.write_text(lab.read_text() + f"""  - name: shaped-ping
    guest: a
    command: {SHAPED}
    timeout: 30
""")
    base = (h.repo / ".config").read_text()
    good, bad = tmp_path / "good.config", tmp_path / "bad.config"
    good.write_text(_config_with(base, {**CFG_GOOD, **{k: "n" for k in CFG_BAD}}))
    bad.write_text(_config_with(base, {**CFG_BAD, **{k: "n" for k in CFG_GOOD}}))
    out = tmp_path / "bisect"
    t0 = time.monotonic()
    proc = cli.popen("bisect", str(lab), "--tree", str(h.repo), "--good-config", str(good), "--bad-config", str(bad),
                     "--check", "shaped-ping", "--out", str(out), "--work", str(h.work), "--accel", "tcg")
    first_err = _interrupt_in_step_2(proc, out)
    res = cli("bisect", "--continue", str(out), "--json", timeout=2400)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.CompletedProcess(res.args, 0, res.stdout, first_err + res.stderr)
    data = json.loads(res.stdout)
    assert [s["n"] for s in data["steps"]] == list(range(1, len(data["steps"]) + 1))  # step 2 ran once more, not twice
    assert data["result"]["options"] == {CULPRIT: ["m", "n"]}, res.stderr
    assert data["result"]["text"] == f"{CULPRIT}=m -> n breaks the lab"
    cfg = data["configs"]
    assert cfg["differ"] == 6 and cfg["olddefconfig"]["bad"] == {"CONFIG_VLAN_8021Q_GVRP": ["y", "n"]}, cfg
    judged = [s for s in data["steps"] if s["verdict"] in ("good", "bad")]
    assert judged and len(data["steps"]) <= 4
    for s in judged:  # each candidate's verdict follows the culprit's value in the config it was built with
        built = (out / s["options"]["file"]).read_text()
        assert (f"# {CULPRIT} is not set" in built) == (s["verdict"] == "bad"), s
        assert s["options"]["set"] and s["subject"].startswith(f"{len(s['options']['set'])} of ")
        assert (out / s["run"] / "summary.json").is_file()
    md = (out / "report.md").read_text()
    assert f"**{CULPRIT}=m -> n breaks the lab**" in md and "olddefconfig changed the given bad config" in md
    assert _git(h.repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert (h.repo / ".config").read_text() == base  # the user's tree and .config never touched
    # every step's build is incremental, the first in the worktree's fresh copy too (issue 39: it recompiled
    # objtool and then the whole kernel, about 1,400 objects here): only the modules of its options
    compiled = _compiled_per_step(res.stderr)
    assert len(compiled) == len(data["steps"]) and max(compiled) < 100, compiled
    print(f"config bisection (interrupted in step 2, continued): {len(data['steps'])} steps in {took:.0f} s; objects compiled: {compiled}; builds (s): "
          f"{[s['times'].get('build') for s in data['steps']]}; boots (s): {[s['times'].get('boot') for s in data['steps']]}")


def _interrupt_in_step_2(proc: subprocess.Popen[str], out: Path) -> str:
    """Ctrl-C once the first step is judged and the second is running; its progress so far."""
    try:
        deadline = time.monotonic() + 1500
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                steps = json.loads((out / "state.json").read_text()).get("steps") or []
            except (OSError, ValueError):
                steps = []
            if len(steps) >= 2 and steps[0].get("verdict") and not steps[-1].get("verdict"):
                time.sleep(3)
                break
            time.sleep(1)
        assert proc.poll() is None, "the bisection ended before it could be interrupted"
        _, err = interrupt(proc, timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "--continue" in err, err
    return err


def _compiled_per_step(progress: str) -> list[int]:
    """The CC lines of make's output the progress shows, step by step (a step run again after an interruption:
    the most of its runs)."""
    runs: list[tuple[int, int]] = []
    for line in progress.splitlines():
        text = line.strip()
        if text.startswith("bisect: step ") and ": the candidate is " not in text:
            runs.append((int(text.split()[2].rstrip(":")), 0))
        elif runs and text.startswith("CC"):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
    most: dict[int, int] = {}
    for n, count in runs:
        most[n] = max(most.get(n, 0), count)
    return [most[n] for n in sorted(most)]


#: A step that panics guest a (sysrq's crash) when its e1000 NIC's largest MTU is not e1000's own.
CRASH_UNLESS_JUMBO = "ip -d link show eth1 | grep -q 'maxmtu 16110' || echo c > /proc/sysrq-trigger"


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("series", ["6.1", "6.12"])
def test_bisect_by_kernel_state_with_drgn_and_a_crashing_runs_vmcore(
        cli: Cli, series: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Two bisections of the history whose commit 1 lowers e1000's max_mtu (one build, cached for
    the second): one judged by a drgn expression on the running kernel (--drgn) names it; the other,
    whose step panics the guest on that commit (--panic), names it too, and the crashing run's bundle
    holds the guest's vmcore (0600, in the manifest and the summary) with drgn's summary of it.
    On the 6.1 tree and on the 6.12 tree (drgn reads each kernel's own types, live and in the vmcore)."""
    h: Histories = request.getfixturevalue("histories" if series == "6.1" else "histories_612")
    lab = tmp_path / "bisect-mtu.yaml"
    lab.write_text(f"""name: bisect-mtu
networks:
  lan: {{}}
guests:
  a:
    kernel: {{tree: {h.repo}}}
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.63.0.1/24}}]
steps:
  - name: look
    run:
      - {{guest: a, command: "ip -d link show eth1", timeout: 30}}
""")
    common = ["--tree", str(h.repo), "--good", h.base, "--bad", "max-mtu", "--work", str(h.work), "--accel", "tcg",
              "--no-confirm", "--json"]
    out = tmp_path / "by-drgn"
    res = cli("bisect", str(lab), *common, "--out", str(out), "--on", "a",
              "--drgn", "netdev_get_by_name(prog['init_net'], 'eth1').max_mtu == 16110", timeout=2400)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["result"]["first"] == h.mtu[1], res.stderr
    (step,) = data["steps"]
    assert step["commit"] == h.mtu[1] and step["verdict"] == "bad"
    assert "the expression is false: " in step["reason"] and ".max_mtu is (unsigned int)9000" in step["reason"], step

    lab.write_text(lab.read_text().replace('"ip -d link show eth1"', f'"{CRASH_UNLESS_JUMBO}"'))
    out = tmp_path / "by-panic"
    res = cli("bisect", str(lab), *common, "--out", str(out), "--panic", timeout=2400)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["result"]["first"] == h.mtu[1], res.stderr
    (step,) = data["steps"]
    assert step["verdict"] == "bad" and "sysrq triggered crash" in step["reason"], step
    run = out / step["run"]
    (rec,) = json.loads((run / "summary.json").read_text())["vmcores"]
    assert (rec["guest"], rec["cause"], rec["when"], rec["file"]) == ("a", "panic", "step look", "guests/a/vmcore")
    assert json.loads((run / "manifest.json").read_text())["vmcores"] == ["guests/a/vmcore"]
    core = run / "guests" / "a" / "vmcore"
    assert core.stat().st_mode & 0o777 == 0o600 and core.read_bytes()[:8] == b"KDUMP   "
    digest = json.loads((run / "guests" / "a" / "vmcore.json").read_text())
    assert "sysrq_handle_crash" in [f["function"] for f in digest["tasks"][0]["frames"]]
    assert cli("status", "--json", check=True).stdout.count('"bisect-mtu"') == 0  # nothing left up
