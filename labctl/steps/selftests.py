"""A step's ``kselftest:`` kind: the kernel's selftests of a source tree, built on the host, run in a guest.

:class:`SelftestsKind` is the kind: ``prepare`` builds the selftests (or finds them in the cache)
and copies them into the guest, ``run`` runs them after the step's commands, ``collected``
reads their results and fails the step for any selftest that failed or never reported.

**Build** (:func:`build`), once per content, cached in ``~/.cache/labctl/kselftest/KEY/``; the key
hashes the target's directory, the selftests framework (``kselftest/``, ``lib.mk``, the harness
headers) and the tree's UAPI headers (``include/uapi``, ``arch/x86/include/uapi`` and its
generated part). Nothing is written into the tree:

1. the UAPI headers are installed into the work directory with the tree's own
   ``scripts/headers_install.sh`` (its ``unifdef`` compiled there from ``scripts/unifdef.c``);
2. ``make -C TREE/tools/testing/selftests O=WORK TARGETS=TARGET -k``: with ``O=`` the objects go
   to ``WORK/kselftest/TARGET`` and the headers are taken from ``WORK/usr/include``; ``-k``
   builds every program that can be built when some cannot (6.1's net target needs clang for
   ``nat6to4.o`` and libnuma for ``reuseport_bpf_numa``: the target as a whole fails here);
3. the installed tree is assembled by labctl (the kernel's ``install`` needs rsync and a target
   that builds whole): ``run_kselftest.sh`` and ``kselftest/``, the target's scripts and data
   files, the programs that were built, and ``kselftest-list.txt`` from the target's own
   ``emit_tests``. A listed test whose program did not build is an error naming make's reason.

make runs through :func:`labctl.proc.run_lines` (its own session, stopped as a group on Ctrl-C);
the work directory is :func:`labctl.paths.build_into`'s (removed unless the build completes).

**Run**: the installed tree is copied into the guest once per guest and build
(:func:`labctl.steps.transfer.to_guest`), the per-test timeout written into the target's
``settings``, and ``run_kselftest.sh -t TARGET:TEST ...`` run; its output is kept as
``kselftest.tap`` in the step's guest directory, with the time of each test's start and result
line in ``kselftest.times``. :func:`results` parses them (:mod:`labctl.trace.ktap`) into the
step's record and one log file per test (``kselftest/TEST.log``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import labctl.steps.drivertests as drivertests  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import paths, proc
from labctl.bundle import BuildRecord, SelftestEntry, SelftestRecord
from labctl.errors import LabctlError
from labctl.lab import SELFTESTS, Kselftest, Step, render
from labctl.steps.result import StepResult
from labctl.steps.transfer import to_guest
from labctl.steps.variant import GUEST_ROOT, StepKind, Variant, now
from labctl.trace import KTAP_FAIL, KTAP_SKIP, kselftest_name, ktap_counts, parse_ktap, walk_ktap

RECIPE = "2"  # bump when the way labctl builds changes
BUILD_TIMEOUT = 3600.0
TAP = "kselftest.tap"
TIMES = "kselftest.times"
LOGS = "kselftest"
BUILD_JSON = "build.json"
INSTALL = "install"
_FRAMEWORK = ("Makefile", "lib.mk", "kselftest.h", "kselftest_harness.h", "kselftest_module.h", "run_kselftest.sh")
_HEADER_DIRS = ("include/uapi", "arch/x86/include/uapi", "arch/x86/include/generated/uapi")
_MAKE_FAILED = re.compile(r"\*\*\* \[[^\]]*?([^/\s\]]+)\] Error")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.+-]")


@dataclass
class Build:
    key: str
    install: Path  # run_kselftest.sh, kselftest-list.txt, <target>/
    seconds: float = 0.0
    cached: bool = False
    make_status: int = 0
    not_built: list[str] = field(default_factory=list)  # programs make could not build
    tests: list[str] = field(default_factory=list)  # kselftest-list.txt's tests of the target

    def to_dict(self) -> BuildRecord:
        return {"key": self.key, "seconds": round(self.seconds, 1), "cached": self.cached,
                "make_status": self.make_status, "not_built": self.not_built, "tests": len(self.tests)}


def _hash_tree(h: Any, root: Path, rel: str) -> None:
    base = root / rel
    if base.is_file():
        h.update(f"F {rel}\n".encode())
        h.update(base.read_bytes())
        return
    for d, dirs, files in os.walk(base):
        dirs.sort()
        for name in sorted(files):
            p = Path(d) / name
            if p.is_file() and not p.is_symlink():
                h.update(f"F {p.relative_to(root)}\n".encode())
                h.update(p.read_bytes())


def build_key(spec: Kselftest) -> str:
    """What the build is made of: the target's sources, the framework and the tree's UAPI headers."""
    h = hashlib.sha256(f"labctl-kselftest {RECIPE} {spec.target}\n".encode())
    tree = Path(spec.tree)
    _hash_tree(h, tree, str(SELFTESTS / spec.target))
    _hash_tree(h, tree, str(SELFTESTS / "kselftest"))
    for name in _FRAMEWORK:
        if (tree / SELFTESTS / name).is_file():
            _hash_tree(h, tree, str(SELFTESTS / name))
    for d in _HEADER_DIRS:
        if (tree / d).is_dir():
            _hash_tree(h, tree, d)
    for rel, _ in drivertests.extras(spec.target):
        if (tree / rel).exists():
            _hash_tree(h, tree, rel)
    return h.hexdigest()[:16]


def cache_root() -> Path:
    return paths.cache_dir() / "kselftest"


def build(spec: Kselftest, say: Callable[[str], None] = lambda _: None, jobs: int | None = None) -> Build:
    """The installed selftests of ``spec`` (built now, or found in the cache).

    :raise LabctlError: when a listed test is not there after the build (with make's reason).
    """
    key = build_key(spec)
    final = cache_root() / key
    cached = _read(final, spec)
    if cached is not None:
        return cached
    final.parent.mkdir(parents=True, exist_ok=True)
    with paths.exclusive(cache_root() / f"{key}.lock"):
        cached = _read(final, spec)  # another labctl built it meanwhile
        if cached is not None:
            return cached
        t0 = time.monotonic()
        with paths.build_into(final, mode=0o755) as work:
            result = _build_in(spec, key, work, say, jobs or os.cpu_count() or 1)
            result.seconds = time.monotonic() - t0
            paths.atomic_write(work / BUILD_JSON, json.dumps(result.to_dict() | {"all_tests": result.tests}) + "\n")
            try:
                _check_listed(spec, result, work)
            except LabctlError:
                shutil.copy2(work / "make.log", cache_root() / f"{key}.make.log")
                raise
        result.install = final / INSTALL
        say(f"selftests built in {result.seconds:.0f} s ({len(result.tests)} tests"
            + (f"; not built: {', '.join(result.not_built)}" if result.not_built else "") + ")")
        return result


def _read(final: Path, spec: Kselftest) -> Build | None:
    try:
        data = json.loads((final / BUILD_JSON).read_text())
    except (OSError, ValueError):
        return None
    b = Build(str(data["key"]), final / INSTALL, float(data["seconds"]), True, int(data["make_status"]),
              list(data["not_built"]), list(data["all_tests"]))
    _check_listed(spec, b, final)
    return b


def _check_listed(spec: Kselftest, b: Build, work: Path) -> None:
    missing = [t for t in spec.tests if t not in b.tests or not (work / INSTALL / spec.target / t).exists()]
    if missing:
        reasons = _reasons(work / "make.log", missing)
        raise LabctlError(f"selftests not built from {spec.tree} ({spec.target}): " + "; ".join(
            f"{t}: {reasons.get(t, 'not in the target list')}" for t in missing),
            hint=f"make's output: {cache_root() / (b.key + '.make.log')}")


def _reasons(log: Path, names: list[str]) -> dict[str, str]:
    """The first compiler error line of each of ``names`` in make's log."""
    out: dict[str, str] = {}
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for name in names:
        for ln in lines:
            if f"{name}.c:" in ln and "error" in ln:
                out[name] = ln.strip()[:300]
                break
        else:
            for ln in lines:
                if _MAKE_FAILED.search(ln) and _MAKE_FAILED.search(ln)[1] == name:  # type: ignore[index]
                    out[name] = ln.strip()[:300]
                    break
    return out


def _build_in(spec: Kselftest, key: str, work: Path, say: Callable[[str], None], jobs: int) -> Build:
    tree, src = Path(spec.tree), spec.source
    obj = work / "obj"
    say("installing the tree's UAPI headers for the selftests")
    _headers(tree, obj / "usr" / "include", work)
    say(f"make -C {SELFTESTS} TARGETS={spec.target} (-j{jobs})")
    log_lines: list[str] = []
    count = [0]

    def line(text: str) -> None:
        log_lines.append(text)
        if re.match(r"\s*(gcc|cc|CC|LINK|clang)\b", text) or " -o " in text:
            count[0] += 1
            if count[0] % 10 == 0:
                say(f"make: {count[0]} programs compiled")

    env = {**os.environ, "LC_ALL": "C"}
    status = proc.run_lines(["make", "-C", str(tree / SELFTESTS), f"O={obj}", f"TARGETS={spec.target}", "-k",
                             f"-j{jobs}"], line, BUILD_TIMEOUT, env=env)
    paths.atomic_write(work / "make.log", "\n".join(log_lines) + "\n")
    not_built = sorted({m[1] for ln in log_lines if (m := _MAKE_FAILED.search(ln))} - {"all"})
    built = obj / "kselftest" / spec.target
    inst = work / INSTALL
    _install(tree, src, built, inst, spec.target)
    listing: list[str] = []
    proc_out = proc.run(["make", "-s", "--no-print-directory", "-C", str(src), f"OUTPUT={built}",
                         f"COLLECTION={spec.target}", f"KHDR_INCLUDES=-isystem {obj / 'usr' / 'include'}",
                         "emit_tests"], 300, env=env, check=False)
    for ln in proc_out.stdout.decode(errors="replace").splitlines():
        if ln.startswith(f"{spec.target}:"):
            listing.append(ln)
    paths.atomic_write(inst / "kselftest-list.txt", "\n".join(listing) + "\n")
    return Build(key, inst, 0.0, False, status, not_built, [ln.split(":", 1)[1] for ln in listing])


def _headers(tree: Path, out: Path, work: Path) -> None:
    """The tree's UAPI headers as ``make headers_install`` makes them, into ``out``, with the tree's own
    script; its ``unifdef`` is compiled in ``work`` (never in the tree)."""
    tools = work / "scripts"
    tools.mkdir(parents=True, exist_ok=True)
    proc.run(["gcc", "-O2", "-o", str(tools / "unifdef"), str(tree / "scripts" / "unifdef.c")], 300)
    pairs: list[str] = []
    for d in _HEADER_DIRS:
        base = tree / d
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*.h")):
            dest = out / p.relative_to(base)
            dest.parent.mkdir(parents=True, exist_ok=True)
            pairs += [str(p), str(dest)]
    script = ('s=$1; shift; while [ $# -gt 0 ]; do sh "$s" "$1" "$2" || { echo "headers_install: $1" >&2; '
              'exit 1; }; shift 2; done')
    proc.run(["sh", "-c", script, "sh", str(tree / "scripts" / "headers_install.sh"), *pairs], 1800, cwd=work)


def _install(tree: Path, src: Path, built: Path, root: Path, target: str) -> None:
    """The target's scripts and data files and the programs that were built, as run_kselftest.sh wants them."""
    dest = root / target
    (root / "kselftest").mkdir(parents=True, exist_ok=True)
    base = tree / SELFTESTS
    for name in ("runner.sh", "prefix.pl", "module.sh"):
        if (base / "kselftest" / name).is_file():
            shutil.copy2(base / "kselftest" / name, root / "kselftest" / name)
    shutil.copy2(base / "run_kselftest.sh", root / "run_kselftest.sh")
    dest.mkdir(parents=True, exist_ok=True)
    # scripts and data files, those of subdirectories too (6.1's altnames.sh sources forwarding/lib.sh)
    for d, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            p = Path(d) / name
            if p.is_file() and not p.is_symlink() and p.suffix not in (".c", ".h") and name != "Makefile":
                (dest / p.parent.relative_to(src)).mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, dest / p.relative_to(src))
    if built.is_dir():
        for p in sorted(built.iterdir()):
            if p.is_file() and not p.is_symlink():
                shutil.copy2(p, dest / p.name)
    for rel, into in drivertests.extras(target):  # what the target's tests import from elsewhere in the tree
        _copy_plain(tree / rel, root / into)


def _copy_plain(src: Path, dest: Path) -> None:
    """``src`` (a file, or a directory's regular files) to ``dest``; links and build leftovers not followed."""
    if src.is_file() and not src.is_symlink():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        return
    for d, dirs, files in os.walk(src):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(files):
            p = Path(d) / name
            if p.is_file() and not p.is_symlink():
                (dest / p.parent.relative_to(src)).mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, dest / p.relative_to(src))


# -- in the guest ---------------------------------------------------------------------------------------

def guest_dir(b: Build) -> str:
    return f"/tmp/labctl/kselftest-{b.key}"


def run_command(spec: Kselftest, b: Build, workdir: str) -> str:
    """The guest's command: the per-test timeout into ``settings``, then the kernel's runner, its output
    into ``workdir``/kselftest.tap and each test's start and result times into kselftest.times."""
    q = shlex.quote
    root, target = guest_dir(b), spec.target
    tests = spec.tests or tuple(b.tests)
    selected = " ".join(f"-t {q(target + ':' + t)}" for t in tests)
    settings = f"{q(target)}/settings"
    stamp = ("while IFS= read -r l; do case \"$l\" in \"# selftests: \"*|\"ok \"*|\"not ok \"*) "
             "printf '%s %s\\n' \"$EPOCHREALTIME\" \"$l\";; esac; done")
    # labctl's guest has no /dev/stdout link unless made (the runner writes each test's output there)
    links = " && ".join(f"{{ [ -L /dev/{name} ] || {{ rm -f /dev/{name}; ln -s /proc/self/fd/{fd} /dev/{name}; }}; }}"
                        for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)))
    return (f"{links} && {{ [ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd; }} && cd {q(root)} && {{ grep -v '^timeout=' {settings} 2>/dev/null; echo timeout={spec.timeout}; }} "
            f"> {settings}.new && mv {settings}.new {settings} && "
            f"./run_kselftest.sh {selected} 2>&1 | tee {q(workdir)}/{TAP} | bash -c {q(stamp)} > {q(workdir)}/{TIMES}")


def run_timeout(spec: Kselftest, b: Build) -> float:
    return float(spec.timeout * max(1, len(spec.tests or b.tests)) + 300)


# -- results ----------------------------------------------------------------------------------------------

def _times(path: Path) -> dict[int, float]:
    """Seconds each top-level test took (by its number), from kselftest.times."""
    out: dict[int, float] = {}
    start: float | None = None
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for ln in lines:
        stamp, _, text = ln.partition(" ")
        try:
            t = float(stamp.replace(",", "."))
        except ValueError:
            continue
        if text.startswith("# selftests: "):
            start = t
        else:
            m = re.match(r"(?:not )?ok (\d+)", text)
            if m and start is not None:
                out[int(m[1])] = round(t - start, 2)
                start = None
    return out


def _unprefixed(lines: list[str]) -> str:
    return "\n".join(ln[2:] if ln.startswith("# ") else ln.removeprefix("#") for ln in lines) + "\n"


def results(guest_dir: Path, rel_guest: str, spec_target: str) -> SelftestRecord:
    """The step's selftest record from the guest's kselftest.tap (and .times), and one log file per test
    written beside them (``kselftest/TEST.log``). ``rel_guest``: the guest directory, relative to the bundle."""
    try:
        text = (guest_dir / TAP).read_text(errors="replace")
    except OSError:
        return {"tests": [], "counts": ktap_counts([]), "missing": 0, "error": f"no {TAP}: the runner did not run"}
    doc = parse_ktap(text)
    times = _times(guest_dir / TIMES)
    logs = guest_dir / LOGS
    logs.mkdir(exist_ok=True)
    tests: list[SelftestEntry] = []
    for r in doc.results:
        collection, name = kselftest_name(r.name)
        logname = _SAFE_NAME.sub("_", name) + ".log"
        with contextlib.suppress(OSError):
            paths.atomic_write(logs / logname, _unprefixed(r.log))
        sub = ktap_counts(walk_ktap(r.subtests)) if r.subtests else None
        tests.append({"name": name, "collection": collection or spec_target, "number": r.number,
                      "result": r.result, "directive": r.directive,
                      "reason": r.skip_reason() if r.result == KTAP_SKIP else r.reason,
                      "time_s": times.get(r.number) if r.number is not None else None,
                      "log": f"{rel_guest}/{LOGS}/{logname}", "subtests": sub,
                      "failed_subtests": [s.name for s in walk_ktap(r.subtests) if s.result == KTAP_FAIL][:50]})
    return {"tests": tests, "counts": ktap_counts(doc.results), "missing": doc.missing, "plan": doc.plan,
            "bailed": doc.bailed}


def verdict(record: SelftestRecord) -> str | None:
    """Why the step failed (selftests that failed or never reported), or None."""
    failed = [t["name"] for t in record.get("tests", []) if t["result"] == KTAP_FAIL]
    parts = []
    if failed:
        parts.append(f"{len(failed)} of {len(record['tests'])} selftests failed: {', '.join(failed)}")
    if record.get("missing"):
        parts.append(f"{record['missing']} selftests never reported a result")
    if record.get("error"):
        parts.append(str(record["error"]))
    return "; ".join(parts) or None



# -- the kind ----------------------------------------------------------------------------------------------


class SelftestsKind(StepKind):
    """The step's selftests, on the guest its ``kselftest.guest`` names for the row (see the module docstring)."""

    name = "kselftest"

    def __init__(self, spec: Kselftest, guest: str, netif: str = "", peer: str = "") -> None:
        self.spec, self.guest, self.netif, self.peer = spec, guest, netif, peer
        self.build: Build | None = None

    @classmethod
    def of(cls, step: Step, row: dict[str, str]) -> SelftestsKind | None:
        k = step.kselftest
        if k is None:
            return None
        return cls(k, render(k.guest, row, {}, quote=False), render(k.netif, row, {}, quote=False),
                   render(k.peer, row, {}, quote=False))

    def guests(self) -> list[str]:
        return [self.guest]  # the peer runs what the tests send it; its files are not the step's

    def prepare(self, v: Variant) -> None:
        """The selftests built (or found in the cache) and copied into the guest (once per build).

        :raise LabctlError: when they cannot be built (the step fails).
        """
        spec, guest, say = self.spec, self.guest, v.events.step_progress
        if spec.from_debian:
            spec = self.spec = dataclasses.replace(spec, tree=str(debian_tree(v, guest, say)))
        b = self.build = build(spec, say)
        v.res.records["kselftest"] = {"guest": guest, "tree": str(spec.tree), "target": spec.target,
                                      "build": b.to_dict(), "tests": [], "counts": {}}
        where = guest_dir(b)
        if v.sh(guest, f"test -f {shlex.quote(where)}/.complete") != 0:
            say(f"copying the selftests into {guest}")
            v.sh(guest, f"rm -rf {shlex.quote(where)} && mkdir -p {shlex.quote(GUEST_ROOT)}")
            to_guest(v.sessions.ssh(guest), str(b.install), where)
            v.sh(guest, f"touch {shlex.quote(where)}/.complete")
        if self.peer:
            self._hardware_mode(v, where)

    def _hardware_mode(self, v: Variant, where: str) -> None:
        """``net.config`` for the NIC under test and its peer, and the guest's SSH to the peer
        (:mod:`labctl.steps.drivertests`). :raise LabctlError: when the two cannot be joined."""
        e = drivertests.endpoints(v.lab, self.guest, self.netif, self.peer)
        record = v.res.records["kselftest"]
        assert isinstance(record, dict)
        record["hardware"] = {"netif": e.netif, "peer": e.peer, "local": e.local_v4 or e.local_v6,
                              "remote": e.remote_v4 or e.remote_v6}
        said = v.sessions.ssh(self.guest).run(drivertests.key_command(), timeout=60)
        public = drivertests.checked_public_key(said.stdout.decode(errors="replace"), self.guest)
        said = v.sessions.ssh(self.peer).run(drivertests.authorize_command(public), timeout=60)
        host_key = drivertests.checked_host_key(said.stdout.decode(errors="replace"), self.peer)
        command = drivertests.client_command(e, host_key, drivertests.config_path(where, self.spec.target))
        done = v.sessions.ssh(self.guest).run(command, timeout=120)
        if done.status != 0:
            raise LabctlError(f"kselftest: {self.guest} cannot reach its peer {self.peer} by SSH at "
                              f"{e.remotes[0]}: {done.stderr.decode(errors='replace').strip()[:300]}")

    def run(self, v: Variant) -> None:
        b, spec, guest = self.build, self.spec, self.guest
        if b is None:
            return
        command = run_command(spec, b, v.workdir)
        count = len(spec.tests or b.tests)
        v.events.step_progress(f"running {count} {spec.target} selftests on {guest}")
        started, t0 = now(), time.monotonic()
        status = v.sessions.ssh(guest).run(command, timeout=run_timeout(spec, b), abort=v.sessions.dead_guests).status
        v.record({"guest": guest, "step": v.step.name, "variant": v.res.variant, "index": len(v.commands),
                  "command": f"run_kselftest.sh ({count} tests of {spec.target})", "background": False,
                  "status": status, "duration_s": round(time.monotonic() - t0, 3), "started_at": started})
        if status < 0:
            v.res.fail(v.sessions.dead_guests() or f"the SSH connection to {guest} was lost during the selftests")

    def collected(self, v: Variant) -> None:
        if self.build is None:
            return
        judge(v.res, results(v.bundle / v.rel / self.guest, f"{v.rel.as_posix()}/{self.guest}", self.spec.target))


def debian_tree(v: Variant, guest: str, say: Callable[[str], None]) -> Path:
    """The source tree of ``guest``'s Debian kernel (``tree: debian``): its ``linux-source-X.Y`` at the
    kernel's own version, unpacked once beside the prepared kernel (as ``labctl kernel source`` does).

    :raise LabctlError: when the guest runs no Debian kernel or the archive lacks its source.
    """
    from labctl.kernel import add_source

    kernel = v.state.kernel(guest)
    say(f"the selftests from {kernel.release}'s own source (linux-source, unpacked once)")
    unpacked = add_source(kernel)
    trees = sorted(p for p in unpacked.iterdir() if (p / SELFTESTS / "Makefile").is_file())
    if not trees:
        raise LabctlError(f"kselftest: {unpacked} holds no kernel source tree")
    return trees[0]


def judge(res: StepResult, record: SelftestRecord) -> None:
    """The selftests' results into the step's: the step fails for a selftest that failed or never
    reported; when the lab itself was fine (only selftests failed) the next variant still runs."""
    lab_ok = res.status != "failed"
    why = verdict(record)
    record["only_tests_failed"] = bool(lab_ok and why and not record.get("error") and not record.get("missing"))
    before = res.records.get("kselftest")
    res.records["kselftest"] = {**(before if isinstance(before, dict) else {}), **record}
    if why:
        res.fail(why)
        res.lab_intact = record["only_tests_failed"]
