"""labctl bisect's pure parts: the search on a small git history, the state file, the oracles."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import labctl.bisect.oracle as orc
from labctl.bisect.engine import on_tree, tree_guests
from labctl.bisect.search import Next, next_step, resolve
from labctl.bisect.statefile import NEW, OLD, SKIP, State, Step, load, save
from labctl.errors import UsageError

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@x", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
       "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=ENV).stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """A linear history of 17 commits: c0 (good) ... c16 (bad)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(17):
        (repo / "f").write_text(f"{i}\n")
        _git(repo, "add", "f")
        _git(repo, "commit", "-q", "-m", f"c{i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return repo, shas


def _bisect(repo: Path, shas: list[str], first_bad: int, skip: set[int] = frozenset()) -> tuple[Next, int]:
    olds, new, skips = [shas[0]], shas[-1], []
    steps = 0
    while True:
        nxt = next_step(repo, new, olds, skips)
        if nxt.commit is None:
            return nxt, steps
        steps += 1
        i = shas.index(nxt.commit)
        if i in skip:
            skips.append(nxt.commit)
        elif i >= first_bad:
            new = nxt.commit
        else:
            olds.append(nxt.commit)


@pytest.mark.parametrize("first_bad", [1, 5, 8, 9, 16])
def test_search_finds_the_first_bad_commit(history: tuple[Path, list[str]], first_bad: int) -> None:
    repo, shas = history
    nxt, steps = _bisect(repo, shas, first_bad)
    assert nxt.first == shas[first_bad]
    assert steps <= 5  # log2(16) + 1


def test_search_goes_around_skipped_commits(history: tuple[Path, list[str]]) -> None:
    repo, shas = history
    first_try = next_step(repo, shas[-1], [shas[0]], []).commit
    assert first_try is not None
    nxt, _ = _bisect(repo, shas, 11, skip={shas.index(first_try)})
    assert nxt.first == shas[11]


def test_search_with_only_skipped_commits_left_names_the_candidates(history: tuple[Path, list[str]]) -> None:
    repo, shas = history
    nxt, _ = _bisect(repo, shas, 6, skip={5})
    assert nxt.first is None
    assert set(nxt.candidates) == {shas[5], shas[6]}


def test_resolve_refuses_what_is_not_a_commit(history: tuple[Path, list[str]]) -> None:
    repo, shas = history
    assert resolve(repo, "main") == shas[-1]
    with pytest.raises(UsageError):
        resolve(repo, "no-such-branch")
    with pytest.raises(UsageError):
        resolve(repo, "--all")


def test_state_round_trips_and_counts_verdicts(tmp_path: Path) -> None:
    oracle = orc.make("check", name="ping")
    st = State(lab_file="/x/lab.yaml", tree="/t", good="a" * 40, bad="b" * 40, oracle=oracle.to_dict())
    for n, (commit, verdict) in enumerate((("c" * 40, OLD), ("d" * 40, NEW), ("e" * 40, SKIP)), 1):
        step = Step(n=n, commit=commit, verdict=verdict, times={"build": 1.5})
        st.steps.append(step)
        st.record(step)
    save(tmp_path, st)
    back = load(tmp_path)
    assert back == st
    assert back.olds == ["c" * 40] and back.news == ["d" * 40] and back.skips == ["e" * 40]
    assert back.term(OLD) == "good" and back.term(NEW) == "bad"
    assert back.oracle == {"kind": "check", "name": "ping"} and orc.Oracle.from_dict(back.oracle) == oracle


def test_state_records_are_every_field_as_the_file_has_them(tmp_path: Path) -> None:
    """The typed records (StateRecord, StepRecord) write what dataclasses.asdict wrote, key for key and in
    order, so that a state file written before them still loads and is written back unchanged."""
    import dataclasses

    tr = {"n": 1, "outcome": "fail", "reason": "r", "run": "steps/01/x", "warm": True, "attempts": 2, "boot": 1.5,
          "seconds": 9.0}
    st = State(lab_file="/x/lab.yaml", tree="/t", good="a" * 40, bad="b" * 40,
               oracle=orc.make("figure", figure="s.k", worse_than_good=5.0, fixed=True).to_dict(), work="/w",
               up={"accel": "tcg", "boot_timeout": 90.0, "jobs": None}, trust_dirs=["/d"], olds=["a" * 40],
               news=["b" * 40], skips=["s"], reference="reference/r", tries=0, estimate_runs=3,
               estimate={"commit": "b" * 40, "outcomes": ["fail"], "runs": 1, "fails": 1, "rate": 0.5, "tries": 5,
                         "confidence": 0.97, "log": [tr], "times": {"boot": 1.0}},
               confirmation={"reverted": "c" * 40, "on": "b" * 40, "tries": [tr], "times": {}, "status": "confirmed",
                             "reason": "r", "run": "confirm/x"},
               configs={"given": {"good": "configs/good-given.config"}, "good": "configs/good.config",
                        "olddefconfig": {"good": {"CONFIG_X": ["y", "n"]}}, "differ": 2, "resolved": True},
               lab_up=True, done=True, result={"first": "c" * 40, "subject": "net: x"})
    st.steps += [Step(n=1, commit="c" * 40, subject="s", verdict=NEW, reason="r", outcome="fail",
                      figure={"name": "s.k", "values": [1.0], "spread": {"n": 1, "mean": 1.0, "min": 1.0, "max": 1.0,
                                                                          "sd": 0.0}},
                      run="steps/01/x", attempts=2, tries=[tr], cached_build=True, times={"build": 1.0},
                      options={"file": "configs/01.config", "set": {"CONFIG_X": ["n", "y"]}, "left": [1, 1]},
                      notes=["objtool rebuilt"]),
                 Step(n=2, commit="d" * 40)]
    assert st.to_dict() == dataclasses.asdict(st)
    assert list(st.to_dict()) == [f.name for f in dataclasses.fields(State)]
    assert list(st.steps[0].to_dict()) == [f.name for f in dataclasses.fields(Step)]
    save(tmp_path, st)
    text = (tmp_path / "state.json").read_text()
    assert text == json.dumps(dataclasses.asdict(st), indent=2) + "\n"
    back = load(tmp_path)
    assert back == st
    save(tmp_path, back)
    assert (tmp_path / "state.json").read_text() == text


def test_state_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a bisection"):
        load(tmp_path)
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "lab_file": "x"}))
    with pytest.raises(UsageError, match="missing"):
        load(tmp_path)
    (tmp_path / "state.json").write_text("{")
    with pytest.raises(UsageError):
        load(tmp_path)


def _summary(values: list[float], step: str = "transfer", variant: str | None = None,
             failed: bool = False) -> dict[str, object]:
    steps = []
    for i, v in enumerate(values, 1):
        steps.append({"name": step, "variant": variant, "repeat": i, "repeats": len(values),
                      "status": "failed" if failed else "ok", "reason": "exit 1" if failed else None,
                      "figures": {"throughput_mbit_s": v}})
    return {"steps": steps}


def test_figure_below_over_repeats() -> None:
    o = orc.make("figure", figure="transfer.throughput", below=50.0)
    assert orc.judge(o, orc.Evidence(summary=_summary([80, 90, 85]))).outcome == orc.PASS
    j = orc.judge(o, orc.Evidence(summary=_summary([20, 30, 25])))
    assert j.outcome == orc.FAIL and j.figure and j.figure["spread"]["n"] == 3
    assert orc.judge(o, orc.Evidence(summary=_summary([40, 60]))).outcome == orc.UNDECIDED
    assert orc.judge(o, orc.Evidence(summary=_summary([40], failed=True))).outcome == orc.UNDECIDED


def test_figure_with_a_variant_and_above() -> None:
    o = orc.make("figure", figure="transfer.e1000.throughput_mbit_s", above=100.0)
    assert orc.judge(o, orc.Evidence(summary=_summary([120, 130], variant="e1000"))).outcome == orc.FAIL
    assert orc.judge(o, orc.Evidence(summary=_summary([80], variant="e1000"))).outcome == orc.PASS
    assert orc.judge(o, orc.Evidence(summary=_summary([80], variant="rtl8139"))).outcome == orc.UNDECIDED


def test_figure_worse_than_good_uses_the_noise_rule() -> None:
    o = orc.make("figure", figure="transfer.throughput", worse_than_good=10.0)
    ref = _summary([100, 104, 102])
    assert orc.judge(o, orc.Evidence(summary=_summary([99, 103, 101])), ref).outcome == orc.PASS
    assert orc.judge(o, orc.Evidence(summary=_summary([60, 62, 61])), ref).outcome == orc.FAIL
    # 20% worse on average but the runs overlap the good end's: within noise, undecided
    assert orc.judge(o, orc.Evidence(summary=_summary([40, 103, 101])), ref).outcome == orc.UNDECIDED


def test_check_step_panic_and_command_oracles() -> None:
    check = orc.make("check", name="big-ping")
    passed = {"name": "big-ping", "status": "pass"}
    failed = {"name": "big-ping", "status": "fail", "exit_status": 1}
    broken = {"name": "big-ping", "status": "error", "detail": "no SSH"}
    assert orc.judge(check, orc.Evidence(checks=[passed])).outcome == orc.PASS
    assert orc.judge(check, orc.Evidence(checks=[failed])).outcome == orc.FAIL
    assert orc.judge(check, orc.Evidence(checks=[broken])).outcome == orc.UNDECIDED
    timed_out = {"name": "big-ping", "status": "timeout", "seconds": 20.0}  # a timeout is a failure, never a pass
    assert orc.judge(check, orc.Evidence(checks=[timed_out])) == orc.Judgement(orc.FAIL, "check big-ping failed (timed out)")
    assert orc.judge(check, orc.Evidence()).outcome == orc.UNDECIDED

    step = orc.make("step", name="transfer")
    assert orc.judge(step, orc.Evidence(summary=_summary([1, 2]))).outcome == orc.PASS
    assert orc.judge(step, orc.Evidence(summary=_summary([1], failed=True))).outcome == orc.FAIL
    oopsed = orc.Evidence(summary=_summary([1]), oopses={"a": ["BUG: kernel NULL pointer dereference in x"]})
    assert orc.judge(step, oopsed).outcome == orc.FAIL
    assert orc.judge(orc.make("step", name="other"), orc.Evidence(summary=_summary([1]))).outcome == orc.UNDECIDED

    panic = orc.make("panic")
    assert orc.judge(panic, oopsed).outcome == orc.FAIL
    assert orc.judge(panic, orc.Evidence(summary=_summary([1]))).outcome == orc.PASS

    cmd = orc.make("command", command="true")
    assert orc.judge(cmd, orc.Evidence(command={"status": "pass"})).outcome == orc.PASS
    assert orc.judge(cmd, orc.Evidence(command={"status": "fail", "exit_status": 3})).outcome == orc.FAIL
    assert orc.judge(cmd, orc.Evidence(command={"status": "error"})).outcome == orc.UNDECIDED
    assert orc.judge(cmd, orc.Evidence(command={"status": "timeout"})) == orc.Judgement(orc.FAIL, "the command timed out")


def test_oracle_descriptions_are_checked() -> None:
    with pytest.raises(UsageError):
        orc.make("figure", figure="transfer.throughput")
    with pytest.raises(UsageError):
        orc.make("figure", figure="transfer.throughput", below=1.0, above=2.0)
    with pytest.raises(UsageError):
        orc.make("figure", figure="throughput", below=1.0)
    with pytest.raises(UsageError):
        orc.make("check")


def test_only_the_guests_on_the_tree_move_to_the_worktree(tmp_path: Path) -> None:
    from labctl.lab import load_lab_text

    tree = tmp_path / "linux"
    tree.mkdir()
    text = (f"name: t\nnetworks: {{lan: {{}}}}\nguests:\n"
            f"  a:\n    kernel: {{tree: {tree}}}\n    nics: [{{name: eth1, model: e1000, network: lan}}]\n"
            f"  b:\n    nics: [{{name: eth1, model: e1000, network: lan}}]\n")
    lab = load_lab_text(text, tmp_path / "lab.yaml")
    assert tree_guests(lab, tree) == ["a"]
    moved = on_tree(lab, tree, tmp_path / "wt")
    assert moved.kernel_of("a").tree == tmp_path / "wt"  # type: ignore[union-attr]
    assert moved.kernel_of("b") is None
    plain = load_lab_text(text.replace(f"    kernel: {{tree: {tree}}}\n", ""), tmp_path / "lab.yaml")
    assert tree_guests(plain, tree) == ["a", "b"]
    everyone = on_tree(plain, tree, tmp_path / "wt")
    assert everyone.kernel_of("b").tree == tmp_path / "wt"  # type: ignore[union-attr]


@pytest.mark.parametrize("extra", [[], ["--check", "a", "--panic"], ["--panic", "--below", "3"],
                                   ["--figure", "transfer.throughput"], ["--panic", "--tries", "many"],
                                   ["--panic", "--tries", "0"], ["--panic", "--estimate-runs", "3"],
                                   ["--panic", "--tries", "auto", "--estimate-runs", "0"]])
def test_bisect_usage_errors_exit_2(history: tuple[Path, list[str]], tmp_path: Path, extra: list[str]) -> None:
    from labctl.cli.main import main

    repo, shas = history
    (repo / ".config").write_text("CONFIG_X=y\n")
    (repo / "Makefile").write_text("all:\n")
    lab = Path(__file__).resolve().parents[2] / "labs" / "quickstart.yaml"
    argv = ["bisect", str(lab), "--tree", str(repo), "--good", shas[0], "--bad", shas[-1], "--out",
            str(tmp_path / "out"), *extra]
    assert main(argv) == 2
    assert not (tmp_path / "out" / "state.json").exists()


def test_bisect_refuses_a_good_end_that_is_not_an_ancestor(history: tuple[Path, list[str]], tmp_path: Path) -> None:
    from labctl.cli.main import main

    repo, shas = history
    (repo / ".config").write_text("CONFIG_X=y\n")
    (repo / "Makefile").write_text("all:\n")
    lab = Path(__file__).resolve().parents[2] / "labs" / "quickstart.yaml"
    assert main(["bisect", str(lab), "--tree", str(repo), "--good", shas[5], "--bad", shas[2], "--panic",
                 "--out", str(tmp_path / "out")]) == 2


def test_one_bisection_at_a_time_in_a_worktree(tmp_path: Path) -> None:
    from labctl.bisect.worktree import locked
    from labctl.errors import LabctlError

    with locked(tmp_path), pytest.raises(LabctlError, match="another labctl bisect is using"), locked(tmp_path):
        pass
    with pytest.raises(BlockingIOError, match="from the work"), locked(tmp_path):  # the block's own, not the lock's
        raise BlockingIOError("from the work")
    with locked(tmp_path):  # released
        pass


def test_the_worktree_builds_each_commit_through_proc(history: tuple[Path, list[str]], tmp_path: Path) -> None:
    """The worktree (a copy of the tree with its files) moves to a commit and runs make there through
    labctl.proc (git and make never through subprocess): a target that fails gives make's error line."""
    from labctl.bisect.worktree import Worktree

    repo, shas = history
    (repo / ".config").write_text("CONFIG_X=y\n")
    (repo / "Makefile").write_text("olddefconfig:\n\t@echo configured\nvmlinux modules:\n"
                                   "\t@test \"$$(cat f)\" != 3 || { echo 'f.c:1: error: three' >&2; exit 2; }\n"
                                   "\t@echo built $$(cat f)\n")
    wt = Worktree(repo, tmp_path / "work")
    wt.ensure(shas[5])
    assert (wt.path / "f").read_text() == "5\n" and wt.ready()
    lines: list[str] = []
    ok = wt.build(1, lines.append)
    assert ok.ok and "configured" in lines and "built 5" in ok.log
    wt.checkout(shas[3])
    bad = wt.build(1)
    assert not bad.ok and bad.reason == "f.c:1: error: three"
    assert (repo / "f").read_text() == "16\n"  # the user's checkout is never touched


def test_bisects_front_is_prepare_without_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """labctl bisect calls labctl.pipeline.prepare(kernels=False): the capacity check (it skipped it
    before), the image, the kernels' checks and preflight, and no kernel prepared (each commit's is)."""
    from labctl import pipeline
    from labctl.lab import load_lab_text

    calls: list[str] = []
    monkeypatch.setattr(pipeline, "check_capacity", lambda labs, overcommit: calls.append("capacity"))
    monkeypatch.setattr(pipeline, "prepare_image", lambda name, events: calls.append("image") or "IMAGE")
    monkeypatch.setattr(pipeline, "_kernel_checks", lambda lab, image, events: calls.append(f"checks {image}"))
    monkeypatch.setattr(pipeline, "prepare_kernels", lambda lab, image, events: calls.append("kernels") or {})
    lab = load_lab_text("name: b\nnetworks: {n: {}}\nguests: {a: {nics: [{name: eth1, model: e1000, network: n}]}}\n", "b.yaml")
    got = pipeline.prepare(lab, kernels=False)
    assert calls == ["capacity", "image", "checks IMAGE"] and got.kernels == {} and got.image == "IMAGE"
    calls.clear()
    pipeline.prepare(lab)
    assert calls == ["capacity", "image", "kernels"]


@pytest.mark.parametrize("fixed, outcome, verdict", [(False, "pass", OLD), (False, "fail", NEW), (True, "pass", NEW),
                                                     (True, "fail", OLD), (False, "undecided", SKIP)])
def test_a_steps_verdict_follows_the_oracle(tmp_path: Path, fixed: bool, outcome: str, verdict: str) -> None:
    """One step of the bisection loop with its build and lab run stood in for: an oracle that passes
    makes the commit old (good), one that fails makes it new (bad); --fixed the other way round; an
    undecided run is run once more, then the commit skipped."""
    from labctl.bisect import engine
    from labctl.lab import load_lab_text

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".config").write_text("CONFIG_X=y\n")
    lab = load_lab_text("name: b\nnetworks: {n: {}}\nguests: {a: {nics: [{name: eth1, model: e1000, network: n}]}}\n"
                        "checks: [{name: ok, guest: a, command: 'true'}]\n", "b.yaml")
    oracle = orc.make("check", name="ok", fixed=fixed or None)
    st = State(lab_file="/x/b.yaml", tree=str(tree), good="a" * 40, bad="b" * 40, oracle=oracle.to_dict(),
               work=str(tmp_path / "work"))
    bis = engine.Bisector(tmp_path / "bundle", st, lab, None, None, None)  # type: ignore[arg-type]
    status = {"pass": "pass", "fail": "fail", "undecided": "error"}[outcome]
    runs: list[Path] = []

    def run_lab(kernel: object, out: Path, env: object = None) -> engine.Run:
        runs.append(out)
        record = {"name": "ok", "guest": "a", "status": status, "passed": status == "pass", "exit_status": 0,
                  "seconds": 0.1, "hint": "", "detail": ""}
        return engine.Run(orc.Evidence(summary={"steps": []}, checks=[record]), None, {"boot": 1.0})  # type: ignore[list-item]

    bis.kernel = lambda commit, step, revert_of="", config=None: (object(), True, "")  # type: ignore[method-assign, assignment, return-value]
    bis.run_lab = run_lab  # type: ignore[method-assign]
    step = Step(n=1, commit="c" * 40)
    bis.one_step(step)
    assert (step.outcome or "undecided", step.verdict) == (outcome, verdict)
    assert len(runs) == (2 if outcome == "undecided" else 1)


def test_a_bundle_others_may_write_is_refused_before_its_state_is_read(tmp_path: Path) -> None:
    from labctl.errors import UnsafePath

    st = State(lab_file="/x/lab.yaml", tree="/t", good="a" * 40, bad="b" * 40, oracle=orc.make("panic").to_dict())
    save(tmp_path, st)
    os.chmod(tmp_path, 0o777)  # anyone could have put that state there
    with pytest.raises(UnsafePath, match="writable by other users"):
        load(tmp_path)
    os.chmod(tmp_path, 0o700)
    os.chmod(tmp_path / "state.json", 0o666)
    with pytest.raises(UnsafePath, match="refusing to read"):
        load(tmp_path)
    os.chmod(tmp_path / "state.json", 0o600)
    (tmp_path / "real.json").write_text((tmp_path / "state.json").read_text())
    (tmp_path / "state.json").unlink()
    (tmp_path / "state.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(UsageError, match="cannot read"):
        load(tmp_path)
    (tmp_path / "state.json").unlink()
    os.mkfifo(tmp_path / "state.json")  # never waited on
    with pytest.raises(UnsafePath, match="refusing to read"):
        load(tmp_path)


def test_the_build_cache_names_only_kernels_of_labctls_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.bisect.worktree import BuildCache, checked_work
    from labctl.errors import UnsafePath
    from labctl.kernel.cached import Kernel, kernels_root

    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    ours = kernels_root() / "k1"
    ours.mkdir(parents=True)
    (ours / "manifest.json").write_text("{}")
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "manifest.json").write_text("{}")
    (tmp_path / "host-file").write_text("root's\n")
    (planted / "modules.img").symlink_to(tmp_path / "host-file")  # what QEMU would open as the modules disk
    (kernels_root() / "k2").symlink_to(planted)
    work = checked_work(tmp_path / "work")
    cache = BuildCache(work)
    cache.put("c1", "cfg", ours)
    cache.put("c2", "cfg", planted)
    cache.put("c3", "cfg", kernels_root() / "k2")
    cache.put("c4", "cfg", kernels_root() / ".." / "planted")
    assert cache.get("c1", "cfg") == ours
    assert [cache.get(c, "cfg") for c in ("c2", "c3", "c4")] == [None, None, None]
    assert Kernel.at(planted).modules_img is None
    (ours / "modules.img").write_bytes(b"")
    assert Kernel.at(ours).modules_img == ours / "modules.img"
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(UnsafePath, match="writable by other users"):
        checked_work(shared)
