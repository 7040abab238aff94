"""``labctl up`` (``down``: :mod:`.down_cmd`; ``status``, which up prints when a lab is up: :mod:`.status_cmd`)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from labctl.backends import BACKENDS
from labctl.cli.status_cmd import network_lines, print_lab, status_data
from labctl.cli.ui import PrepareDisplay, UpDisplay, console, out, print_json
from labctl.cli.validate_cmd import add_trust_dir
from labctl.errors import UsageError
from labctl.lab import Lab, env_trusted, kernel_from_command_line, load_lab
from labctl.lab import parse_option as parse_share_option
from labctl.pack import is_git_url, is_pack, is_url
from labctl.pipeline import Prepared, prepare, run_lab
from labctl.state import LabState
from labctl.up import UpOptions, dry_run, up

if TYPE_CHECKING:
    from labctl.pack import Checkout, Pinned

FILE_HELP = ("a lab file or a packed file (labctl pack), or either from an http(s) URL or a git repository: "
             "git+https://HOST/REPO.git[@REV]#PATH")

#: The switches of ``up`` that ``run`` shares, in their --help order.
UP_SWITCHES = (
    ("--cold", "boot every guest, even where a post-boot snapshot would restore it (warm start)"),
    ("--save-state", "libvirt: save each guest's post-boot state on its host, for reset (class up always does)"),
    ("--no-drops", "steps do not record the packets each guest's kernel drops (as drops: false in the lab file)"),
    ("--overcommit", "start even when the guests may need more memory than the host has available"),
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("up", help="boot a lab's guests and wait until they answer SSH")
    p.add_argument("file", help=FILE_HELP)
    add_up_arguments(p)
    p.add_argument("--show-command", action="store_true", help="print each guest's QEMU command once it is up")
    p.add_argument("--dry-run", action="store_true",
                   help="print each guest's QEMU command and start nothing (the image and kernels are "
                        "prepared if needed)")
    p.add_argument("--json", action="store_true", help="print the lab's status as JSON when up")
    p.add_argument("--no-steps", action="store_true", help="do not run the lab's steps")
    p.add_argument("--out", default="runs", help="where the steps' report bundle goes (default: ./runs)")
    p.add_argument("--instances", type=int, metavar="N",
                   help="bring up N copies of the lab side by side, LAB@1 ... LAB@N")
    p.set_defaults(func=cmd_up)


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``up`` that ``run`` shares."""
    p.add_argument("--accel", choices=["auto", "kvm", "tcg"], default="auto",
                   help="accelerator (auto: KVM if a probe boot works, else TCG)")
    p.add_argument("--backend", choices=list(BACKENDS), help="override the lab's backend")
    p.add_argument("--boot-timeout", type=float, default=180.0, metavar="SECONDS")
    add_remote_arguments(p)
    p.add_argument("--kernel", metavar="SPEC",
                   help="boot every guest on this kernel: debian:ABI-FLAVOUR, tree:PATH, image:PATH (or a path)")
    p.add_argument("--instance", metavar="NAME",
                   help="one of several copies of the lab on this host, addressed as LAB@NAME")
    for flag, text in UP_SWITCHES:
        p.add_argument(flag, action="store_true", help=text)
    add_trust_dir(p)
    p.add_argument("--share", action="append", default=[], metavar="GUEST:HOST:MOUNT[:rw]",
                   help="share a host directory into a guest (read-only unless :rw), as the lab file's "
                        "shares: (repeatable)")


def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``up`` and ``class up`` for a lab's remote libvirt hosts."""
    p.add_argument("--no-verify-host-keys", action="store_true",
                   help="do not check the SSH host keys of the lab's remote libvirt hosts")
    p.add_argument("--unencrypted-links", action="store_true",
                   help="accept links across hosts as plain UDP tunnels (neither encrypted nor authenticated)")


def load_with_kernel(file: str, kernel: str | None, trusted: Sequence[str] = ()) -> Lab:
    """The lab file, with ``--kernel`` for every guest when given; ``trusted``: ``--trust-dir``.

    :raise LabFileError: for a bad lab file (a kernel path another user could change, outside
        ``trusted``, too). :raise UsageError: for a bad ``--kernel``.
    """
    lab = load_lab(file, trusted)
    if kernel:
        try:
            lab = lab.with_kernel(kernel_from_command_line(kernel, Path.cwd()))
        except ValueError as exc:
            raise UsageError(f"--kernel: {exc}") from exc
    return lab


def load_for_up(args: argparse.Namespace) -> Lab:
    """The lab file, with ``--kernel`` and ``--instance`` applied.

    :raise LabFileError: for a bad lab file. :raise UsageError: for a bad option.
    """
    lab = load_with_kernel(args.file, args.kernel, args.trust_dir)
    trusted = (*(Path(d).absolute() for d in args.trust_dir), *env_trusted())
    for text in getattr(args, "share", []):
        try:
            guest, share = parse_share_option(text, Path.cwd(), trusted)
            lab = lab.with_share(guest, share)
        except ValueError as exc:
            raise UsageError(str(exc) if str(exc).startswith("--share") else f"--share {text}: {exc}") from exc
    if getattr(args, "no_drops", False):
        lab = dataclasses.replace(lab, drops=False)
    try:
        return lab.with_instance(args.instance)
    except ValueError as exc:
        raise UsageError(f"--instance: {exc}") from exc


def load_source(args: argparse.Namespace) -> tuple[Lab, Pinned | None]:
    """``FILE`` of up and run: a lab file, a packed file (its lab on its own kernels and image), or
    either from an http(s) URL or a git repository (``git+https://HOST/REPO.git[@REV]#PATH``),
    shown before anything runs.

    :raise LabFileError: for a bad lab file. :raise UsageError: for a bad option, a refused pack or URL.
    """
    url, git = is_url(args.file), is_git_url(args.file)
    if not url and not git and not is_pack(args.file):
        return load_for_up(args), None
    from labctl.pack import fetch_git, fetch_url, git_lab, open_pack, parse_git_url, url_lab

    checkout = None
    if git:
        with PrepareDisplay().slow(f"fetching {args.file}"):
            checkout = fetch_git(parse_git_url(args.file))
    path = checkout.file if checkout else fetch_url(args.file) if url else Path(args.file)
    label = checkout.label if checkout else args.file
    pinned = None
    if is_pack(path):
        if args.kernel or getattr(args, "share", []):
            raise UsageError(f"{args.file}: a packed lab boots its own kernels and shares no host directory",
                             hint="leave out --kernel and --share")
        with PrepareDisplay().slow(f"opening {label}") as rep:
            opened = open_pack(path, label, rep)
        lab, pinned = opened.lab(), opened.pinned
        if checkout:
            lab = dataclasses.replace(lab, source=label)
    else:
        lab = load_with_kernel_spec(git_lab(checkout) if checkout else url_lab(path, args.file), args.kernel)
    if url or checkout:
        show_source(label, lab, pinned, checkout)
    try:
        return lab.with_instance(args.instance), pinned
    except ValueError as exc:
        raise UsageError(f"--instance: {exc}") from exc


def load_with_kernel_spec(lab: Lab, kernel: str | None) -> Lab:
    try:
        return lab.with_kernel(kernel_from_command_line(kernel, Path.cwd())) if kernel else lab
    except ValueError as exc:
        raise UsageError(f"--kernel: {exc}") from exc


def show_source(url: str, lab: Lab, pinned: Pinned | None, checkout: Checkout | None = None) -> None:
    """What a lab from a URL will run: its lab file as written, each guest's kernel and the image."""
    console.print(Text.assemble(("from ", "bold"), url, (": lab ", "bold"), lab.name), soft_wrap=True)
    if checkout is not None:
        console.print(Text(f"commit {checkout.commit} of {checkout.source.repo}, file {checkout.source.path}"),
                      soft_wrap=True)
    console.print(Text(lab.text.rstrip()), soft_wrap=True)
    for g in lab.guests:
        spec = lab.kernel_of(g)
        rec = pinned.index.guests.get(g, {}) if pinned else {}
        console.print(Text(f"guest {g}: kernel {spec.describe() if spec else 'the image default'}"
                           + (f" (release {rec.get('release')}, build id {rec.get('build_id')})" if rec else "")),
                      soft_wrap=True)
    if pinned is not None:
        img = pinned.index.image
        console.print(Text(f"image {img.get('name')} ({'packed' if pinned.index.has_image else 'built here'}, "
                           f"sha256 {str(img.get('rootfs_sha256'))[:16]})"), soft_wrap=True)


def up_options(args: argparse.Namespace) -> UpOptions:
    return UpOptions(accel=args.accel, backend=args.backend, boot_timeout=args.boot_timeout,
                     no_verify_host_keys=args.no_verify_host_keys, unencrypted_links=args.unencrypted_links,
                     cold=args.cold, saved_states=args.save_state)


def instances(args: argparse.Namespace, lab: Lab) -> list[Lab]:
    """The copies of the lab to bring up: ``--instances N`` gives LAB@1 ... LAB@N.

    :raise UsageError: for a bad count, or both options.
    """
    n = getattr(args, "instances", None)
    if n is None:
        return [lab]
    if args.instance:
        raise UsageError("--instance and --instances cannot be combined")
    if not 1 <= n <= MAX_INSTANCES:
        raise UsageError(f"--instances {n}: give 1 to {MAX_INSTANCES}")
    return [lab.with_instance(str(i)) for i in range(1, n + 1)]


MAX_INSTANCES = 64


def cmd_up(args: argparse.Namespace) -> int:
    lab, pinned = load_source(args)
    copies = instances(args, lab)
    prepared = prepare(lab, PrepareDisplay(), copies=copies, overcommit=args.overcommit or args.dry_run,
                       pinned=pinned)
    if args.dry_run:
        return _dry_run(args, copies, prepared)
    if len(copies) == 1:
        return _up_one(args, copies[0], prepared)
    statuses = []
    for copy in copies:
        rc = _up_one(args, copy, prepared, quiet_json=True)
        if rc:
            return rc
        statuses.append(status_data(LabState.load(copy.ident)))
    if args.json:
        print_json({"labs": statuses})
    return 0


def _dry_run(args: argparse.Namespace, copies: Sequence[Lab], prepared: Prepared) -> int:
    """``up --dry-run``: every guest's command line, before (and instead of) starting anything."""
    rows = []
    for copy in copies:
        for g in dry_run(copy, prepared.image, prepared.kernels, up_options(args)):
            rows.append({"lab": copy.ident, "guest": g.name, "from": "snapshot" if g.warm else "boot",
                         "command": g.command})
    if args.json:
        print_json({"guests": rows, "capacity": prepared.capacity.sentence() if prepared.capacity else None,
                    "fits": prepared.capacity.fits if prepared.capacity else None})
        return 0
    for r in rows:
        out.print(Text(f"# {r['lab']} {r['guest']} ({'restored from its post-boot snapshot' if r['from'] == 'snapshot' else 'boots'})",
                           style="dim"), soft_wrap=True)
        out.print(Text(shlex.join(r["command"])), soft_wrap=True)
    if prepared.capacity is not None and not prepared.capacity.fits:
        out.print(Text(f"# up would refuse: {prepared.capacity.sentence()}", style="yellow"), soft_wrap=True)
    return 0


def _up_one(args: argparse.Namespace, lab: Lab, prepared: Prepared, quiet_json: bool = False) -> int:
    display = UpDisplay(lab.ident, list(lab.guests))

    def show(state: LabState) -> None:
        if args.show_command:
            for rec in state.guests.values():
                console.print(Text(rec.name, style="bold") + Text(f": {shlex.join(rec.argv)}"), soft_wrap=True)
            for line in network_lines(state):
                console.print(Text(line), soft_wrap=True)
        if args.json and not lab.steps and not quiet_json:
            print_json(status_data(state))
        elif not args.json:
            print_lab(state)
            out.print(Text.assemble("lab ", (lab.ident, "bold"), f" is up ({state.accel}); ",
                                    (f"labctl ssh {lab.ident} GUEST", "cyan"), ", ",
                                    (f"labctl down {lab.ident}", "cyan")))

    if lab.steps and not args.no_steps:  # the whole pipeline; the lab stays up afterwards
        from labctl.cli.displays import StepLines, report_outcome  # the steps' displays: a lab with steps

        outcome = run_lab(lab, prepared, up_options(args), Path(args.out), display, StepLines(), keep=True, on_up=show)
        return report_outcome(outcome, args.json)
    # A lab of a few guests, one instance: each guest's kept connection is made in the background as
    # soon as the guest is ready, so that the first exec or cp finds its login done (or under way).
    opts = dataclasses.replace(up_options(args), prewarm=not quiet_json and len(lab.guests) <= PREWARM_GUESTS)
    show(up(lab, prepared.image, prepared.kernels, opts, display))
    return 0


PREWARM_GUESTS = 4
"""A lab of at most this many guests gets its kept connections made by ``up`` (a room's do not)."""
