"""``labctl doctor``: check the host for what each backend needs (each backend says,
:meth:`labctl.backends.Backend.host_checks`), and the hosts a lab file names; start nothing."""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from labctl.backends import BACKENDS, HostCheck, get_backend
from labctl.cli.ui import out, print_json
from labctl.lab import load_lab


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="check the host for what the backends need")
    p.add_argument("lab", nargs="?", metavar="LAB_FILE",
                   help="also check every libvirt host this lab file names (reachable, SSH login)")
    p.add_argument("--backend", choices=sorted(BACKENDS), help="check only this backend (default: all)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit status 0 when every check passed (warnings included), 3 (a host problem) otherwise."""
    backends = [get_backend(b) for b in ([args.backend] if args.backend else BACKENDS)]
    results: list[tuple[str, HostCheck]] = [(b.name, c) for b in backends for c in b.host_checks()]
    if args.lab:
        lab = load_lab(args.lab)
        backend = get_backend(lab.backend)
        results += [(backend.name, c) for c in backend.lab_checks(lab)]
    if args.json:
        print_json([{"backend": b, "check": c.name, "ok": c.ok, "warning": c.warn, "detail": c.detail}
                    for b, c in results])
    else:
        table = Table("backend", "check", "ok", "detail")
        for b, c in results:
            ok = (Text("no", style="red") if not c.ok else Text("warn", style="yellow") if c.warn
                  else Text("yes", style="green"))
            table.add_row(b, c.name, ok, c.detail)
        out.print(table)
    return 0 if all(c.ok for _, c in results) else 3
