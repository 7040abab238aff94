"""``labctl serve``: the labs and classes up on this host in a browser (labctl.web)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.text import Text

from labctl.cli.ui import out
from labctl.errors import UsageError
from labctl.web import DEFAULT_PORT, bind_socket, own_certificate, parse_listen, run_server, self_signed, serve_links


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="the trainer's page, each student's lab and terminals, your labs: in a browser")
    p.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", metavar="ADDRESS:PORT",
                   help=f"where to listen (default 127.0.0.1:{DEFAULT_PORT}; port 0 picks a free one)")
    p.add_argument("--class", dest="classes", action="append", metavar="LAB",
                   help="serve this class (repeatable; default: every class up)")
    p.add_argument("--tls", action="store_true",
                   help="HTTPS with a self-signed certificate (made once; its fingerprint is printed)")
    p.add_argument("--cert", metavar="FILE", type=Path,
                   help="HTTPS with your own certificate (PEM; a chain may follow it); needs --key")
    p.add_argument("--key", metavar="FILE", type=Path,
                   help="the certificate's private key (PEM, unencrypted, readable by you alone)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen)
    if (args.cert is None) != (args.key is None):
        raise UsageError("--cert and --key go together: your certificate and its private key")
    if args.cert is not None and args.tls:
        raise UsageError("--tls makes a self-signed certificate; with --cert and --key, leave it out")
    tls = (own_certificate(args.cert, args.key) if args.cert is not None
           else self_signed(host) if args.tls else None)
    sock = bind_socket(host, port)
    try:
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        base = f"{'https' if tls else 'http'}://{shown}:{bound_port}"
        links = serve_links(base, args.classes)
        out.print(Text(f"serving on {base}" + ("" if host in ("127.0.0.1", "::1") else
                                               "  (reachable from other hosts: mind the firewall)")), soft_wrap=True)
        if tls:
            shown_cert = args.cert if args.cert is not None else tls[0]
            out.print(Text(f"TLS certificate {shown_cert}, SHA-256 fingerprint {tls[2]}"), soft_wrap=True)
        out.print(Text(f"your labs: {links.owner}"), soft_wrap=True)
        for lab, urls in links.classes.items():
            out.print(Text(f"class {lab}: trainer {urls['trainer']}"), soft_wrap=True)
            for student, url in urls.items():
                if student != "trainer":
                    where = links.url_files.get(f"{lab}@{student}")
                    out.print(Text(f"  {student}: {url}" + (f"  (in {where})" if where else "")), soft_wrap=True)
        out.file.flush()
        run_server(sock, (tls[0], tls[1]) if tls else None)
    finally:
        sock.close()
    return 0
