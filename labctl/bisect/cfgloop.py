"""Config bisection's loop: one commit, a good and a bad ``.config``; the option whose change breaks the lab.

The ends are first put through ``make olddefconfig`` at the commit (``configs/good.config`` and
``configs/bad.config`` in the bundle, beside the files as given): what it changed of the options that
differ is said, and ends it makes the same are an error. Then each step picks a candidate
(:func:`labctl.bisect.configs.pick`: half of the differences set to the bad values, through olddefconfig),
writes it as ``configs/NN.config``, builds it in the worktree (incremental: only what its options
touch), runs the lab on it (``--tries`` as for commits) and moves the good or the bad end to it. A
candidate that cannot be judged (it does not build, the lab does not come up) is not tried again; the
next part of the differences is. The state holds the ends' files, so ``--continue`` goes on at the
step that was running.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

import labctl.bisect.bundlepages as bundlepages  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.bisect.configs as cf
from labctl.bisect.statefile import NEW, OLD, SKIP, ConfigsRecord, State, Step, save
from labctl.bisect.worktree import Worktree
from labctl.errors import UsageError
from labctl.paths import atomic_write

DIR = "configs"
GIVEN = {"good": f"{DIR}/good-given.config", "bad": f"{DIR}/bad-given.config"}
ENDS = {"good": f"{DIR}/good.config", "bad": f"{DIR}/bad.config"}
MAX_NOTED = 20  # options olddefconfig changed of a given end, listed at most


class Bisector(Protocol):
    """What the loop needs of the bisection (:class:`labctl.bisect.engine.Bisector`)."""

    bundle: Path
    state: State
    wt: Worktree
    say: Callable[[str], None]

    def prelude(self) -> None: ...

    def one_step(self, step: Step, config: bytes | None = None) -> None: ...

    def times_text(self, t: dict[str, float]) -> str: ...


def fingerprint(cfg: cf.Config) -> str:
    return hashlib.sha256(cf.render(cfg).encode()).hexdigest()[:16]


def end_bytes(bundle: Path, state: State, which: Literal["good", "bad"]) -> bytes:
    """The current good or bad end's ``.config`` (after olddefconfig)."""
    return (bundle / str(state.configs[which])).read_bytes()


def _end(bis: Bisector, which: Literal["good", "bad"]) -> cf.Config:
    return cf.parse(end_bytes(bis.bundle, bis.state, which).decode(errors="replace"))


def run(bis: Bisector) -> State:
    """Step until one option (or a set no candidate splits) is left; the state saved after every step."""
    st = bis.state
    bis.wt.ensure(st.good, bis.say)
    bis.wt.checkout(st.good)
    if not st.configs.get("resolved"):
        _resolve_ends(bis)
    bis.prelude()
    while not st.done:
        good, bad = _end(bis, "good"), _end(bis, "bad")
        names = cf.diff(good, bad)
        if len(names) <= 1:
            _finish(bis, cf.changes(names, good, bad), "")
            break
        pending = [s for s in st.steps if not s.verdict]
        step = pending[0] if pending else _new_step(bis, good, bad, names)
        if step is None:
            break
        bis.say(f"step {step.n}: {step.subject}  ({len(names)} options differ, about "
                f"{max(1, math.ceil(math.log2(len(names))))} steps left)")
        save(bis.bundle, st)
        raw = (bis.bundle / str(step.options["file"])).read_bytes()
        bis.one_step(step, config=raw)
        _move(st, step, raw)
        save(bis.bundle, st)
        bundlepages.write(bis.bundle, st)
        bis.say(f"step {step.n}: the candidate is {st.term(step.verdict)}: {step.reason}  "
                f"[{bis.times_text(step.times)}]")
    return st


def _resolve_ends(bis: Bisector) -> None:
    """The given configs through olddefconfig at the commit; what it changed of the options that differ."""
    st = bis.state
    given = {w: cf.parse((bis.bundle / GIVEN[w]).read_text(errors="replace")) for w in ("good", "bad")}
    wanted = cf.diff(given["good"], given["bad"])
    changed: dict[str, dict[str, list[str]]] = {}
    for which in ("good", "bad"):
        bis.say(f"the {which} config through make olddefconfig at {st.good[:12]}")
        raw = bis.wt.olddefconfig((bis.bundle / GIVEN[which]).read_bytes())
        atomic_write(bis.bundle / ENDS[which], raw)
        got = cf.parse(raw.decode(errors="replace"))
        changed[which] = {n: [given[which].get(n), got.get(n)] for n in wanted if got.get(n) != given[which].get(n)}
        if changed[which]:
            shown = ", ".join(f"{n}={v[0]} -> {v[1]}" for n, v in list(changed[which].items())[:MAX_NOTED])
            bis.say(f"  olddefconfig changed {len(changed[which])} of the differing options of the {which} config: "
                    f"{shown}")
    st.configs["good"], st.configs["bad"] = ENDS["good"], ENDS["bad"]
    st.configs["olddefconfig"] = changed
    left = cf.diff(_end(bis, "good"), _end(bis, "bad"))
    st.configs["differ"] = len(left)
    if not left:
        raise UsageError(f"after make olddefconfig at {st.good[:12]} the two configs are the same: the "
                         f"{len(wanted)} options they differ by are not this tree's to set",
                         hint="compare them with scripts/diffconfig; give configs of this tree and architecture")
    st.configs["resolved"] = True
    save(bis.bundle, st)
    bis.say(f"{len(left)} options differ: {', '.join(left[:MAX_NOTED])}{' ...' if len(left) > MAX_NOTED else ''}")


def _new_step(bis: Bisector, good: cf.Config, bad: cf.Config, names: list[str]) -> Step | None:
    """The next candidate as a step (its config written to the bundle); None when none splits the difference
    (the bisection is then done)."""
    st = bis.state
    raws: dict[str, bytes] = {}

    def olddef(cfg: cf.Config) -> cf.Config:
        raw = bis.wt.olddefconfig(cf.render(cfg).encode())
        got = cf.parse(raw.decode(errors="replace"))
        raws[fingerprint(got)] = raw
        return got

    bis.say(f"choosing a candidate between the ends ({len(names)} options differ; make olddefconfig)")
    cand = cf.pick(good, bad, olddef, set(st.configs.get("unusable") or []), fingerprint)
    if cand is None:
        _finish(bis, cf.changes(names, good, bad), "no candidate between the ends could be made or judged")
        return None
    for why in cand.tried:
        bis.say(f"  not tried: {why}")
    n = len(st.steps) + 1
    file = f"{DIR}/{n:02d}.config"
    atomic_write(bis.bundle / file, raws[fingerprint(cand.config)])
    step = Step(n=n, commit=st.good, subject=cf.describe(cand, good, bad),
                options={"file": file, "set": cf.changes(cand.names, good, bad), "missing": cand.missing,
                         "left": [cand.left_good, cand.left_bad], "not_tried": cand.tried,
                         "fingerprint": fingerprint(cand.config)})
    st.steps.append(step)
    return step


def _move(st: State, step: Step, raw: bytes) -> None:
    """The step's verdict moves an end to its candidate (or marks the candidate as not to be tried again)."""
    if step.verdict == OLD:
        st.configs["good"] = step.options["file"]
    elif step.verdict == NEW:
        st.configs["bad"] = step.options["file"]
    elif step.verdict == SKIP:
        unusable = list(st.configs.get("unusable") or [])
        unusable.append(fingerprint(cf.parse(raw.decode(errors="replace"))))
        st.configs["unusable"] = unusable


def _finish(bis: Bisector, opts: dict[str, list[str]], why: str) -> None:
    st = bis.state
    st.done = True
    st.result = {"options": opts, "text": cf.answer_text(opts, st.term_new)}
    if why:
        st.result["why"] = why
    save(bis.bundle, st)
    bis.say(st.result["text"])


def start_files(bundle: Path, good: bytes, bad: bytes) -> ConfigsRecord:
    """The given configs copied into the bundle (the state's ``configs`` before the ends are resolved)."""
    (bundle / DIR).mkdir(parents=True, exist_ok=True)
    atomic_write(bundle / GIVEN["good"], good)
    atomic_write(bundle / GIVEN["bad"], bad)
    return {"given": dict(GIVEN)}

