"""A step's ``kselftest:``: the kernel's own selftests of a source tree, built on the host, run in a guest.

::

    steps:
      - name: net-selftests
        matrix:                               # optional: e.g. one guest per NIC model
          - {label: e1000, guest: a}
          - {label: virtio, guest: b}
        kselftest:
          guest: "{{guest}}"                  # default: the lab's only guest
          tree: ~/linux                       # a kernel source tree (~ expanded, relative to the lab file),
                                              # or "debian": the guest's Debian kernel's own linux-source
          target: net                         # tools/testing/selftests/<target> (default net)
          tests: [fib_tests.sh, tls]          # default: every test of the target
          timeout: 300                        # seconds, each test (default 300)
          netif: "{{nic}}"                    # drivers/net in hardware mode: the NIC under test ...
          peer: b                             # ... and the guest at its other end (over the lab's SSH)

With ``netif`` and ``peer`` (both or neither) labctl writes the target's ``net.config`` (``NETIF``,
``LOCAL_V4``/``REMOTE_V4`` and ``_V6`` of the two NICs on one network, ``REMOTE_TYPE=ssh``,
``REMOTE_ARGS``) and lets the guest reach its peer by SSH with a key made for the step
(:mod:`labctl.steps.drivertests`): the kernel's driver tests (``drivers/net``, ``drivers/net/hw``) then
run against the emulated NIC instead of netdevsim.

The tree is a host path the lab file names: labctl runs ``make`` there (as the user
running labctl), so it goes through :mod:`labctl.lab.trust` like a kernel tree.
A ``kselftest`` step may also have ``run:`` commands (they run first).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from labctl.lab.checker import Checker, join
from labctl.lab.trust import TRUST_ENV, named_path_reason
from labctl.lab.yamlpos import YamlMap

KEYS = ("guest", "tree", "target", "tests", "timeout", "netif", "peer")
DEFAULT_TARGET = "net"
DEBIAN = "debian"  # tree: the guest's own Debian kernel's source (linux-source-X.Y at its version)
DEFAULT_TIMEOUT = 300
SELFTESTS = Path("tools/testing/selftests")
_TARGET = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}(/[a-z0-9][a-z0-9_-]{0,63}){0,3}")
_TEST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")



class BuildRecord(TypedDict):
    """How the selftests were built (:class:`labctl.steps.selftests.Build`)."""

    key: str
    seconds: float
    cached: bool
    make_status: int
    not_built: list[str]
    tests: int


class SelftestEntry(TypedDict):
    """One selftest's outcome, from the guest's KTAP output."""

    name: str
    collection: str
    number: int | None
    result: str  # pass, fail, skip, xfail (labctl.trace.ktap)
    directive: str | None
    reason: str | None
    time_s: float | None
    log: str  # its log file, relative to the bundle
    subtests: dict[str, int] | None
    failed_subtests: list[str]


class HardwareRecord(TypedDict):
    """The two ends of a hardware-mode kselftest step's link (:mod:`labctl.steps.drivertests`)."""

    netif: str
    peer: str
    local: str
    remote: str


class SelftestRecord(TypedDict, total=False):
    """A ``kselftest:`` step's record (:mod:`labctl.steps.selftests`): the build, then the results."""

    guest: str
    tree: str
    target: str
    build: BuildRecord
    tests: list[SelftestEntry]
    counts: dict[str, int]
    missing: int  # selftests the plan announced that never reported
    plan: int | None
    bailed: str | None  # the 'Bail out!' line's text
    error: str  # the runner did not run (no KTAP output)
    only_tests_failed: bool  # the lab was fine: only selftests failed (the next variant still runs)
    hardware: HardwareRecord  # drivers/net's hardware mode: the NIC under test and its peer

@dataclass(frozen=True)
class Kselftest:
    """The selftests a step runs: ``tests`` of ``target`` in ``tree`` (absolute), on ``guest`` (a template)."""

    guest: str
    tree: str  # absolute (a string: the lab is kept in the state as JSON)
    target: str = DEFAULT_TARGET
    tests: tuple[str, ...] = ()  # () = all of the target's
    timeout: int = DEFAULT_TIMEOUT
    line: int = 0
    netif: str = ""  # hardware mode (drivers/net): the guest's NIC under test (a template) ...
    peer: str = ""  # ... and the guest at the other end of its network (a template)

    @property
    def from_debian(self) -> bool:
        """The tree is the guest's Debian kernel's source, unpacked when the step first needs it."""
        return self.tree == DEBIAN

    @property
    def source(self) -> Path:
        return Path(self.tree) / SELFTESTS / self.target


def parse(check: Checker, m: YamlMap, path: str, guests: set[str], trusted: tuple[Path, ...],
          each_guest: Callable[[str, int, str], None]) -> Kselftest | None:
    """``m[kselftest]`` checked; every problem reported at its line. ``each_guest(template, line, path)``
    checks the guest as every matrix row fills it in."""
    where = join(path, "kselftest")
    body = check.mapping(m["kselftest"], m.value_line("kselftest"), where, allow_null=False)
    if body is None:
        return None
    check.keys(body, where, KEYS, ("tree",))
    guest = check.string(body, "guest", where)
    if guest is None and "guest" not in body:
        if len(guests) == 1:
            guest = next(iter(guests))
        else:
            check.add(body.line, where, "missing required key 'guest' (the lab has more than one guest)")
    elif guest is not None:
        each_guest(guest, body.value_line("guest"), join(where, "guest"))
    target = check.matching(body, "target", where, _TARGET, "selftest target",
                            "a directory of tools/testing/selftests, e.g. net or net/forwarding") or DEFAULT_TARGET
    timeout = check.integer(body, "timeout", where, (1, 86400), " s")
    debian = body.get("tree") == DEBIAN
    tree = Path(DEBIAN) if debian else _tree(check, body, where, trusted)
    tests = _tests(check, body, where, None if debian else tree, target)
    netif, peer = _hardware(check, body, where, each_guest)
    if guest is None or tree is None or tests is None or netif is None or peer is None:
        return None
    if peer and peer == guest:
        check.add(body.value_line("peer"), join(where, "peer"), f"the peer is the guest under test ('{guest}')")
        return None
    return Kselftest(guest, str(tree), target, tests, timeout or DEFAULT_TIMEOUT, body.line, netif, peer)


_NIC_TEMPLATE = re.compile(r"[A-Za-z0-9_.{}-]{1,64}")


def _hardware(check: Checker, body: YamlMap, where: str,
              each_guest: Callable[[str, int, str], None]) -> tuple[str | None, str | None]:
    """``netif`` and ``peer``, both or neither: ("", "") for software mode, None for a problem."""
    netif = check.matching(body, "netif", where, _NIC_TEMPLATE, "NIC name", "a NIC of the guest, e.g. eth1")
    peer = check.string(body, "peer", where)
    if ("netif" in body) != ("peer" in body):
        have, lack = ("netif", "peer") if "netif" in body else ("peer", "netif")
        check.add(body.value_line(have), join(where, lack),
                  f"'{have}' needs '{lack}' too: the driver tests' hardware mode has a NIC under test and a peer")
        return None, None
    if "netif" not in body:
        return "", ""
    if netif is None or peer is None:
        return None, None
    each_guest(peer, body.value_line("peer"), join(where, "peer"))
    return netif, peer


def _tree(check: Checker, body: YamlMap, where: str, trusted: tuple[Path, ...]) -> Path | None:
    text = check.string(body, "tree", where, required=True)
    if not text:
        return None
    line, key = body.value_line("tree"), join(where, "tree")
    tree = (Path(check.file).parent / os.path.expanduser(text)).resolve()
    why = named_path_reason(tree, trusted, check.owner, check.remote, check.remote_root)
    if why is not None:
        check.add(line, key, f"kernel tree {tree} is not trusted (labctl runs make there as you): {why}; "
                             f"pass --trust-dir {shlex.quote(str(tree))} (or {TRUST_ENV}) if you trust it")
        return None
    if not (tree / SELFTESTS / "Makefile").is_file():
        check.add(line, key, f"{tree} is not a kernel source tree (no {SELFTESTS}/Makefile)")
        return None
    return tree


def _tests(check: Checker, body: YamlMap, where: str, tree: Path | None, target: str) -> tuple[str, ...] | None:
    src = tree / SELFTESTS / target if tree is not None else None
    if src is not None and not (src / "Makefile").is_file():
        check.add(body.value_line("target") if "target" in body else body.line, join(where, "target"),
                  f"no selftest target '{target}' in {tree} (no {SELFTESTS}/{target}/Makefile)")
        src = None
    value = body.get("tests")
    if value is None:
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        check.add(body.value_line("tests"), join(where, "tests"), "expected a list of test names")
        return None
    ok = True
    seen: set[str] = set()
    for i, name in enumerate(value):
        line = value.item_line(i) if hasattr(value, "item_line") else body.value_line("tests")
        if not _TEST.fullmatch(name):
            check.add(line, f"{where}.tests[{i}]", f"invalid test name '{name}'")
            ok = False
        elif name in seen:
            check.add(line, f"{where}.tests[{i}]", f"'{name}' is listed twice")
            ok = False
        elif src is not None and not ((src / name).is_file() or (src / f"{name}.c").is_file()):
            check.add(line, f"{where}.tests[{i}]", f"no test '{name}' in {src} (neither {name} nor {name}.c)")
            ok = False
        seen.add(name)
    return tuple(value) if ok else None
