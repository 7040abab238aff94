"""A bisection with a flaky oracle: tries, --tries auto's failure rate and confidence, the answer confirmed
by its revert. The verdict logic is pure (labctl.bisect.trust); the loop (labctl.bisect.engine) runs here
on a real git history with the builds and the lab's runs stood in for by a simulated flaky oracle."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

import labctl.bisect.oracle as orc
import labctl.bisect.tries as tr
from labctl.bisect import engine
from labctl.bisect.bundlepages import confidence, explain, explained_text, write
from labctl.bisect.statefile import State
from labctl.errors import LabctlError
from labctl.lab import load_lab_text
from tests.unit.test_bisect import history  # noqa: F401 - the fixture

FAIL, PASS, UNDECIDED = orc.FAIL, orc.PASS, orc.UNDECIDED


def test_the_first_fail_decides_and_a_pass_needs_every_try() -> None:
    assert tr.combine([PASS, PASS, FAIL]) == FAIL
    assert tr.combine([PASS, PASS]) == PASS
    assert tr.combine([PASS, UNDECIDED]) == UNDECIDED
    assert tr.combine([]) == UNDECIDED
    assert not tr.should_stop([PASS, PASS], 3) and tr.should_stop([PASS, PASS, PASS], 3)
    assert tr.should_stop([PASS, FAIL], 3) and tr.should_stop([UNDECIDED], 3)


@pytest.mark.parametrize("p, n", [(0.5, 5), (1 / 3, 8), (2 / 3, 3), (0.9, 2), (1.0, 1), (0.01, tr.MAX_TRIES)])
def test_tries_for_a_rate_keep_a_miss_under_five_percent(p: float, n: int) -> None:
    assert tr.tries_for(p) == n
    if n < tr.MAX_TRIES:
        assert (1 - p) ** n < tr.MISS <= (1 - p) ** (n - 1) or n == 1
        assert tr.confidence(p, n) > 0.95


def test_the_estimate_never_reads_every_run_failing_as_always() -> None:
    est = tr.estimate("c" * 40, [FAIL, FAIL, FAIL])
    assert est.fails == 3 and est.rate == pytest.approx(5 / 6, abs=1e-3) and est.tries == 2
    est = tr.estimate("c" * 40, [PASS, FAIL, FAIL, UNDECIDED])  # undecided runs are not counted
    assert (est.runs, est.fails, est.tries) == (3, 2, 3) and est.confidence == pytest.approx(1 - (1 / 3) ** 3, abs=1e-3)
    low = tr.estimate("c" * 40, [FAIL] + [PASS] * 49)  # 2%: 20 tries are not enough
    assert low.tries == tr.MAX_TRIES and low.confidence < 0.95
    assert "BELOW 95%: the rate is too low for 20 tries" in tr.confidence_text(low.to_dict())
    assert "BELOW" not in tr.confidence_text(est.to_dict())


class Flaky:
    """A lab whose oracle fails at ``rate`` on commits from ``first_bad`` on (and on the bad end with the answer
    reverted unless ``revert_fixes``), and always passes before it: every run is counted."""

    def __init__(self, shas: list[str], first_bad: int, rate: float, seed: int, revert_fixes: bool = True) -> None:
        self.shas, self.first_bad, self.rate = shas, first_bad, rate
        self.rng = random.Random(seed)
        self.revert_fixes = revert_fixes
        self.reverted = ""
        self.runs: list[tuple[str, int]] = []  # (commit, LABCTL_TRY)

    def kernel(self, commit: str, step: object, revert_of: str = "",
               config: bytes | None = None) -> tuple[object, bool, str]:
        self.reverted = revert_of
        return (commit, revert_of), True, ""

    def end_config(self, new: bool) -> bytes | None:
        return None

    def run_lab(self, kernel: tuple[str, str], out: Path, env: engine.TryEnv | None = None) -> engine.Run:
        commit, reverted = kernel
        assert env is not None and env.commit == commit
        self.runs.append((commit, env.n))
        bad = self.shas.index(commit) >= self.first_bad and not (reverted and self.revert_fixes)
        failed = bad and self.rng.random() < self.rate
        record = {"name": "ok", "guest": "a", "status": "fail" if failed else "pass", "passed": not failed,
                  "exit_status": 1 if failed else 0, "seconds": 0.1, "hint": "", "detail": ""}
        return engine.Run(orc.Evidence(summary={"steps": []}, checks=[record]), None, {"boot": 1.0})  # type: ignore[list-item]


def _bisector(tmp_path: Path, repo: Path, shas: list[str], flaky: Flaky, tries: int, **kw: object) -> engine.Bisector:
    (repo / ".config").write_text("CONFIG_X=y\n")
    lab = load_lab_text("name: b\nnetworks: {n: {}}\nguests: {a: {nics: [{name: eth1, model: e1000, network: n}]}}\n"
                        "checks: [{name: ok, guest: a, command: 'true'}]\n", "b.yaml")
    st = State(lab_file="/x/b.yaml", tree=str(repo), good=shas[0], bad=shas[-1],
               oracle=orc.make("check", name="ok").to_dict(), work=str(tmp_path / "work"), tries=tries, **kw)  # type: ignore[arg-type]
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    bis = engine.Bisector(bundle, st, lab, None, None, None)  # type: ignore[arg-type]
    bis.wt.ensure = lambda rev, say=None: None  # type: ignore[method-assign, assignment, misc]
    bis.kernel = flaky.kernel  # type: ignore[method-assign, assignment]
    bis.run_lab = flaky.run_lab  # type: ignore[method-assign, assignment]
    return bis


FIRST_BAD = 11


def test_one_try_of_a_flaky_oracle_names_a_wrong_commit(history: tuple[Path, list[str]], tmp_path: Path) -> None:  # noqa: F811
    """The case for tries: the same flaky lab as below, judged once a commit, passes a bad commit."""
    repo, shas = history
    flaky = Flaky(shas, FIRST_BAD, 1 / 3, seed=1)
    st = _bisector(tmp_path, repo, shas, flaky, tries=1, confirm=False).run()
    assert st.result["first"] != shas[FIRST_BAD]


@pytest.mark.parametrize("seed", range(8))
def test_tries_auto_on_a_flaky_oracle_finds_and_confirms_the_commit(history: tuple[Path, list[str]],  # noqa: F811
                                                                   tmp_path: Path, seed: int) -> None:
    repo, shas = history
    flaky = Flaky(shas, FIRST_BAD, 1 / 3, seed=seed)
    st = _bisector(tmp_path, repo, shas, flaky, tries=0, estimate_runs=12).run()
    est = st.estimate
    assert est["commit"] == shas[-1] and est["runs"] == 12 and 0 < est["fails"] <= 12
    assert est["tries"] == tr.tries_for(est["rate"]) and [r for r in flaky.runs[:12]] == [(shas[-1], i) for i in range(1, 13)]
    assert st.result["first"] == shas[FIRST_BAD]
    n = est["tries"]
    for step in st.steps:  # a good step passed every try; a bad one stopped at its first fail
        outcomes = [t["outcome"] for t in step.tries]
        if step.verdict == "old":
            assert outcomes == [PASS] * n
        else:
            assert outcomes[-1] == FAIL and outcomes[:-1] == [PASS] * (len(outcomes) - 1) and len(outcomes) <= n
    assert st.confirmation["status"] == engine.CONFIRMED and flaky.reverted == shas[FIRST_BAD]
    assert [t["outcome"] for t in st.confirmation["tries"]] == [PASS] * n
    conf = confidence(st)
    assert conf is not None and conf["verdict"] == est["confidence"] and conf["answer"] <= conf["verdict"]
    write(tmp_path / "bundle", st)
    md = (tmp_path / "bundle" / "report.md").read_text()
    assert "--tries auto" in md and "CONFIRMED" in md and f"{n}: pass" in md


def test_a_revert_that_does_not_fix_it_is_not_confirmed(history: tuple[Path, list[str]], tmp_path: Path) -> None:  # noqa: F811
    repo, shas = history
    flaky = Flaky(shas, FIRST_BAD, 1.0, seed=0, revert_fixes=False)
    st = _bisector(tmp_path, repo, shas, flaky, tries=2).run()
    assert st.result["first"] == shas[FIRST_BAD]
    conf = st.confirmation
    assert conf["status"] == engine.NOT_CONFIRMED and "is still bad" in conf["reason"]
    assert [t["outcome"] for t in conf["tries"]] == [FAIL]  # the first fail decides


def test_a_revert_that_does_not_apply_is_not_confirmed(history: tuple[Path, list[str]], tmp_path: Path) -> None:  # noqa: F811
    """The real worktree's revert on the unit history (each commit rewrites the same line): git refuses it."""
    from labctl.bisect.worktree import Worktree

    repo, shas = history
    wt = tmp_path / "wt"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(wt), shas[-1]], check=True)
    w = Worktree(repo, tmp_path)
    w.path = wt
    why = w.revert(shas[FIRST_BAD])
    assert "could not revert" in why
    assert subprocess.run(["git", "-C", str(wt), "status", "--porcelain"], capture_output=True, text=True,
                          check=True).stdout == ""  # left as it was
    assert w.revert(shas[-1]) == ""  # the newest commit reverts cleanly
    assert (wt / "f").read_text() == "15\n"

    (tmp_path / "b").mkdir()
    bis = _bisector(tmp_path / "b", repo, shas, Flaky(shas, FIRST_BAD, 1.0, seed=0), tries=1)

    def kernel(commit: str, step: object, revert_of: str = "", config: bytes | None = None) -> tuple[object, bool, str]:
        if revert_of:
            return None, False, f"cannot be made: the revert does not apply: {why}"
        return (commit, ""), True, ""

    bis.kernel = kernel  # type: ignore[method-assign, assignment]
    st = bis.run()
    assert st.confirmation["status"] == engine.NOT_CONFIRMED and "does not apply" in st.confirmation["reason"]


def test_tries_auto_refuses_a_failing_end_that_never_fails(history: tuple[Path, list[str]], tmp_path: Path) -> None:  # noqa: F811
    repo, shas = history
    flaky = Flaky(shas, FIRST_BAD, 0.0, seed=0)
    with pytest.raises(LabctlError, match="did not fail in 4 runs"):
        _bisector(tmp_path, repo, shas, flaky, tries=0, estimate_runs=4).run()


def test_the_command_oracle_sees_its_try() -> None:
    assert engine.TryEnv(3, "abc").prefix().startswith("LABCTL_TRY=3 LABCTL_COMMIT=abc;")


def test_the_first_bad_run_is_explained_by_what_changed_most() -> None:
    from labctl.bisect.statefile import Step

    old = Step(n=3, commit="a" * 40, reason="check big-ping passed", run="steps/03/x")
    new = Step(n=5, commit="b" * 40, reason="check big-ping failed: 100% packet loss", run="steps/05/y")
    metric = {"key": "softnet_dropped", "label": "softnet drops", "unit": "", "change": 12.0}
    result = {"differences": [{"what": "kernel of a", "a": "6.1 (a)", "b": "6.1 (b)"}],
              "pairs": [{"step": "ping", "variant": None, "metrics": [
                  {**metric, "a": {"mean": 0.0}, "b": {"mean": 12.0}, "change_pct": 100.0, "verdict": "no repeats"},
                  {**metric, "key": "rtt", "label": "rtt", "unit": "ms", "a": {"mean": 1.0}, "b": {"mean": 1.1},
                   "change_pct": 10.0, "verdict": "beyond noise"},
                  {**metric, "key": "same", "change": 0.0, "a": {"mean": 1.0}, "b": {"mean": 1.0}, "change_pct": 0.0,
                   "verdict": "within noise"}]}]}
    why = explain(old, new, result)
    assert [r["figure"] for r in why["changed"]] == ["ping.rtt", "ping.softnet_dropped"]  # beyond noise first
    st = State(lab_file="/x/b.yaml", tree="/t", good="a" * 40, bad="b" * 40, oracle={"kind": "panic"})
    text = explained_text(st, why)
    assert "step 5 (bbbbbbbbbbbb): check big-ping failed: 100% packet loss" in text
    assert "- kernel of a: 6.1 (a) -> 6.1 (b)" in text and "ping.softnet_dropped (softnet drops): 0 -> 12 (+100%" in text
