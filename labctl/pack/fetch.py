"""A lab file or a packed file from an http(s) URL: downloaded into the cache, then treated as a
file from another user (its lab names no host path that labctl would use: see
:func:`labctl.lab.load_lab`'s trust rules; a packed lab shares no host directory).

Only ``http://`` and ``https://``; redirects only to those; at most :data:`MAX_BYTES`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from labctl.errors import UsageError
from labctl.lab import DEBIAN, Lab, load_lab_text
from labctl.pack.cache import pin
from labctl.paths import atomic_file, cache_dir

MAX_BYTES = 8 << 30
TIMEOUT_S = 60
CHUNK = 1 << 20


def is_url(text: str) -> bool:
    return urlsplit(text).scheme in ("http", "https")


def _opener() -> Any:
    """urllib's opener that follows only http(s) redirects (urllib loaded here: ``up`` of a
    local lab file never needs it)."""
    import urllib.request

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
            if not is_url(newurl):
                raise UsageError(f"{req.full_url}: redirected to {newurl}, which is not http(s)")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return urllib.request.build_opener(Redirects)


def fetch_url(url: str) -> Path:
    """The file at ``url``, in ``<cache>/fetched/<sha256 of the URL>``.

    :raise UsageError: for another scheme, an HTTP error, or a file over :data:`MAX_BYTES`.
    """
    if not is_url(url):
        raise UsageError(f"{url}: only http:// and https:// URLs")
    out = cache_dir() / "fetched" / hashlib.sha256(url.encode()).hexdigest()[:16]
    out.parent.mkdir(parents=True, exist_ok=True)
    pin(out)
    import urllib.error

    opener = _opener()
    try:
        with opener.open(url, timeout=TIMEOUT_S) as resp, atomic_file(out, 0o600) as f:
            size = 0
            while chunk := resp.read(CHUNK):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise UsageError(f"{url}: more than {MAX_BYTES >> 30} GiB")
                f.write(chunk)
    except urllib.error.HTTPError as exc:
        raise UsageError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise UsageError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    except OSError as exc:
        raise UsageError(f"{url}: {exc}") from exc
    return out


def url_lab(path: Path, url: str) -> Lab:
    """The lab file fetched from ``url``, held to a stranger's lab file's rules and more: it names no
    path of this host (see :func:`check_foreign`).

    :raise LabFileError: for a bad lab file. :raise UsageError: for one naming a host path.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"{url}: not a lab file nor a labctl pack ({exc})") from exc
    lab = load_lab_text(text, url, remote=url)
    check_foreign(lab, url)
    return lab


def check_foreign(lab: Lab, url: str, root: Path | None = None, *, kernels: bool = True) -> None:
    """A lab file from ``url`` names no path of this host: no kernel tree or loose kernel files (only
    Debian kernels; not checked without ``kernels``: a pack's lab, whose kernels are the pack's own),
    no shares, no selftests' tree (labctl would run its ``make``), and no bpftrace file but one of
    ``root`` (the git checkout it came with; None: none). The loader (``remote=``) has refused such
    a bpftrace file already, before reading it.

    :raise UsageError: naming every path it names.
    """
    named = [f"{where}: {spec.describe()}" for where, spec in
             [("kernel", lab.kernel), *((f"guests.{g}.kernel", guest.kernel) for g, guest in lab.guests.items())]
             if kernels and spec is not None and spec.kind != DEBIAN]
    named += [f"guests.{g}.shares: {s.host}" for g, guest in lab.guests.items() for s in guest.shares]
    for step in lab.steps:
        if step.kselftest is not None:
            named.append(f"steps.{step.name}.kselftest.tree: {step.kselftest.tree}")
        for guest, trace in step.trace.items():
            src = trace.bpftrace.source if trace.bpftrace is not None else None
            if src is not None and (root is None or not Path(src).is_relative_to(root.resolve())):
                named.append(f"steps.{step.name}.trace.{guest}.bpftrace.file: {src}")
    if named:
        raise UsageError(f"{url}: a lab file from a URL may not name a path of this host ({'; '.join(named)})",
                         hint="ask for a packed file (labctl pack), which carries its kernels")
