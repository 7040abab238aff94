"""Issue 19, item 1, against a real libvirt: a lab file's libvirt URI never names a
host program. libvirt splits a URI's query on ';' as well as '&' and runs the
``command=`` it finds there as its ssh (as whoever runs labctl, often root); labctl
reads the query the same way and refuses every parameter but ``keyfile`` from a lab
file, so ``up`` exits 2 before anything connects and the program never runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.image.store import Image
from tests.conftest import Cli
from tests.integration.conftest import require_libvirtd


def _program(tmp_path: Path) -> tuple[Path, Path]:
    """A harmless stand-in for any program: it records that it ran (and with what)."""
    marker = tmp_path / "program-ran"
    prog = tmp_path / "prog"
    prog.write_text(f'#!/bin/sh\necho "$@" > {marker}\nexit 1\n')
    prog.chmod(0o755)
    return prog, marker


def test_libvirt_itself_runs_a_command_given_after_a_semicolon(tmp_path: Path) -> None:
    """The premise: what libvirt does with the issue's URI when nothing stops it."""
    require_libvirtd()
    libvirt = pytest.importorskip("libvirt")
    prog, marker = _program(tmp_path)
    with pytest.raises(libvirt.libvirtError):
        libvirt.open(f"qemu+ssh://127.0.0.1/system?keyfile=/k;command={prog}")
    assert marker.is_file() and "127.0.0.1" in marker.read_text()  # run as the ssh binary


@pytest.mark.parametrize("query", [
    "keyfile=/k;command={prog}",  # the reproduction
    "keyfile=/k&no_verify=1;command={prog}",  # ';' after the last '&'
    "keyfile=/k&comm%61nd={prog}",  # a percent-encoded name
])
def test_up_of_a_lab_whose_uri_names_a_program_never_runs_it(query: str, tmp_path: Path, cli: Cli,
                                                              image: Image) -> None:
    require_libvirtd()
    prog, marker = _program(tmp_path)
    lab = tmp_path / "lab.yaml"
    uri = f"qemu+ssh://127.0.0.1/system?{query.format(prog=prog)}"
    lab.write_text(f'name: uri-prog\nhosts:\n  h2: {{uri: "{uri}"}}\nnetworks: {{}}\nguests:\n  a: {{host: h2}}\n')
    up = cli("up", str(lab), "--accel", "tcg", "--boot-timeout", "60", timeout=300)
    assert not marker.exists(), f"libvirt ran the program the lab file named: {up.stderr}"
    validate = cli("validate", str(lab), timeout=60)
    for r in (up, validate):
        assert r.returncode == 2 and "lab.yaml:3: hosts.h2.uri:" in r.stderr, (r.args, r.stdout, r.stderr)
    assert cli("status", "--json", timeout=60).stdout.count("uri-prog") == 0


def test_the_no_verify_reproduction_is_refused(tmp_path: Path, cli: Cli) -> None:
    lab = tmp_path / "lab.yaml"
    lab.write_text('name: uri-nv\nhosts:\n  h2: {uri: "qemu+ssh://127.0.0.1/system?keyfile=/k;no_verify=1"}\n'
                   'networks: {}\nguests:\n  a: {host: h2}\n')
    r = cli("validate", str(lab), timeout=60)
    assert r.returncode == 2 and "cannot switch off host key checks" in r.stderr, r.stderr
