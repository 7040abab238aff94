"""Config bisection's splitting (labctl.bisect.configs) with a stand-in olddefconfig, and its bad input."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

import labctl.bisect.configs as cf
from labctl.errors import UsageError

HEAD = "#\n# Automatically generated file; DO NOT EDIT.\n# Linux/x86 6.1.192 Kernel Configuration\n#\n"
NAMES = ["CONFIG_DUMMY", "CONFIG_NET_SCH_PRIO", "CONFIG_NET_SCH_SFQ", "CONFIG_NET_SCH_TBF", "CONFIG_UNIX_DIAG",
         "CONFIG_VETH", "CONFIG_E1000", "CONFIG_E1000E"]


def _cfg(**values: str) -> cf.Config:
    return cf.Config({f"CONFIG_{k}": v for k, v in values.items()}, "x86", "6.1")


def _olddef(deps: dict[str, str]) -> Callable[[cf.Config], cf.Config]:
    """A stand-in for make olddefconfig: an option whose dependency (deps[option]) is off is dropped."""
    def run(c: cf.Config) -> cf.Config:
        values = dict(c.values)
        for opt, dep in deps.items():
            if values.get(dep, "n") == "n" and opt in values:
                values[opt] = "n"
        return cf.Config(values, c.arch, c.version)
    return run


def _bisect(good: cf.Config, bad: cf.Config, breaks: Callable[[cf.Config], bool],
            deps: dict[str, str] | None = None) -> tuple[dict[str, list[str]], int, list[cf.Candidate]]:
    """cfgloop's loop without builds: the answer, the steps it took, the candidates."""
    olddef = _olddef(deps or {})
    good, bad = olddef(good), olddef(bad)
    tried: list[cf.Candidate] = []
    while len(cf.diff(good, bad)) > 1:
        cand = cf.pick(good, bad, olddef)
        if cand is None:
            break
        tried.append(cand)
        if breaks(cand.config):
            bad = cand.config
        else:
            good = cand.config
    return cf.changes(cf.diff(good, bad), good, bad), len(tried), tried


def test_parse_and_render_round_trip() -> None:
    text = HEAD + "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_S=\"x y\"\nCONFIG_N=3\nCONFIG_A=m\n"
    c = cf.parse(text)
    assert c.values == {"CONFIG_A": "m", "CONFIG_B": "n", "CONFIG_S": '"x y"', "CONFIG_N": "3"}
    assert (c.arch, c.version) == ("x86", "6.1") and c.get("CONFIG_NOT_THERE") == "n"
    assert cf.parse(cf.render(c)).values == c.values


def test_diff_keeps_families_together_and_treats_absent_as_off() -> None:
    good = _cfg(E1000="m", NET_SCH_TBF="m", VETH="n")
    bad = _cfg(E1000E="y", NET_SCH_SFQ="m", NET_SCH_TBF="m", DUMMY="m")
    assert cf.diff(good, bad) == ["CONFIG_DUMMY", "CONFIG_E1000", "CONFIG_E1000E", "CONFIG_NET_SCH_SFQ"]
    assert cf.change_text("CONFIG_E1000", good, bad) == "CONFIG_E1000=m -> n"


def test_chunks_are_halves_then_quarters_then_single_options() -> None:
    parts = list(cf.chunks(list("abcdef")))
    assert parts[:2] == [["a", "b", "c"], ["d", "e", "f"]]
    assert parts[2:5] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert parts[5:] == [[x] for x in "abcdef"]
    assert list(cf.chunks(["a", "b"])) == [["a"], ["b"]]


@pytest.mark.parametrize("culprit", NAMES)
def test_bisection_names_the_one_option_that_breaks(culprit: str) -> None:
    good = cf.Config({n: "m" for n in NAMES}, "x86", "6.1")
    bad = cf.Config({n: "n" for n in NAMES}, "x86", "6.1")
    answer, steps, tried = _bisect(good, bad, lambda c: c.get(culprit) == "n")
    assert answer == {culprit: ["m", "n"]}
    assert steps <= math.ceil(math.log2(len(NAMES)))
    assert all(not c.missing and not c.tried for c in tried)  # no dependencies: every half applied whole
    assert cf.answer_text(answer) == f"{culprit}=m -> n breaks the lab"
    assert cf.answer_text(answer, "slow") == f"{culprit}=m -> n makes it slow"


def test_a_half_olddefconfig_undoes_is_said_and_the_other_half_tried() -> None:
    """The bad config turns on A and B (B depends on A) and C, D: the half {A... } is sorted with its family,
    but a half that holds B without A comes back from olddefconfig without it (missing), and a half that
    comes back as the good config is not tried (the next part is)."""
    good = _cfg(A="n", A_B="n", C="n", D="n")
    bad = _cfg(A="y", A_B="y", C="y", D="y")
    olddef = _olddef({"CONFIG_A_B": "CONFIG_A"})
    # only B of the first quarter: olddefconfig drops it -> the good config, not tried
    cand = cf.pick(olddef(good), olddef(bad), olddef)
    assert cand is not None and cand.names == ["CONFIG_A", "CONFIG_A_B"]  # the family stays together
    only_b = cf.with_bad(good, bad, ["CONFIG_A_B"])
    assert olddef(only_b).get("CONFIG_A_B") == "n"
    # the culprit is B (needs A): found as B with A already on at the good end
    answer, _, tried = _bisect(good, bad, lambda c: c.get("CONFIG_A_B") == "y", {"CONFIG_A_B": "CONFIG_A"})
    assert answer == {"CONFIG_A_B": ["n", "y"]}
    # and when the split would put B without A in a candidate, it is said
    good2 = _cfg(A="n", Z_B="n")
    bad2 = _cfg(A="y", Z_B="y")
    cand2 = cf.pick(good2, bad2, _olddef({"CONFIG_Z_B": "CONFIG_A"}))
    assert cand2 is not None and cand2.names == ["CONFIG_A"]  # {Z_B} alone gave back the good config: not tried
    assert tried and all(c.left_good and c.left_bad for c in tried)


def test_options_that_cannot_be_split_are_the_answer_as_a_set() -> None:
    """B depends on A and the lab breaks only with both: every part is the good or the bad config again or
    breaks... here the two differ only together (olddefconfig forces both), so no candidate lies between."""
    good = _cfg(A="n", B="n")
    bad = _cfg(A="y", B="y")

    def both(c: cf.Config) -> cf.Config:  # A and B are all or nothing (a select and a depends)
        on = c.get("CONFIG_A") == "y" and c.get("CONFIG_B") == "y"
        return cf.Config({"CONFIG_A": "y" if on else "n", "CONFIG_B": "y" if on else "n"}, "x86", "6.1")

    assert cf.pick(good, bad, both) is None
    text = cf.answer_text(cf.changes(cf.diff(good, bad), good, bad))
    assert text.startswith("these 2 changes together breaks the lab") and "CONFIG_A=n -> y" in text


def test_a_candidate_that_could_not_be_judged_is_not_picked_again() -> None:
    good = cf.Config({n: "m" for n in NAMES[:4]}, "x86", "6.1")
    bad = cf.Config({n: "n" for n in NAMES[:4]}, "x86", "6.1")
    same = _olddef({})
    first = cf.pick(good, bad, same)
    assert first is not None
    second = cf.pick(good, bad, same, {cf.render(first.config)})
    assert second is not None and second.names != first.names
    assert any("could not be judged" in t for t in second.tried)


def test_check_pair_refuses_what_is_not_for_the_tree() -> None:
    tree = cf.parse(HEAD + "CONFIG_A=y\n")
    ok = HEAD + "CONFIG_A=y\n"
    cf.check_pair(ok, HEAD + "CONFIG_A=m\n", tree, "6.1", ("g", "b"))
    with pytest.raises(UsageError, match="b: not a kernel .config"):
        cf.check_pair(ok, "hello\n", tree, "6.1", ("g", "b"))
    with pytest.raises(UsageError, match="g: a config for arm64, the tree's is for x86"):
        cf.check_pair(HEAD.replace("x86", "arm64") + "CONFIG_A=y\n", ok, tree, "6.1", ("g", "b"))
    with pytest.raises(UsageError, match="b: a config for Linux 5.10, the tree is 6.1"):
        cf.check_pair(ok, HEAD.replace("6.1.192", "5.10.3") + "CONFIG_A=m\n", tree, "6.1", ("g", "b"))
    with pytest.raises(UsageError, match="set the same options"):
        cf.check_pair(ok, "CONFIG_A=y\n# CONFIG_B is not set\n", tree, "6.1", ("g", "b"))
    assert cf.makefile_version("VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 0\n") == "6.1"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "linux"
    t.mkdir()
    (t / ".config").write_text(HEAD + "CONFIG_A=y\n")
    (t / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\n")
    (tmp_path / "good.config").write_text(HEAD + "CONFIG_A=y\n")
    (tmp_path / "bad.config").write_text(HEAD + "# CONFIG_A is not set\n")
    (tmp_path / "same.config").write_text(HEAD + "CONFIG_A=y\n")
    (tmp_path / "arm.config").write_text(HEAD.replace("x86", "arm64") + "CONFIG_A=m\n")
    return t


@pytest.mark.parametrize("extra", [
    ["--good-config", "good.config"],  # without --bad-config
    ["--bad-config", "bad.config"],
    ["--good-config", "good.config", "--bad-config", "bad.config", "--good", "HEAD", "--bad", "HEAD"],
    ["--good-config", "good.config", "--bad-config", "bad.config", "--fixed"],
    ["--good-config", "missing.config", "--bad-config", "bad.config"],
    ["--good-config", "good.config", "--bad-config", "same.config"],
    ["--good-config", "good.config", "--bad-config", "arm.config"],
    ["--commit", "HEAD", "--good", "HEAD", "--bad", "HEAD"],
])
def test_config_bisection_bad_input_exits_2_before_anything(tree: Path, tmp_path: Path, extra: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.cli.main import main

    monkeypatch.chdir(tmp_path)
    lab = Path(__file__).resolve().parents[2] / "labs" / "quickstart.yaml"
    argv = ["bisect", str(lab), "--tree", str(tree), "--panic", "--out", str(tmp_path / "out"), *extra]
    assert main(argv) == 2
    assert not (tmp_path / "out").exists()


def test_a_rebuilt_objtool_is_recognised_in_makes_output() -> None:
    """The progress line says why a step recompiles the kernel when kbuild links objtool again."""
    from labctl.bisect.worktree import objtool_relinked

    assert objtool_relinked("  LINK    /root/.cache/labctl/bisect/x/wt/tools/objtool/objtool")
    assert not objtool_relinked("  LINK    /x/wt/tools/objtool/fixdep")
    assert not objtool_relinked("  CC      /x/wt/tools/objtool/check.o")
    assert not objtool_relinked("  DESCEND objtool")


def test_a_config_that_would_run_or_embed_something_is_refused() -> None:
    """Issue 47, Medium 6: kconfig keeps ``$(shell ...)`` in a string option and the kernel's make runs
    it; ``CONFIG_INITRAMFS_SOURCE=/root`` would embed root's files in the kernel."""
    tree = cf.parse(HEAD + "CONFIG_A=y\n")
    ok = HEAD + "CONFIG_A=y\n"
    linux = PurePosixPath("/src/linux")
    for evil, why in [('CONFIG_LOCALVERSION="$(shell id > /tmp/pwned)"\n', "a value with '\\$\\(' \\(kconfig would run it\\)"),
                      ('CONFIG_INITRAMFS_SOURCE="/root"\n', "CONFIG_INITRAMFS_SOURCE names /root, outside the tree"),
                      ('CONFIG_INITRAMFS_SOURCE="usr/x ../../root"\n', "names ../../root, outside the tree")]:
        with pytest.raises(UsageError, match=f"b: .*{why}"):
            cf.check_pair(ok, HEAD + "CONFIG_A=m\n" + evil, tree, "6.1", ("g", "b"), linux)
    cf.check_pair(ok, HEAD + 'CONFIG_A=m\nCONFIG_INITRAMFS_SOURCE="usr/initramfs_data.cpio /src/linux/x"\n',
                  tree, "6.1", ("g", "b"), linux)


def test_another_users_config_is_refused(tmp_path: Path) -> None:
    """Issue 47, Medium 6: ``--good-config`` of another user (here: a file others may write, as
    another user's own would be refused for its owner) is never built."""
    import os

    from labctl.cli.bisect_cmd import _read_config

    cfg = tmp_path / "good.config"
    cfg.write_text(HEAD + "CONFIG_A=y\n")
    assert _read_config(cfg, "--good-config", []).startswith(b"#")
    cfg.chmod(0o666)
    with pytest.raises(UsageError, match=r"--good-config .* is not trusted .*other-writable"):
        _read_config(cfg, "--good-config", [])
    if os.geteuid() == 0:
        cfg.chmod(0o644)
        os.chown(cfg, 65534, 65534)
        with pytest.raises(UsageError, match=r"is owned by nobody \(uid 65534\)"):
            _read_config(cfg, "--good-config", [])
        assert _read_config(cfg, "--good-config", [str(tmp_path)])  # --trust-dir trusts it


def test_a_part_whose_candidate_makes_no_progress_is_passed_over() -> None:
    """Four options, olddefconfig (a stand-in) answering each part differently: {A, B} comes back as the good
    config, {C, D} as the bad one, {A} with B, C and a new X set (off the line between the ends), {B}
    as asked: only {B} makes progress, and what was passed over is said."""
    good = _cfg(A="n", B="n", C="n", D="n")
    bad = _cfg(A="y", B="y", C="y", D="y")

    def olddef(c: cf.Config) -> cf.Config:
        on = {k for k, v in c.values.items() if v == "y"}
        if on == {"CONFIG_A", "CONFIG_B"}:
            return good
        if on == {"CONFIG_C", "CONFIG_D"}:
            return bad
        if on == {"CONFIG_A"}:
            # as far from the good end as the bad end is (A, B, C and X), though nearer the bad one (D, X)
            return cf.Config({**c.values, "CONFIG_B": "y", "CONFIG_C": "y", "CONFIG_X": "y"}, c.arch, c.version)
        return c

    cand = cf.pick(good, bad, olddef)
    assert cand is not None and cand.names == ["CONFIG_B"] and (cand.left_good, cand.left_bad) == (1, 3)
    assert cand.tried == ["CONFIG_A, CONFIG_B: olddefconfig gave back the good config",
                          "CONFIG_C, CONFIG_D: olddefconfig gave the bad config",
                          "CONFIG_A: olddefconfig moved it off the line between the ends"]
    assert cf.pick(good, bad, lambda c: good if c != bad else bad) is None  # every part undone: no candidate


@pytest.mark.parametrize("culprit", NAMES)
def test_every_candidate_lies_strictly_between_the_ends(culprit: str) -> None:
    """With olddefconfig dropping options whose dependency is off, each candidate is nearer each end than
    the ends are to each other, and the bisection still ends at the culprit."""
    deps = {"CONFIG_NET_SCH_SFQ": "CONFIG_NET_SCH_PRIO", "CONFIG_E1000E": "CONFIG_E1000", "CONFIG_VETH": "CONFIG_DUMMY"}
    good = cf.Config({n: "n" for n in NAMES}, "x86", "6.1")
    bad = cf.Config({n: "y" for n in NAMES}, "x86", "6.1")
    olddef = _olddef(deps)
    lo, hi = olddef(good), olddef(bad)
    while len(cf.diff(lo, hi)) > 1:
        total = len(cf.diff(lo, hi))
        cand = cf.pick(lo, hi, olddef)
        if cand is None:
            break
        assert 0 < cand.left_good < total and 0 < cand.left_bad < total, cand
        assert cf.progress(lo, hi, cand.config) == (cand.left_good, cand.left_bad)
        if cand.config.get(culprit) == "y":
            hi = cand.config
        else:
            lo = cand.config
    assert cf.diff(lo, hi) == [culprit]
