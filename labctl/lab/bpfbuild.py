"""Building an XDP program from C in the lab's directory with the host's clang (``-target bpf -O2 -g``).

What the compiler may read is the lab's directory and a fixed set of public headers, never another
host file: the build runs with ``-nostdinc`` and one include directory of labctl's own whose entries
link to libbpf's headers (``<bpf/...>``, libbpf-dev) and the kernel's UAPI headers (``<linux/...>``,
``<asm/...>``, ``<asm-generic/...>``, linux-libc-dev: Debian 12's are 6.1's, the default guest
kernel's). Before clang runs, every ``#include`` of the source and of each lab file it includes is
checked (:func:`include_problem`): a literal name, relative, no ``..``, a ``"..."`` one in the lab's
directory, a ``<...>`` one under those four; ``#include MACRO``, ``__has_include`` and ``.incbin``
are refused. After, clang's own list of what it read (``-M``) is checked again, and a build that read
anything else is refused without showing what it printed.

A source that does not compile is the compiler's message (its file:line: error lines, paths
relative to the lab's directory) at the lab line that names it (exit 2, nothing started).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import HostError, ProcessError
from labctl.proc import run

__all__ = ["CFLAGS", "SYSTEM_DIRS", "Build", "build", "include_problem"]

CFLAGS = ("-target", "bpf", "-O2", "-g", "-nostdinc", "-fno-color-diagnostics", "-Wno-unused-command-line-argument")
SYSTEM_DIRS = {"bpf": "/usr/include/bpf", "linux": "/usr/include/linux", "asm-generic": "/usr/include/asm-generic",
               "asm": "/usr/include/x86_64-linux-gnu/asm"}
MAX_OBJECT = 64 * 1024  # it travels in one SSH command line, base64 (the guest's bash -c: 128 KiB at most)
MAX_SOURCE = 256 * 1024
TIMEOUT = 120.0
_INCLUDE = re.compile(r"^\s*(?:#|%:|\?\?=)\s*(include|include_next|import)\b\s*(.*)$")
_FORBIDDEN = re.compile(r"__has_include|\.incbin|#\s*embed\b", re.IGNORECASE)


@dataclass(frozen=True)
class Build:
    """A built object (``object`` its bytes) or why not (``error``: the compiler's message, or labctl's)."""

    object: bytes = b""
    error: str = ""


def include_problem(text: str, name: str, top: Path, seen: set[Path] | None = None,
                    trust: Callable[[Path], str | None] | None = None) -> str | None:
    """Why the C file ``name`` (relative to ``top``, the lab's directory; ``text`` its contents) may not
    be built, following its ``"..."`` includes in the lab's directory; None if it may. ``trust``: why
    an included file may not be used (the rule of every host path a lab file names), or None."""
    seen = set() if seen is None else seen
    here = (top / name).resolve()
    if here in seen:
        return None
    seen.add(here)
    for i, line in enumerate(text.replace("\\\n", "").splitlines(), 1):
        if _FORBIDDEN.search(line):
            return f"{name}:{i}: labctl refuses __has_include, .incbin and #embed (the build reads only the lab's files)"
        m = _INCLUDE.match(line)
        if m is None:
            continue
        arg = m.group(2).split("//")[0].split("/*")[0].strip()
        lit = re.fullmatch(r'"([^"]+)"|<([^>]+)>', arg)
        if lit is None:
            return f"{name}:{i}: an #include names a header literally (\"file.h\" or <bpf/bpf_helpers.h>), not {arg!r}"
        angled = lit.group(2) is not None
        target = lit.group(2) if angled else lit.group(1)
        if target.startswith("/") or ".." in Path(target).parts or "\\" in target:
            return f"{name}:{i}: #include {arg}: a relative name without '..'"
        if angled or not (here.parent / target).exists():
            if target.split("/")[0] in SYSTEM_DIRS and "/" in target:
                continue
            if angled:
                return (f"{name}:{i}: #include {arg}: only <bpf/...>, <linux/...>, <asm/...> and <asm-generic/...> "
                        "are there (no libc: a BPF program has none)")
            return f"{name}:{i}: #include {arg}: no such file in the lab's directory"
        inc = (here.parent / target).resolve()
        if top not in inc.parents:
            return f"{name}:{i}: #include {arg} is not inside the lab's directory"
        why = trust(inc) if trust is not None else None
        if why is not None:
            return f"{name}:{i}: #include {arg}: {inc} is not trusted: {why}"
        try:
            sub = inc.read_bytes()[:MAX_SOURCE].decode()
        except (OSError, UnicodeDecodeError) as exc:
            return f"{name}:{i}: #include {arg} cannot be read as text: {exc}"
        why = include_problem(sub, str(inc.relative_to(top)), top, seen, trust)
        if why is not None:
            return why
    return None


def _allowed(dep: Path, top: Path) -> bool:
    real = dep.resolve()
    return top in real.parents or any(Path(d).resolve() in real.parents for d in SYSTEM_DIRS.values())


def _deps(text: str) -> list[str]:
    body = text.replace("\\\n", " ").partition(":")[2]
    return body.split()


def build(source: Path, top: Path, section: str = "xdp") -> Build:
    """Build ``source`` (a C file inside ``top``, the lab's directory, already checked by
    :func:`include_problem`) into a BPF object; clang is run in ``top`` so its messages name the
    lab's files as the user knows them."""
    clang = shutil.which("clang")
    if clang is None:
        return Build(error="clang is not installed on this host (apt-get install clang llvm libbpf-dev)")
    missing = [d for d in SYSTEM_DIRS.values() if not Path(d).is_dir()]
    if missing:
        return Build(error=f"{missing[0]} is missing on this host (apt-get install libbpf-dev linux-libc-dev)")
    rel = str(source.relative_to(top))
    with tempfile.TemporaryDirectory(prefix="labctl-bpf-") as tmp:
        inc = Path(tmp) / "include"
        inc.mkdir()
        for name, target in SYSTEM_DIRS.items():
            os.symlink(target, inc / name)
        out = Path(tmp) / "prog.o"
        # the same source builds the same object (its digest is in the snapshot key): no temporary path in it
        argv = [clang, *CFLAGS, f"-fdebug-prefix-map={tmp}=/labctl", f"-fmacro-prefix-map={tmp}=/labctl",
                "-isystem", str(inc), "-I", ".", "-MD", "-MF", str(Path(tmp) / "deps"),
                "-c", rel, "-o", str(out)]
        try:
            res = run(argv, timeout=TIMEOUT, cwd=top, check=False)
        except (ProcessError, HostError) as exc:
            return Build(error=f"clang did not finish: {exc.message}")
        try:
            deps = _deps((Path(tmp) / "deps").read_text())
        except OSError:
            deps = []
        if any(not _allowed(top / d, top.resolve()) for d in deps):
            return Build(error="the build read a file outside the lab's directory and labctl's headers: refused")
        if res.returncode != 0:
            text = res.stderr.decode(errors="replace").replace(str(inc) + "/", "")
            lines = [ln for ln in text.splitlines() if ": error: " in ln or ": fatal error: " in ln]
            return Build(error="; ".join(lines[:5]) or text.strip()[-800:] or f"clang exited with {res.returncode}")
        data = out.read_bytes()
    if len(data) > MAX_OBJECT:
        return Build(error=f"its object has {len(data)} bytes: at most {MAX_OBJECT}")
    if f"{section}".encode() not in data:
        return Build(error=f"its object has no section '{section}' (write SEC(\"{section}\") before the program)")
    return Build(object=data)
