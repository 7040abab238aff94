"""``labctl up``, ``down`` and ``status``."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from labctl.backends import BACKENDS
from labctl.cli.displays import StepLines, report_outcome
from labctl.cli.netview import iface_rows, offload_lines, settings_lines
from labctl.cli.ui import PrepareDisplay, UpDisplay, console, out, print_json, safe
from labctl.errors import LabStateError, UsageError
from labctl.lab import Impairment, Lab, Share, env_trusted, kernels, load_lab
from labctl.lab import parse_option as parse_share_option
from labctl.live import capture
from labctl.pack import (
    Checkout,
    Pinned,
    fetch_git,
    fetch_url,
    git_lab,
    is_git_url,
    is_pack,
    is_url,
    open_pack,
    parse_git_url,
    url_lab,
)
from labctl.pipeline import Prepared, prepare, run_lab
from labctl.proc import pid_alive
from labctl.state import UP, LabState, check_lab_name, run_dir, up_labs
from labctl.up import UpOptions, down, dry_run, guest_statuses, up
from labctl.up import mounts as guest_shares

FILE_HELP = ("a lab file or a packed file (labctl pack), or either from an http(s) URL or a git repository: "
             "git+https://HOST/REPO.git[@REV]#PATH")


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

    d = sub.add_parser("down", help="power a lab's guests off and remove its state")
    d.add_argument("lab", nargs="?")
    d.add_argument("--all", action="store_true", help="take every lab down")
    d.add_argument("--timeout", type=float, default=10.0, help="seconds before a hard stop")
    d.set_defaults(func=cmd_down)

    s = sub.add_parser("status", help="show labs that are up")
    s.add_argument("lab", nargs="?")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``up`` that ``run`` shares."""
    p.add_argument("--accel", choices=["auto", "kvm", "tcg"], default="auto",
                   help="accelerator (auto: KVM if a probe boot works, else TCG)")
    p.add_argument("--backend", choices=list(BACKENDS), help="override the lab's backend")
    p.add_argument("--boot-timeout", type=float, default=180.0, metavar="SECONDS")
    p.add_argument("--no-verify-host-keys", action="store_true",
                   help="do not check the SSH host keys of the lab's remote libvirt hosts")
    p.add_argument("--unencrypted-links", action="store_true",
                   help="accept links across hosts as plain UDP tunnels (neither encrypted nor authenticated)")
    p.add_argument("--kernel", metavar="SPEC",
                   help="boot every guest on this kernel: debian:ABI-FLAVOUR, tree:PATH, image:PATH (or a path)")
    p.add_argument("--instance", metavar="NAME",
                   help="one of several copies of the lab on this host, addressed as LAB@NAME")
    p.add_argument("--cold", action="store_true",
                   help="boot every guest, even where a post-boot snapshot would restore it (warm start)")
    p.add_argument("--save-state", action="store_true",
                   help="libvirt: save each guest's post-boot state on its host, for reset (class up always does)")
    p.add_argument("--no-drops", action="store_true",
                   help="steps do not record the packets each guest's kernel drops (as drops: false in the lab file)")
    p.add_argument("--overcommit", action="store_true",
                   help="start even when the guests may need more memory than the host has available")
    p.add_argument("--trust-dir", action="append", default=[], metavar="DIR",
                   help="use kernel paths the lab file names under DIR even if another user could change them "
                        "(repeatable)")
    p.add_argument("--share", action="append", default=[], metavar="GUEST:HOST:MOUNT[:rw]",
                   help="share a host directory into a guest (read-only unless :rw), as the lab file's "
                        "shares: (repeatable)")


def load_with_kernel(file: str, kernel: str | None, trusted: Sequence[str] = ()) -> Lab:
    """The lab file, with ``--kernel`` for every guest when given; ``trusted``: ``--trust-dir``.

    :raise LabFileError: for a bad lab file (a kernel path another user could change, outside
        ``trusted``, too). :raise UsageError: for a bad ``--kernel``.
    """
    lab = load_lab(file, trusted)
    if kernel:
        try:
            lab = lab.with_kernel(kernels.from_command_line(kernel, Path.cwd()))
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
        return lab.with_kernel(kernels.from_command_line(kernel, Path.cwd())) if kernel else lab
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
        outcome = run_lab(lab, prepared, up_options(args), Path(args.out), display, StepLines(), keep=True, on_up=show)
        return report_outcome(outcome, args.json)
    show(up(lab, prepared.image, prepared.kernels, up_options(args), display))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if args.all:
        names = up_labs()
    elif args.lab:
        names = [args.lab]
    else:
        raise LabStateError("say which lab to take down, or --all", hint=f"labs up: {', '.join(up_labs()) or 'none'}")
    for name in names:
        check_lab_name(name)
        with console.status(Text(f"taking {name} down")):
            down(name, timeout=args.timeout)
        out.print(Text(f"lab {name} is down"))
    return 0


def status_data(state: LabState) -> dict[str, Any]:
    return {
        "lab": state.lab, "state": state.phase if not state.incomplete else "incomplete", "source": state.source, "backend": state.backend, "accel": state.accel,
        "image": state.image, "started_at": state.started_at, "run_dir": state.dir,
        "warnings": state.warnings, "networks": state.networks, "uploads": state.uploads,
        "captures": [{"guest": c.guest, "nic": c.nic, "purpose": c.purpose, "pid": c.owner,
                      "running": pid_alive(c.owner)} for c in capture.active(state)],
        "hosts": {h["name"]: {k: v for k, v in h.items() if k != "name"} for h in state.hosts.values()},
        "guests": [{"name": g.name, "state": g.state, "host": g.host, "ssh": g.ssh, "gdb": g.gdb, "pid": g.pid,
                    "accel": g.accel, "ready_seconds": state.ready_seconds.get(g.name),
                    "started_from": "snapshot" if g.name in state.warm else "boot",
                    "kernel": _kernel_of(state, g.name), "nics": g.nics, **g.settings,
                    "shares": [{**sh.to_dict(), "dir": str(d)} for sh, d in _exported(state, g.name)]}
                   for g in guest_statuses(state)],
    }


def _kernel_of(state: LabState, guest: str) -> dict[str, Any] | None:
    """The release and source of the kernel ``guest`` runs (None when unrecorded or gone from the cache)."""
    try:
        k = state.kernel(guest)
        return {"release": k.release, "source": k.source, "dir": str(k.dir)}
    except (LabStateError, OSError, ValueError):
        return None


def network_lines(state: LabState) -> list[str]:
    """One line per lab network: its mechanism and each member's endpoint."""
    lines = []
    for name, seg in state.networks.items():
        ends = [f"{p['guest']}.{p['nic']}" + (f"@{p['host']}" if p.get("host") else "") + f" {p['local']}"
                for p in seg.get("ports", [])]
        lines.append(f"network {name}: {seg.get('mechanism')} ({' <-> '.join(ends)})")
    return lines


def print_lab(state: LabState) -> None:
    title = f"lab {state.lab}"
    if state.incomplete:
        title += f" (incomplete: the labctl that brought it up was killed; 'labctl down {state.lab}' removes it)"
    elif state.phase != UP:
        title += " (starting)"
    releases = {g: (k or {}).get("release") or "" for g in state.guests for k in [_kernel_of(state, g)]}
    several = len(set(releases.values())) > 1
    if not several and releases:
        title += f" · kernel {next(iter(releases.values())) or '?'}"
    t = Table(title=Text(title), title_justify="left")
    placed = any(h.get("name") != "local" for h in state.hosts.values())
    captured = {c.label for c in capture.active(state) if pid_alive(c.owner)}
    statuses = guest_statuses(state)
    marks = {(g.name, str(n.get("name"))): _net_marks(g.name, n, captured) for g in statuses for n in g.nics}
    shown = any(marks.values())
    for col in ("guest", *(["host"] if placed else []), *(["kernel"] if several else []), "state", "ssh", "gdb",
                "nic", "model", "driver", "address", "network", *(["link / impairment"] if shown else [])):
        t.add_column(col)
    for g in statuses:
        first = True
        resolved = (state.resolved.get("guests") or {}).get(g.name) or {}
        for name, model, driver, address, network, nic in iface_rows(resolved, g.nics) or [("",) * 6]:
            host = [(g.host or "") if first else ""] if placed else []
            kernel = [releases.get(g.name, "") if first else ""] if several else []
            cells = [g.name if first else "", *host, *kernel, g.state if first else "", g.ssh if first else "",
                     (g.gdb or "") if first else "", name, model, driver, address, network,
                     *([marks.get((g.name, nic), "")] if shown else [])]
            t.add_row(*(safe(c) for c in cells))  # guest text (drivers from READY): never markup, controls escaped
            first = False
    out.print(t)
    for g in statuses:
        for sh, d in _exported(state, g.name):
            out.print(Text(f"{g.name}: {sh.describe(d)}"))
        for line in [*offload_lines(g.name, g.nics),
                     *settings_lines(g.name, (state.resolved.get("guests") or {}).get(g.name) or {})]:
            out.print(Text(line))


def _exported(state: LabState, guest: str) -> list[tuple[Share, Path]]:
    """The guest's shares, each with the directory it exports (a writable one's of this up)."""
    shares = guest_shares.of((state.resolved.get("guests") or {}).get(guest) or {})
    rec = state.guests.get(guest)
    if rec is None:
        return [(sh, sh.host) for sh in shares]
    return list(zip(shares, guest_shares.directories(Path(rec.dir), shares)))


def _net_marks(guest: str, nic: dict[str, Any], captured: set[str]) -> str:
    """``down · delay 50ms, loss 2% · capturing``: what is in force on a NIC besides its plain link."""
    parts = []
    if nic.get("link") == "down":
        parts.append("link down")
    if nic.get("impair"):
        try:
            parts.append(Impairment.from_dict(nic["impair"]).describe())
        except ValueError:
            parts.append("impaired")
    if f"{guest}.{nic.get('name')}" in captured:
        parts.append("capturing")
    return " · ".join(parts)


def cmd_status(args: argparse.Namespace) -> int:
    names = [check_lab_name(args.lab)] if args.lab else up_labs()
    states = []
    broken: dict[str, str] = {}  # lab -> why its state cannot be read (down still removes it)
    for name in names:
        try:
            states.append(LabState.load(name))
        except LabStateError as exc:
            if not run_dir(name).exists():
                raise
            broken[name] = exc.message
    if args.json:
        print_json({"labs": [status_data(s) for s in states]
                    + [{"lab": n, "state": "incomplete", "reason": why} for n, why in broken.items()]})
        return 0
    if not states and not broken:
        out.print("no labs are up")
    for s in states:
        print_lab(s)
    for name, why in broken.items():
        out.print(Text(f"lab {name}: incomplete ({why}); 'labctl down {name}' removes it"))
    return 0
