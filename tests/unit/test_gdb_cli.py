"""``labctl gdb``: argument parsing, the init script, source paths, targets, --batch."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

import pytest

from labctl.backends import get_backend
from labctl.backends.base import GuestRecord
from labctl.cli import gdb_cmd
from labctl.debug.gdb import (
    BackendMonitor,
    DebugError,
    GdbStub,
    build_paths,
    find_source_dir,
    gdb_target,
    init_script,
    source_commands,
    write_init_script,
)
from labctl.errors import LabStateError
from labctl.lab.uri import SshHop
from labctl.ssh import hop_forward_argv
from labctl.state.runstate import LabState

MANIFEST = {"kernel": {"release": "6.1.0-56-amd64", "version": "6.1.192-2"}}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="labctl")
    gdb_cmd.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_arguments() -> None:
    args = parse("gdb", "lab", "a")
    assert (args.lab, args.guest, args.batch, args.no_modules) == ("lab", "a", None, False)
    assert args.func is gdb_cmd.cmd_gdb
    args = parse("gdb", "lab", "a", "--batch", "bt 2", "info registers rip", "--batch", "p 1", "--no-modules")
    assert args.batch == ["bt 2", "info registers rip", "p 1"]
    assert args.no_modules


def test_init_script_loads_modules_quietly_then_attaches() -> None:
    lines = init_script("/run/g/gdb.sock", ["add-symbol-file /m/e1000.ko 0x1"], ["directory /src"]).splitlines()
    assert lines.index("set confirm off") < lines.index("add-symbol-file /m/e1000.ko 0x1")
    assert lines.index("set logging redirect on") < lines.index("add-symbol-file /m/e1000.ko 0x1") \
        < lines.index("set logging enabled off") < lines.index("target remote /run/g/gdb.sock")
    assert lines.index("directory /src") < lines.index("target remote /run/g/gdb.sock")
    assert "define hook-kill" in lines  # 'kill' would end QEMU
    assert lines[-3:-1] == ["set pagination on", "set confirm on"]  # interactive: gdb's usual prompts
    batch = init_script("/run/g/gdb.sock", [], interactive=False).splitlines()
    assert batch[-1] == "target remote /run/g/gdb.sock"
    assert "set logging redirect on" not in batch


@pytest.mark.parametrize("path", ["relative.sock", "/a b/gdb.sock", "/host:1234"])
def test_init_script_refuses_a_socket_path_gdb_would_misread(path: str) -> None:
    with pytest.raises(DebugError, match="spaces or ':'"):
        init_script(path, [])


def test_debian_build_paths_longest_first() -> None:
    assert build_paths(MANIFEST) == [
        "/build/reproducible-path/linux-6.1.192/debian/build/build_amd64_none_amd64",
        "/build/reproducible-path/linux-6.1.192",
        "debian/build/build_amd64_none_amd64",
    ]
    assert build_paths({}) == ["debian/build/build_amd64_none_amd64"]


def test_source_commands(tmp_path: Path) -> None:
    assert source_commands(None, MANIFEST) == []
    cmds = source_commands(tmp_path, MANIFEST)
    assert cmds[0] == f"set substitute-path /build/reproducible-path/linux-6.1.192/debian/build/" \
                      f"build_amd64_none_amd64 {tmp_path}"
    assert cmds[-1] == f"directory {tmp_path}"


def test_find_source_dir(tmp_path: Path) -> None:
    assert find_source_dir(tmp_path) is None
    src = tmp_path / "source"
    src.mkdir()
    assert find_source_dir(tmp_path) == src  # no tree recognised: the folder itself
    (src / "linux-6.1.192").mkdir()
    (src / "linux-6.1.192" / "Makefile").touch()
    assert find_source_dir(tmp_path) == src / "linux-6.1.192"
    (src / "Makefile").touch()
    assert find_source_dir(tmp_path) == src


def test_init_script_is_private(tmp_path: Path) -> None:
    path = tmp_path / "g" / "gdb-init.gdb"
    path.parent.mkdir()
    path.write_text("old")
    os.chmod(path, 0o644)
    write_init_script(path, "target remote 127.0.0.1:1\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text() == "target remote 127.0.0.1:1\n"


def _state(tmp_path: Path, gdb: str | None = "/run/g/gdb.sock", vmlinux: bool = True) -> LabState:
    image = tmp_path / "image"
    image.mkdir(parents=True, exist_ok=True)
    (image / "vmlinux.debug").write_bytes(b"\x7fELF")
    if vmlinux:
        (image / "vmlinux.debug").write_bytes(b"\x7fELF")
    else:
        (image / "vmlinux.debug").unlink()
    (image / "manifest.json").write_text('{"release": "6.1.0-56-amd64", "debian": {"version": "6.1.192-2"}, '
                                         '"source": {"kind": "debian", "release": "6.1.0-56-amd64"}}')
    gdir = tmp_path / "run" / "guests" / "a"
    gdir.mkdir(parents=True, exist_ok=True)
    rec = GuestRecord(name="a", backend="qemu", pid=1, dir=str(gdir), console=str(gdir / "console.log"),
                      qmp=str(gdir / "qmp.sock"), ssh_port=2222, accel="tcg", gdb=gdb)
    return LabState(lab="lab", source="lab.yaml", dir=str(tmp_path / "run"), backend="qemu", accel="tcg",
                    image={"name": "debian-12", "dir": str(image)}, started_at="now", guests={"a": rec},
                    kernels={"a": str(image)})  # the guest's prepared kernel (here: the same directory)


def test_gdb_target(tmp_path: Path) -> None:
    t = gdb_target(_state(tmp_path), "a")
    assert t.socket == "/run/g/gdb.sock"
    assert t.stub == GdbStub("/run/g/gdb.sock")
    assert t.vmlinux == tmp_path / "image" / "vmlinux.debug"
    assert t.debug_modules == tmp_path / "image" / "debug-modules"
    assert t.monitor == BackendMonitor(get_backend("qemu"), _state(tmp_path).guests["a"])
    assert t.manifest["debian"]["version"] == "6.1.192-2" and t.kernel.release == "6.1.0-56-amd64"
    assert t.source_dir is None


def test_gdb_target_errors(tmp_path: Path) -> None:
    with pytest.raises(LabStateError, match="has no guest 'b'"):
        gdb_target(_state(tmp_path), "b")
    with pytest.raises(DebugError, match="has no gdbstub"):
        gdb_target(_state(tmp_path, gdb=None), "a")
    with pytest.raises(DebugError, match="kernel 6.1.0-56-amd64 has no vmlinux with debug info") as exc:
        gdb_target(_state(tmp_path / "x", vmlinux=False), "a")
    assert exc.value.exit_code == 4


def test_gdb_target_on_a_libvirt_host(tmp_path: Path) -> None:
    """A guest on a qemu+ssh host has its gdbstub's socket on that host: gdb
    reaches it through an OpenSSH stream-local forward with the URI's account."""
    state = _state(tmp_path, gdb="/var/lib/libvirt/labctl-run/labctl-lab-a/gdb.sock")
    state.backend = "libvirt"
    rec = state.guests["a"]
    hop = {"host": "lab2", "port": 2200, "user": "tr ainer;x", "keyfile": "/k/id", "no_verify": True}
    rec.extra = {"uri": "qemu+ssh://lab2/system", "ssh_via": hop}
    t = gdb_target(state, "a")
    assert t.monitor == BackendMonitor(get_backend("libvirt"), rec)
    assert t.stub == GdbStub("/var/lib/libvirt/labctl-run/labctl-lab-a/gdb.sock",
                             SshHop("lab2", 2200, "tr ainer;x", "/k/id", True))
    assert t.stub.where == "/var/lib/libvirt/labctl-run/labctl-lab-a/gdb.sock on host lab2"
    assert hop_forward_argv(t.stub.via, "/here/gdb-fwd.sock", t.stub.path) == [  # type: ignore[arg-type]
        "ssh", "-p", "2200", "-l", "tr ainer;x", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-i", "/k/id",
        "-o", "StrictHostKeyChecking=no", "-N", "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
        "-L", "/here/gdb-fwd.sock:/var/lib/libvirt/labctl-run/labctl-lab-a/gdb.sock", "--", "lab2"]
    # a guest on this machine: its socket itself, no forward
    with GdbStub.of("/run/g/gdb.sock").local(tmp_path) as local:
        assert local == "/run/g/gdb.sock"


FAKE_GDB = """#!{python}
import sys
open({log!r}, "w").write("\\n".join(sys.argv[1:]))
print("#0  0xffffffff81a592eb in native_safe_halt () at arch/x86/include/asm/irqflags.h:52")
print("[Inferior 1 (process 1) detached]")
print("52\\tarch/x86/include/asm/irqflags.h: No such file or directory.", file=sys.stderr)
sys.exit({status})
"""


def _fake_gdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "argv.txt"
    gdb = bin_dir / "gdb"
    gdb.write_text(FAKE_GDB.format(python=sys.executable, log=str(log), status=status))
    gdb.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_batch_runs_the_commands_then_detaches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    log = _fake_gdb(tmp_path, monkeypatch, 0)
    target = gdb_target(_state(tmp_path), "a")
    assert gdb_cmd.run_batch(target, "/run/init.gdb", ["bt 2", "p $rip"], timeout=30) == 0
    argv = log.read_text().splitlines()
    assert argv == ["-q", "-nx", "-batch", "-x", "/run/init.gdb", "-ex", "bt 2", "-ex", "p $rip", "-ex", "detach",
                    str(target.vmlinux)]
    captured = capsys.readouterr()
    assert "#0  0xffffffff81a592eb in native_safe_halt ()" in captured.out
    assert "No such file or directory" in captured.err


def test_batch_failure_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gdb(tmp_path, monkeypatch, 1)
    target = gdb_target(_state(tmp_path), "a")
    with pytest.raises(DebugError, match="gdb failed \\(exit status 1\\): 52\tarch/x86"):
        gdb_cmd.run_batch(target, "/run/init.gdb", ["bt 2"], timeout=30)


def test_labctl_itself_has_the_gdb_command() -> None:
    """The real parser (cli/main.py), not one this file builds: without gdb_cmd.register there it fails."""
    from labctl.cli.main import build_parser

    args = build_parser().parse_args(["gdb", "lab", "a", "--batch", "bt"])
    assert args.func is gdb_cmd.cmd_gdb and args.batch == ["bt"]
