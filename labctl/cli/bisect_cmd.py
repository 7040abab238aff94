"""``labctl bisect LAB.yaml --tree DIR --good REV --bad REV ORACLE``: the commit that changed the lab's outcome.

Also ``labctl bisect --continue [BUNDLE]`` (after Ctrl-C, a crash or a reboot) and
``labctl bisect --log [BUNDLE]`` (the steps so far). The work is in :mod:`labctl.bisect`.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path, PurePosixPath

from rich.table import Table
from rich.text import Text

from labctl.bisect import (
    BISECT_SUMMARY,
    ESTIMATE_RUNS,
    LOG_COLUMNS,
    MAX_TRIES,
    Bisector,
    Oracle,
    State,
    answer_text,
    bisect_summary,
    check_config_pair,
    checked_work,
    config_start_files,
    default_work,
    describe_oracle,
    is_ancestor,
    load,
    log_rows,
    make_oracle,
    makefile_version,
    on_tree,
    parse_config,
    resolve_rev,
    save,
    tree_guests,
    trust_lines,
    work_locked,
    write_bundle,
)
from labctl.cli.lifecycle_cmds import load_with_kernel
from labctl.cli.ui import PrepareDisplay, console, out, print_json
from labctl.errors import UsageError
from labctl.image import load_recipe
from labctl.lab import read_capped, untrusted_reason
from labctl.paths import atomic_write, cache_dir, checked_dir
from labctl.pipeline import prepare
from labctl.up import UpOptions

EXIT_UNRESOLVED = 6  # only skipped commits are left: the answer is one of several
EXIT_NOT_CONFIRMED = 7  # the answer is known, but the bad end with it reverted is not good


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bisect", help="find the commit of a kernel tree that changed a lab's outcome")
    p.add_argument("file", nargs="?", metavar="LAB.yaml")
    p.add_argument("--tree", type=Path, help="the kernel tree (a git repository, built, with its .config)")
    p.add_argument("--good", metavar="REV", help="a commit where the lab behaves (the old term)")
    p.add_argument("--bad", metavar="REV", help="a commit where it does not (the new term)")
    c = p.add_argument_group("config bisection (instead of --good/--bad)")
    c.add_argument("--good-config", type=Path, metavar="FILE",
                   help="a .config the lab behaves with: find the option whose change to --bad-config breaks it")
    c.add_argument("--bad-config", type=Path, metavar="FILE", help="a .config it does not behave with")
    c.add_argument("--commit", metavar="REV", help="the commit the configs are built at (default: the tree's HEAD)")
    o = p.add_argument_group("oracle (one)")
    o.add_argument("--check", metavar="NAME", help="the lab's graded check NAME passes")
    o.add_argument("--step", metavar="NAME", help="step NAME succeeds (exit status, no panic or oops, no timeout)")
    o.add_argument("--panic", action="store_true", help="no guest panics or oopses during the run")
    o.add_argument("--command", metavar="CMD", help="CMD exits 0 on a guest (--on GUEST) after the steps")
    o.add_argument("--drgn", metavar="EXPR",
                   help="EXPR is true on a guest's running kernel (--on GUEST) after the steps, read with drgn "
                        "(a lab file's drgn: check language)")
    o.add_argument("--on", metavar="GUEST", help="the guest of --command or --drgn (default: the lab's first)")
    o.add_argument("--figure", metavar="STEP.[VARIANT.]KEY", help="a figure of a step, over its repeat: runs")
    o.add_argument("--below", type=float, metavar="X", help="--figure: bad when below X")
    o.add_argument("--above", type=float, metavar="X", help="--figure: bad when above X")
    o.add_argument("--worse-than-good", type=float, metavar="PCT",
                   help="--figure: bad when worse than the good end's by more than PCT%% and beyond noise")
    t = p.add_argument_group("trust")
    t.add_argument("--tries", default="1", metavar="N|auto",
                   help="run the oracle up to N times a commit: bad when any try fails, good when all pass; auto: "
                        "N from the failing end's failure rate, for 95%% confidence (default 1)")
    t.add_argument("--estimate-runs", type=int, default=None, metavar="K",
                   help=f"--tries auto: run the failing end K times for its failure rate (default {ESTIMATE_RUNS})")
    t.add_argument("--no-confirm", action="store_true",
                   help="do not confirm the answer by reverting it on the bad end and running that")
    p.add_argument("--term-old", default=None, metavar="TERM", help="git bisect's old term (default: good)")
    p.add_argument("--term-new", default=None, metavar="TERM", help="git bisect's new term (default: bad)")
    p.add_argument("--fixed", action="store_true",
                   help="look for the commit that made the oracle pass (terms: broken/fixed unless given)")
    p.add_argument("--out", type=Path, default=None, help="the bisect bundle (default: runs/bisect-LAB-TIME)")
    p.add_argument("--work", type=Path, default=None,
                   help="where the worktree and build cache live (default: ~/.cache/labctl/bisect/<tree>)")
    p.add_argument("--jobs", type=int, default=None, help="make -j (default: the number of CPUs)")
    p.add_argument("--accel", choices=["auto", "kvm", "tcg"], default="auto")
    p.add_argument("--boot-timeout", type=float, default=180.0, metavar="SECONDS")
    p.add_argument("--trust-dir", action="append", default=[], metavar="DIR")
    p.add_argument("--continue", dest="cont", nargs="?", const="", default=None, metavar="BUNDLE",
                   help="go on with a bisection that was interrupted (default: the last one started)")
    p.add_argument("--log", nargs="?", const="", default=None, metavar="BUNDLE",
                   help="print a bisection's steps so far")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_bisect)


def _last_file() -> Path:
    return cache_dir() / "bisect" / "last"


def _bundle_arg(value: str) -> Path:
    if value:
        return Path(value)
    try:
        return Path(_last_file().read_text().strip())
    except OSError as exc:
        raise UsageError("no bisection was started here", hint="name its bundle: labctl bisect --continue DIR") from exc


def _oracle(args: argparse.Namespace) -> Oracle:
    chosen = [k for k, v in (("check", args.check), ("step", args.step), ("panic", args.panic or None),
                             ("command", args.command), ("drgn", args.drgn), ("figure", args.figure)) if v]
    if len(chosen) != 1:
        raise UsageError("give one oracle: --check NAME, --step NAME, --panic, --command CMD, --drgn EXPR or "
                         "--figure F --below X")
    kind = chosen[0]
    if kind != "figure" and any(v is not None for v in (args.below, args.above, args.worse_than_good)):
        raise UsageError("--below, --above and --worse-than-good go with --figure")
    kw: dict[str, object] = {"fixed": True} if args.fixed else {}
    if kind in ("check", "step"):
        kw["name"] = args.check or args.step
    elif kind in ("command", "drgn"):
        kw.update(command=args.command or args.drgn, guest=args.on)
    elif kind == "figure":
        kw.update(figure=args.figure, below=args.below, above=args.above, worse_than_good=args.worse_than_good)
    return make_oracle(kind, **kw)


def _tries(args: argparse.Namespace) -> tuple[int, int]:
    """--tries N|auto and --estimate-runs K: (N, K), N 0 for auto."""
    value = str(args.tries).strip().lower()
    if value == "auto":
        k = ESTIMATE_RUNS if args.estimate_runs is None else args.estimate_runs
        if not 1 <= k <= 100:
            raise UsageError(f"--estimate-runs {k}: give 1 to 100 runs")
        return 0, k
    if args.estimate_runs is not None:
        raise UsageError("--estimate-runs goes with --tries auto")
    if not value.isdigit() or not 1 <= int(value) <= MAX_TRIES * 5:
        raise UsageError(f"--tries {args.tries}: give a number of tries (1 to {MAX_TRIES * 5}) or 'auto'")
    return int(value), 0


def cmd_bisect(args: argparse.Namespace) -> int:
    if args.log is not None:
        bundle = _bundle_arg(args.log)
        state = load(bundle)
        return _show(bundle, state, args.json)
    if args.cont is not None:
        bundle = _bundle_arg(args.cont)
        state = load(bundle)
        if state.done and (state.confirmation or not state.confirm or not state.result.get("first")):
            return _show(bundle, state, args.json)
        return _go(bundle, state, args)
    return _go(*_start(args), args)


MAX_CONFIG = 16 << 20


def _config_mode(args: argparse.Namespace) -> bool:
    """Config bisection asked for (--good-config/--bad-config): both given, no commits."""
    if args.good_config is None and args.bad_config is None:
        if args.commit:
            raise UsageError("--commit goes with --good-config and --bad-config")
        return False
    if args.good_config is None or args.bad_config is None:
        raise UsageError("--good-config and --bad-config go together",
                         hint="labctl bisect LAB.yaml --tree DIR --good-config A --bad-config B ORACLE")
    if args.good or args.bad:
        raise UsageError("--good-config/--bad-config bisect two configs at one commit: give --commit REV, "
                         "not --good/--bad")
    if args.fixed:
        raise UsageError("--fixed goes with commits: to find the option that fixes the lab, give the config "
                         "that works as --good-config")
    return True


def _read_config(path: Path, flag: str, trusted: list[str]) -> bytes:
    """The config's bytes: yours or root's, as a lab file's kernel config (:mod:`labctl.lab.trust`;
    ``--trust-dir`` trusts others), read no further than :data:`MAX_CONFIG`.

    :raise UsageError: for another user's file, one writable by others, or one too large.
    """
    resolved = path.resolve()
    why = untrusted_reason(resolved, [Path(d).resolve() for d in trusted])
    if why is not None:
        raise UsageError(f"{flag} {path} is not trusted (its options decide what the kernel's make runs): {why}",
                         hint=f"pass --trust-dir {resolved.parent} if you trust it")
    try:
        data = read_capped(resolved, MAX_CONFIG)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_CONFIG:
        raise UsageError(f"{flag} {path}: over {MAX_CONFIG >> 20} MiB: not a kernel .config")
    return data


def _configs(args: argparse.Namespace, tree: Path) -> tuple[bytes, bytes]:
    """The two configs, checked against the tree (its architecture and version) and each other."""
    good = _read_config(args.good_config, "--good-config", args.trust_dir)
    bad = _read_config(args.bad_config, "--bad-config", args.trust_dir)
    tree_cfg = parse_config((tree / ".config").read_text(errors="replace"))
    version = makefile_version((tree / "Makefile").read_text(errors="replace"))
    check_config_pair(good.decode(errors="replace"), bad.decode(errors="replace"), tree_cfg, version,
                      (f"--good-config {args.good_config}", f"--bad-config {args.bad_config}"),
                      PurePosixPath(tree))
    return good, bad


def _start(args: argparse.Namespace) -> tuple[Path, State]:
    config_mode = _config_mode(args)
    if not args.file or args.tree is None or not (config_mode or (args.good and args.bad)):
        raise UsageError("labctl bisect LAB.yaml --tree DIR --good REV --bad REV ORACLE",
                         hint="or: --good-config FILE --bad-config FILE [--commit REV] instead of --good/--bad; "
                              "labctl bisect --continue [BUNDLE] / --log [BUNDLE]")
    oracle = _oracle(args)
    tries, estimate_runs = _tries(args)
    tree = args.tree.resolve()
    if not (tree / ".config").is_file() or not (tree / "Makefile").is_file():
        raise UsageError(f"--tree {args.tree}: not a configured kernel tree (no .config)",
                         hint="configure and build it once: make olddefconfig && make vmlinux modules")
    texts: tuple[bytes, bytes] | None = None
    if config_mode:
        texts = _configs(args, tree)
        good = bad = resolve_rev(tree, args.commit or "HEAD")
    else:
        good, bad = resolve_rev(tree, args.good), resolve_rev(tree, args.bad)
        if good == bad or not is_ancestor(tree, good, bad):
            raise UsageError(f"--good {args.good} must be an ancestor of --bad {args.bad}")
    lab = load_with_kernel(args.file, None, args.trust_dir)
    if oracle.kind == "check" and oracle.name not in {c.name for c in lab.checks}:
        raise UsageError(f"the lab has no check '{oracle.name}'")
    if oracle.kind == "step" and oracle.name not in {s.name for s in lab.steps}:
        raise UsageError(f"the lab has no step '{oracle.name}'")
    if oracle.kind in ("command", "drgn") and oracle.guest and oracle.guest not in lab.guests:
        raise UsageError(f"--on {oracle.guest}: the lab has no such guest")
    term_old = args.term_old or ("broken" if args.fixed else "good")
    term_new = args.term_new or ("fixed" if args.fixed else "bad")
    if term_old == term_new or {term_old, term_new} & {"skip"}:
        raise UsageError("--term-old and --term-new must differ, and neither be 'skip'")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    bundle = (args.out or Path("runs") / f"bisect-{lab.name}-{stamp}").resolve()
    if (bundle / "state.json").exists():
        raise UsageError(f"{bundle} already holds a bisection", hint=f"go on with it: labctl bisect --continue {bundle}")
    work = checked_work((args.work or default_work(tree)).resolve())
    bundle = checked_dir(bundle, create=True)
    state = State(lab_file=str(Path(args.file).resolve()), tree=str(tree), good=good, bad=bad, oracle=oracle.to_dict(),
                  term_old=term_old, term_new=term_new, work=str(work), tries=tries, estimate_runs=estimate_runs,
                  confirm=not args.no_confirm and texts is None,
                  up={"accel": args.accel, "boot_timeout": args.boot_timeout, "jobs": args.jobs},
                  trust_dirs=[str(Path(d).resolve()) for d in args.trust_dir])
    if texts is not None:
        state.configs = {**config_start_files(bundle, *texts), "given_good": str(args.good_config.resolve()),
                         "given_bad": str(args.bad_config.resolve())}
    save(bundle, state)
    return bundle, state


def _go(bundle: Path, state: State, args: argparse.Namespace) -> int:
    work = checked_work(Path(state.work))
    lab = load_with_kernel(state.lab_file, None, args.trust_dir)  # never the state's: it cannot widen trust
    _last_file().parent.mkdir(parents=True, exist_ok=True)
    atomic_write(_last_file(), str(bundle) + "\n")
    # the front once: capacity, the image, and the lab checked against the tree's .config (every
    # commit is built with it); each commit's kernel is prepared when it is built
    tree = Path(state.tree)
    image = prepare(on_tree(lab, tree, tree), PrepareDisplay(), kernels=False).image
    recipe = load_recipe(image.name)
    opts = UpOptions(accel=str(state.up.get("accel") or "auto"),
                     boot_timeout=float(state.up.get("boot_timeout") or 180.0),
                     snapshots=state.tries != 1)  # tries after the first restore the lab, not boot it

    def say(line: str) -> None:
        console.print(Text(f"bisect: {line}", style="dim" if line.startswith("  ") else ""), soft_wrap=True)

    def build_line(line: str) -> None:
        s = line.strip()
        if s.startswith(("CC", "LD", "AR", "MODPOST")) or ": error:" in s:
            console.print(Text(f"    {s}", style="dim"), soft_wrap=True)

    ends = (f"at {state.good[:12]}, {state.term_old} config {state.configs.get('given_good')}, {state.term_new} "
            f"config {state.configs.get('given_bad')}" if state.configs else
            f"{state.term_old} {state.good[:12]}, {state.term_new} {state.bad[:12]}")
    say(f"{Path(state.lab_file).name}: guests {', '.join(tree_guests(lab, tree))} boot {tree}; {ends}; "
        f"oracle: {describe_oracle(Oracle.from_dict(state.oracle))}")
    say(f"bundle {bundle}")
    jobs = state.up.get("jobs") or args.jobs or os.cpu_count()
    with work_locked(work):
        bis = Bisector(bundle, state, lab, image, recipe, opts, say, build_line, int(jobs or 1))
        try:
            bis.run()
        except KeyboardInterrupt:
            save(bundle, state)
            write_bundle(bundle, state)
            console.print(Text(f"bisect: interrupted; go on with: labctl bisect --continue {bundle}"))
            raise
        finally:
            save(bundle, state)
        write_bundle(bundle, state)
    return _show(bundle, state, args.json)


def _show(bundle: Path, state: State, as_json: bool) -> int:
    if state.done and not (bundle / BISECT_SUMMARY).is_file():
        write_bundle(bundle, state)
    if as_json:
        print_json({"bundle": str(bundle), **bisect_summary(state, bundle)})
    else:
        t = Table(title=Text(f"bisect {Path(state.lab_file).name}: {describe_oracle(Oracle.from_dict(state.oracle))}"),
                  title_justify="left")
        for col in LOG_COLUMNS:
            t.add_column(col)
        for row in log_rows(state):
            t.add_row(*(Text(c) for c in row))
        out.print(t)
        out.print(Text(answer_text(state), style="bold"), soft_wrap=True)
        for line in trust_lines(state):
            out.print(Text(line), soft_wrap=True)
        if state.done:
            out.print(Text(f"bundle: {bundle}"), soft_wrap=True)
    if not state.done:
        return 0
    if state.configs:
        return 0 if len(state.result.get("options") or {}) == 1 else EXIT_UNRESOLVED
    if not state.result.get("first"):
        return EXIT_UNRESOLVED
    return EXIT_NOT_CONFIRMED if state.confirmation.get("status") == "not confirmed" else 0
