"""``labctl drgn`` (drgn on a guest's running kernel, or on a vmcore) and ``labctl dump`` (a vmcore).

The library is :mod:`labctl.inspect`; this module parses, prints and picks exit statuses.
``-c CODE`` and ``SCRIPT [ARGS]`` exit with the code's status; labctl's options come
before SCRIPT (every word after it is the script's).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from rich.text import Text

from labctl.cli.ui import console, out, print_json, safe, warn
from labctl.errors import UsageError
from labctl.inspect import (
    FORMATS,
    KernelView,
    Outcome,
    format_summary,
    interactive,
    open_core,
    open_live,
    paused,
    run_code,
    run_script,
    summarize,
    take_guest_vmcore,
)
from labctl.state import LabState

DRGN_USAGE = ("labctl drgn [OPTIONS] {LAB[@INSTANCE] GUEST | --core FILE [--vmlinux PATH] [--modules DIR]} "
              "[-c CODE | SCRIPT [ARGS...]]")


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", dest="code", metavar="CODE", help="run this Python code (drgn's globals, prog) and exit "
                                                            "with its status")
    p.add_argument("--pause", action="store_true",
                   help="stop the guest while the code runs (a consistent view); it is always resumed after")
    p.add_argument("--core", type=Path, metavar="FILE", help="a vmcore (labctl dump's) instead of a running guest")
    p.add_argument("--vmlinux", type=Path, metavar="PATH",
                   help="with --core: the kernel's vmlinux with debug info (default: the kernel labctl "
                        "prepared with the vmcore's build ID)")
    p.add_argument("--modules", type=Path, metavar="DIR", help="with --core: a directory of the modules' .ko files")
    p.add_argument("--summary", action="store_true",
                   help="print the kernel's summary: each CPU's (or the crashing) task's stack with its locals, "
                        "the network devices, the kernel log")
    p.add_argument("--nic", action="append", metavar="NAME", help="with --summary: only this network device")
    p.add_argument("--json", action="store_true",
                   help="with --summary, or alone: print it (alone: the kernel and its debug info) as JSON")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("drgn", help="drgn on a guest's running kernel (or a vmcore), with its debug info",
                       usage=DRGN_USAGE,
                       description="drgn's shell (or -c CODE, or SCRIPT [ARGS]) with 'prog' on the guest's running "
                                   "kernel, its memory read from its QEMU while the guest keeps running (--pause "
                                   "stops it meanwhile), with the debug info of its kernel and loaded modules. "
                                   "--core FILE opens a vmcore instead.")
    _options(d)
    d.add_argument("words", nargs=argparse.REMAINDER, metavar="...", help=argparse.SUPPRESS)
    d.set_defaults(func=cmd_drgn)

    p = sub.add_parser("dump", help="a vmcore of a guest (drgn and crash open it)",
                       description="Write a vmcore of the guest's memory (QMP dump-guest-memory; QEMU pauses the "
                                   "guest while it writes) to FILE, mode 0600, complete or not at all. kdump: "
                                   "compressed, zero pages left out; elf: the size of the guest's RAM.")
    p.add_argument("lab", metavar="LAB[@INSTANCE]")
    p.add_argument("guest")
    p.add_argument("-o", "--output", type=Path, metavar="FILE",
                   help="where to write it (default: LAB-GUEST-TIME.vmcore here)")
    p.add_argument("--format", choices=sorted(FORMATS), default="kdump", help="kdump (default) or elf")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds QEMU may take (default 600)")
    p.add_argument("--json", action="store_true", help="print where it went, its size and times as JSON")
    p.set_defaults(func=cmd_dump)


def _rest_parser() -> argparse.ArgumentParser:
    """labctl's options between the guest and SCRIPT, then SCRIPT and its words."""
    p = argparse.ArgumentParser(prog="labctl drgn", usage=DRGN_USAGE, add_help=False)
    _options(p)
    p.add_argument("script", nargs=argparse.REMAINDER)
    return p


def _parse(args: argparse.Namespace) -> tuple[str | None, str | None, list[str]]:
    """LAB, GUEST and SCRIPT with its words, from the words after drgn's options."""
    words = list(args.words)
    target: list[str] = []
    if args.core is None:
        target, words = words[:2], words[2:]
        if len(target) < 2:
            raise UsageError("labctl drgn needs LAB GUEST (or --core FILE)", hint=f"usage: {DRGN_USAGE}")
    _rest_parser().parse_args(words, namespace=args)
    script = list(args.script)
    if args.core is not None and (args.vmlinux is None and args.modules is not None):
        raise UsageError("--modules goes with --vmlinux")
    if args.core is None and (args.vmlinux or args.modules):
        raise UsageError("--vmlinux and --modules go with --core (a running guest's kernel is known)")
    if args.code is not None and script:
        raise UsageError("give -c CODE or SCRIPT, not both")
    if args.summary and (args.code is not None or script):
        raise UsageError("--summary prints the summary; give it without code")
    if args.nic and not args.summary:
        raise UsageError("--nic goes with --summary")
    if args.json and (args.code is not None or script):
        raise UsageError("--json goes with --summary or alone, not with code")
    if args.pause and args.core is not None:
        raise UsageError("--pause is for a running guest, not a vmcore")
    return (target[0] if target else None), (target[1] if target else None), script


def cmd_drgn(args: argparse.Namespace) -> int:
    lab, guest, script = _parse(args)
    if args.core is not None:
        with open_core(args.core, args.vmlinux, args.modules) as k:
            return _use(k, args, script)
    state = LabState.load(str(lab))
    with open_live(state, str(guest)) as k:
        return _use(k, args, script)


def _use(k: KernelView, args: argparse.Namespace, script: list[str]) -> int:
    if args.json and not args.summary and args.code is None and not script:
        print_json(k.facts())
        return 0
    if not args.pause:
        return _summary(k, args) if args.summary else _run(k, args, script)
    assert k.target is not None
    with paused(k.target) as pause:
        status = _summary(k, args) if args.summary else _run(k, args, script)
    if pause.already:
        warn(f"guest {k.target.guest} was paused already (gdb?): left paused")
    elif pause.seconds is not None:
        console.print(Text(f"labctl: guest {k.target.guest} was paused for {pause.seconds:.2f} s"))
    return status


def _run(k: KernelView, args: argparse.Namespace, script: list[str]) -> int:
    if args.code is not None:
        return _report(run_code(k.prog, args.code))
    if script:
        return _report(run_script(k.prog, Path(script[0]), script[1:]))
    return _shell(k, args.pause)


def _report(outcome: Outcome) -> int:
    if outcome.traceback:
        console.print(safe(outcome.traceback.rstrip("\n")), soft_wrap=True)
    if outcome.message:
        console.print(safe(outcome.message))
    return outcome.status


def _shell(k: KernelView, pause: bool) -> int:
    how = "paused while this shell is open" if pause else "it keeps running; reads are as consistent as /proc/kcore's"
    where = f"{k.where}, kernel {k.release}" + (f" ({how})" if k.live else "")
    mods = f"debug info: kernel and {len(k.debug.modules)} modules"
    if k.debug.missing:
        mods += f" ({len(k.debug.missing)} loaded modules have none: {', '.join(k.debug.missing[:8])}" + \
                (", ..." if len(k.debug.missing) > 8 else "") + ")"
    return interactive(k.prog, f"labctl: drgn on {where}\nlabctl: {mods}")


def _summary(k: KernelView, args: argparse.Namespace) -> int:
    summary = summarize(k.prog, args.nic)
    if args.json:
        print_json({"where": k.where, "release": k.release, **summary})
    else:
        out.print(safe(format_summary(summary)), soft_wrap=True)
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    state = LabState.load(args.lab)
    dest = args.output or Path(f"{args.lab}-{args.guest}-{datetime.datetime.now():%Y%m%dT%H%M%S}.vmcore")
    with console.status(Text(f"dumping guest {args.guest}'s memory (QEMU pauses it meanwhile)")):
        core = take_guest_vmcore(state, args.guest, dest, args.format, args.timeout)
    if args.json:
        print_json(core.to_dict())
    else:
        out.print(Text(f"{core.path}: {core.format} vmcore of guest {args.guest} ({core.release or 'kernel ?'}), "
                       f"{core.size / (1 << 20):.1f} MiB in {core.seconds:.1f} s, "
                       f"the guest paused {core.paused_seconds:.1f} s"))
    return 0
