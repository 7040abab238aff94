"""``labctl class up|status|reset|check|down``: one instance of a lab per student, with handouts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from labctl.backends import get_backend
from labctl.cli.displays import ClassUpDisplay
from labctl.cli.lifecycle_cmds import add_remote_arguments, load_with_kernel
from labctl.cli.ui import PrepareDisplay, console, out, print_json, safe, warn
from labctl.cli.validate_cmd import add_trust_dir
from labctl.errors import EXIT_CHECKS_FAILED, LabctlError, LabStateError, UsageError
from labctl.grading import summary
from labctl.pipeline import check_lab, prepare
from labctl.state import LabState
from labctl.training import (
    DOWN,
    UP,
    ClassRecord,
    bring_up,
    check_handout_dirs,
    check_student,
    find_class,
    for_students,
    is_up,
    place,
    read_roster,
    refuse_up_instances,
    reset,
    student_status,
)
from labctl.up import UpOptions, down
from labctl.web import revoke as revoke_web_tokens

STATE_STYLE = {UP: "green", DOWN: "dim", "starting": "yellow"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("class", help="a class: one instance of a lab per student, with handouts")
    csub = p.add_subparsers(dest="class_command", required=True, metavar="SUBCOMMAND")

    u = csub.add_parser("up", help="start one instance per student of the roster and write their handouts")
    u.add_argument("file", metavar="LAB_FILE")
    u.add_argument("--roster", required=True, type=Path, help="one student a line (# comments, blank lines ignored)")
    u.add_argument("--out", required=True, type=Path, help="handouts go to OUT/<student>/")
    u.add_argument("--accel", choices=["auto", "kvm", "tcg"], default="auto")
    u.add_argument("--boot-timeout", type=float, default=180.0, metavar="SECONDS")
    u.add_argument("--kernel", metavar="SPEC", help="boot every guest on this kernel (as labctl up --kernel)")
    u.add_argument("--cold", action="store_true", help="boot every guest, even where a post-boot snapshot exists")
    u.add_argument("--overcommit", action="store_true",
                   help="start even when the guests may need more memory than the host has available")
    add_remote_arguments(u)
    u.add_argument("--json", action="store_true")
    add_trust_dir(u)
    u.set_defaults(func=cmd_up)

    s = csub.add_parser("status", help="per student and guest: up, crashed or down")
    _lab_option(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    r = csub.add_parser("reset", help="put a student's guests (all, or those named) back to their post-boot state")
    _lab_option(r)
    r.add_argument("student")
    r.add_argument("guests", nargs="*", metavar="GUEST")
    r.set_defaults(func=cmd_reset)

    c = csub.add_parser("check", help="run the lab's checks for every student; exit 6 unless all pass")
    _lab_option(c)
    c.add_argument("--json", action="store_true")
    c.add_argument("--out", default="runs", metavar="DIR",
                   help="where a bundle goes for each instance whose guest crashes during the checks (default: ./runs)")
    c.set_defaults(func=cmd_check)

    d = csub.add_parser("down", help="take every student's instance down and end the class (handouts stay)")
    _lab_option(d)
    d.add_argument("--timeout", type=float, default=10.0, help="seconds before a hard stop")
    d.set_defaults(func=cmd_down)


def _lab_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lab", metavar="NAME", help="the class's lab (needed only when several classes are up)")


def cmd_up(args: argparse.Namespace) -> int:
    students = read_roster(args.roster)  # bad names: exit 2, with the roster's lines, before anything
    lab = load_with_kernel(args.file, args.kernel, args.trust_dir)
    ClassRecord.refuse_if_exists(lab.name)
    refuse_up_instances(lab.name, students)
    check_handout_dirs(args.out, students)  # another user's directory there: refused before anything starts
    # Spread over the lab's libvirt hosts (exit 3 before anything starts when a student fits nowhere).
    placed = place(lab, students, get_backend(lab.backend).free_mib, args.overcommit, args.no_verify_host_keys)
    hosts = placed.hosts if placed else {}
    copies = [lab.with_instance(s).placed_on(hosts[s]) if s in hosts else lab.with_instance(s) for s in students]
    prepared = prepare(lab, PrepareDisplay(), copies=copies, overcommit=args.overcommit)
    record = ClassRecord(lab.name, str(Path(args.file).resolve()), students, str(args.out.resolve()),
                         options={"accel": args.accel, "cold": args.cold, "kernel": args.kernel},
                         checks=[{"name": c.name, "guest": c.guest, "hint": c.hint} for c in lab.checks],
                         placement=hosts)
    record.create()
    if placed:
        console.print(Text("placed by free memory: " + "; ".join(
            f"{h} ({placed.free_mib[h]} MiB free): {len(placed.on(h))} students"
            for h in sorted(placed.free_mib, key=lambda h: -placed.free_mib[h]))))  # most free first
    opts = UpOptions(accel=args.accel, boot_timeout=args.boot_timeout, cold=args.cold,
                     no_verify_host_keys=args.no_verify_host_keys, unencrypted_links=args.unencrypted_links,
                     saved_states=True, shared_states=True)
    arrivals = bring_up(record, dict(zip(students, copies)), prepared.image, prepared.kernels, opts, hosts,
                        ClassUpDisplay())
    rows: list[dict[str, Any]] = [{"student": a.student, "lab": a.lab, "accel": a.accel, "handout": str(a.handout),
                                   "ssh_config": str(a.ssh_config), "host": a.host} for a in arrivals]
    if args.json:
        print_json({"lab": lab.name, "students": rows, "out": record.out})
        return 0
    t = Table(title=Text(f"class of {lab.name}: {len(students)} students"), title_justify="left")
    for col in ("student", "lab", *(("host",) if hosts else ()), "handout"):
        t.add_column(col)
    for row in rows:
        t.add_row(Text(row["student"]), Text(row["lab"]), *((Text(row["host"] or ""),) if hosts else ()),
                  Text(row["handout"]))
    out.print(t)
    out.print(Text.assemble("each student: ", ("ssh -F HANDOUT/ssh_config GUEST", "cyan"), "; ",
                            (f"labctl class status --lab {lab.name}", "cyan"), ", ",
                            (f"labctl class check --lab {lab.name}", "cyan"), ", ",
                            (f"labctl class down --lab {lab.name}", "cyan")))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    record = find_class(args.lab)
    rows = for_students(record, lambda s: student_status(record, s))
    for row in rows:
        row["host"] = record.placement.get(row["student"])
    if args.json:
        print_json({"lab": record.lab, "source": record.source, "out": record.out, "students": rows})
        return 0
    guests = list(dict.fromkeys(g for row in rows for g in row["guests"]))
    t = Table(title=Text(f"class of {record.lab}: {sum(r['state'] == UP for r in rows)}/{len(rows)} up"),
              title_justify="left")
    spread = bool(record.placement)
    for col in ("student", "lab", *(("host",) if spread else ()), "state", *guests, "why"):
        t.add_column(col)
    for row in rows:
        cells = [Text(row["student"]), Text(row["lab"]), *((Text(row["host"] or ""),) if spread else ()),
                 _styled(row["state"])]
        cells += [_styled(row["guests"].get(g, DOWN if row["state"] == DOWN else "")) for g in guests]
        cells.append(safe("; ".join(f"{g}: {why}" for g, why in row["reasons"].items())))
        t.add_row(*cells)
    out.print(t)
    return 0


def _styled(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, "bold red"))


def cmd_reset(args: argparse.Namespace) -> int:
    record = find_class(args.lab)
    ident = record.ident(check_student(record, args.student))
    with console.status(Text(f"resetting {', '.join(args.guests) or 'every guest'} of {ident}")):
        took = reset(ident, args.guests or None, on_moved=warn)
    for guest, seconds in took.items():
        out.print(Text(f"{ident} {guest}: reset in {seconds:.1f} s"))
    return 0


def _student_checks(record: ClassRecord, student: str, out_root: Path) -> dict[str, Any]:
    ident = record.ident(student)
    names = [c["name"] for c in record.checks]
    try:
        state = LabState.load(ident)
    except LabStateError:
        return {"student": student, "lab": ident, "state": DOWN, "passed": 0, "total": len(names),
                "failing": names, "checks": []}
    checked = check_lab(state, None, out_root)
    results = checked.results
    return {"student": student, "lab": ident, "state": UP, **summary(results), "checks": [r.to_dict() for r in results],
            "bundle": str(checked.bundle) if checked.bundle else None}


def cmd_check(args: argparse.Namespace) -> int:
    record = find_class(args.lab)
    if not record.checks:
        raise UsageError(f"lab '{record.lab}' declares no checks", hint="add a 'checks:' section to its lab file")
    rows = for_students(record, lambda s: _student_checks(record, s, Path(args.out)))
    done = sum(r["total"] > 0 and r["passed"] == r["total"] for r in rows)
    if args.json:
        print_json({"lab": record.lab, "done": done, "students": rows})
    else:
        t = Table(title=Text(f"class of {record.lab}: {done}/{len(rows)} students pass every check"),
                  title_justify="left")
        for col in ("student", "passed", "failing"):
            t.add_column(col)
        for r in rows:
            ok = r["passed"] == r["total"]
            failing = ", ".join(r["failing"]) + (" (lab down)" if r["state"] == DOWN else "")
            t.add_row(Text(r["student"]), Text(f"{r['passed']}/{r['total']}", style="green" if ok else "bold red"),
                      Text(failing))
        out.print(t)
    return 0 if done == len(rows) else EXIT_CHECKS_FAILED


def cmd_down(args: argparse.Namespace) -> int:
    record = find_class(args.lab)
    revoke_web_tokens(record.lab)  # labctl serve: the class's pages and terminals lose access now
    errors: list[LabctlError] = []
    for student in record.students:
        ident = record.ident(student)
        if not is_up(ident):
            continue
        try:
            with console.status(Text(f"taking {ident} down")):
                down(ident, timeout=args.timeout)
            out.print(Text(f"lab {ident} is down"))
        except LabctlError as exc:
            errors.append(exc)
            console.print(Text.assemble(("error: ", "bold red"), safe(f"{ident}: {exc.message}")))
    if errors:
        first = errors[0]
        first.hint = (f"the class record is kept; run 'labctl class down --lab {record.lab}' again once it is fixed"
                      + (f" ({first.hint})" if first.hint else ""))
        raise first
    record.remove()
    out.print(Text(f"class of {record.lab} is over; the handouts stay in {record.out}"))
    return 0
