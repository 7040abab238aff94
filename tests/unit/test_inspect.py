"""labctl.inspect's parsers and file formats, on recorded real inputs: QEMU's memory map (a 512 MiB
guest booted, a 4.5 GiB one before boot: RAM above 4 GiB), a guest kernel's VMCOREINFO note, the
flattened kdump stream; guest memory read from this very process's /proc/self/mem; the user's code
run against a drgn program; the command line's refusals."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.errors import DebugError, HostError, UsageError
from labctl.inspect import kdump, vmcoreinfo
from labctl.inspect.memory import GuestMemory, Mapped, RamRange, parse_gpa2hva, ram_ranges

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "inspect"


# -- QEMU's memory map -------------------------------------------------------------------------

def test_a_booted_512m_guest_is_one_ram_range_with_the_bios_area_merged_in() -> None:
    ranges = ram_ranges((FIX / "mtree-512m.txt").read_text())
    # pc.ram below 640K, its PAM-mapped BIOS area (rom/ram pieces at the same offsets), then the rest
    assert ranges == [RamRange(0, 512 << 20, "pc.ram", 0)]


def test_a_guest_over_the_pci_hole_has_ram_above_4g_at_its_offset_in_the_block() -> None:
    ranges = ram_ranges((FIX / "mtree-4608m-preboot.txt").read_text())
    assert ranges == [RamRange(0, 0xc0000, "pc.ram", 0),  # then pc.rom and pc.bios (left out)
                      RamRange(0x100000, 0xc0000000 - 0x100000, "pc.ram", 0x100000),
                      RamRange(1 << 32, 0x60000000, "pc.ram", 0xc0000000)]
    assert sum(r.size for r in ranges) == (4608 << 20) - 0x40000  # all of RAM but the BIOS area


def test_a_map_without_ram_is_refused() -> None:
    with pytest.raises(DebugError, match="no guest RAM"):
        ram_ranges('FlatView #0\n AS "memory", root: system\n'
                   '  00000000fffc0000-00000000ffffffff (prio 0, rom): pc.bios\n')


def test_gpa2hva_must_name_the_ram_block() -> None:
    assert parse_gpa2hva("Host virtual address for 0x100000 (pc.ram) is 0x7face7f00000\r\n", "pc.ram") == 0x7face7f00000
    with pytest.raises(DebugError):
        parse_gpa2hva("Host virtual address for 0xfffc0000 (pc.bios) is 0x7f00", "pc.ram")
    with pytest.raises(DebugError):
        parse_gpa2hva("No memory is mapped at address 0x100000000", "pc.ram")


# -- VMCOREINFO ---------------------------------------------------------------------------------

def test_the_sysfs_line_is_hex_address_and_hex_size() -> None:
    assert vmcoreinfo.parse_sysfs("0x000000001ef24000 1024\n") == (0x1ef24000, 0x1024)
    for bad in ("", "0x1ef24000", "0x1ef24000 10000000", "0x0 1024", "1ef24000 1024; rm -rf /", "0xzz 10"):
        with pytest.raises(DebugError):
            vmcoreinfo.parse_sysfs(bad)


def test_a_real_guest_note_gives_release_and_build_id() -> None:
    raw = (FIX / "vmcoreinfo-note.bin").read_bytes()  # read from a guest's memory where its sysfs said
    note = vmcoreinfo.parse_note(raw)
    assert note.startswith(b"OSRELEASE=6.1.0-56-amd64\n")
    assert vmcoreinfo.release(note) == "6.1.0-56-amd64"
    assert vmcoreinfo.build_id(note) == "eb4fbcd037e7253717950bf2b93bd5566f47c56f"
    f = vmcoreinfo.fields(note)
    assert f["SYMBOL(swapper_pg_dir)"] == "ffffffff82a10000" and f["NUMBER(phys_base)"] == "0"
    assert kdump.uts_address(note) == 0xffffffff82bfb000


def test_a_note_that_is_not_vmcoreinfo_or_overruns_is_refused() -> None:
    raw = (FIX / "vmcoreinfo-note.bin").read_bytes()
    with pytest.raises(DebugError, match="no VMCOREINFO"):
        vmcoreinfo.parse_note(raw.replace(b"VMCOREINFO", b"CORE\0\0\0\0\0\0", 1))
    with pytest.raises(DebugError, match="no VMCOREINFO"):
        vmcoreinfo.parse_note(struct.pack("<III", 11, 1 << 20, 0) + raw[12:])  # descsz beyond the bytes
    with pytest.raises(DebugError, match="KEY=VALUE"):
        vmcoreinfo.parse_note(raw[:40] + b"\x1b[2J" + raw[44:])
    with pytest.raises(DebugError, match="truncated"):
        vmcoreinfo.parse_note(raw[:8])


# -- guest memory, read from a process's /proc/PID/mem -------------------------------------------

def test_guest_memory_reads_inside_its_ranges_only() -> None:
    buf = ctypes.create_string_buffer(b"".join(bytes([i]) * 4096 for i in range(4)), 4 * 4096)
    hva = ctypes.addressof(buf)
    mapped = [Mapped(RamRange(0x10000, 4 * 4096, "pc.ram", 0), hva)]
    with GuestMemory.open(os.getpid(), lambda argv: True, mapped) as mem:
        assert mem.read(0x10000 + 4096, 4) == b"\x01" * 4
        assert mem.read(0x10000 + 3 * 4096 + 4090, 6) == b"\x03" * 6
        assert mem.size == 4 * 4096 and mem.alive()
        for gpa, size in ((0xf000, 8), (0x10000 + 4 * 4096 - 2, 4), (0, 1)):
            with pytest.raises(DebugError, match="not guest RAM"):
                mem.read(gpa, size)


def test_guest_memory_refuses_a_process_that_is_not_the_guests_qemu() -> None:
    with pytest.raises(DebugError, match="not the guest's QEMU"):
        GuestMemory.open(os.getpid(), lambda argv: False, [])
    with pytest.raises(DebugError, match="not running"):
        GuestMemory.open(2 ** 22 + 12345, lambda argv: True, [])


# -- QEMU's flattened kdump stream ---------------------------------------------------------------

def _flat(records: list[tuple[int, bytes]]) -> bytes:
    head = (b"makedumpfile".ljust(16, b"\0") + struct.pack(">qq", 1, 1)).ljust(kdump.FLAT_HEADER, b"\0")
    body = b"".join(struct.pack(">qq", off, len(data)) + data for off, data in records)
    return head + body + struct.pack(">qq", -1, -1)


def _fd(tmp_path: Path, name: str, data: bytes = b"") -> int:
    p = tmp_path / name
    p.write_bytes(data)
    return os.open(p, os.O_RDWR)


def test_a_flattened_stream_is_written_record_by_record_at_its_offsets(tmp_path: Path) -> None:
    src = _fd(tmp_path, "flat", _flat([(4096, b"B" * 10), (0, b"KDUMP   "), (8192, b"C" * 3)]))
    dst = _fd(tmp_path, "out")
    assert kdump.reassemble(src, dst, 1 << 20) == 3
    data = (tmp_path / "out").read_bytes()
    assert data[:8] == b"KDUMP   " and data[4096:4106] == b"B" * 10 and data[8192:] == b"CCC"


def test_a_flattened_stream_out_of_bounds_or_truncated_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DebugError, match="out of bounds"):
        kdump.reassemble(_fd(tmp_path, "a", _flat([(1 << 40, b"x")])), _fd(tmp_path, "o1"), 1 << 30)
    with pytest.raises(DebugError, match="out of bounds"):
        kdump.reassemble(_fd(tmp_path, "b", _flat([(-5, b"x")])), _fd(tmp_path, "o2"), 1 << 30)
    with pytest.raises(DebugError, match="middle of a record"):
        kdump.reassemble(_fd(tmp_path, "c", _flat([(0, b"xyz")])[:-20]), _fd(tmp_path, "o3"), 1 << 30)
    with pytest.raises(DebugError, match="not a flattened"):
        kdump.reassemble(_fd(tmp_path, "d", b"KDUMP   ".ljust(8192, b"\0")), _fd(tmp_path, "o4"), 1 << 30)


def _kdump_header(note: bytes) -> bytes:
    head = bytearray(3 * 4096)
    head[:8] = b"KDUMP   "
    head[12 + 4 * 65:12 + 4 * 65 + 6] = b"x86_64"  # what QEMU fills in
    struct.pack_into("<i", head, kdump.BLOCK_SIZE_OFFSET, 4096)
    struct.pack_into("<QQ", head, 4096 + 32, 8192, len(note))
    head[8192:8192 + len(note)] = note
    return bytes(head)


def test_the_kdump_header_gets_a_sane_utsname_from_its_own_note(tmp_path: Path) -> None:
    note = vmcoreinfo.parse_note((FIX / "vmcoreinfo-note.bin").read_bytes())
    fd = _fd(tmp_path, "core", _kdump_header(note))
    assert kdump.note_of(fd) == note
    kdump.set_utsname(fd, kdump.placeholder_utsname(vmcoreinfo.release(note)))
    data = (tmp_path / "core").read_bytes()
    fields = [data[12 + i * 65:12 + (i + 1) * 65].rstrip(b"\0") for i in range(6)]
    assert fields == [b"Linux", b"", b"6.1.0-56-amd64", b"#?", b"x86_64", b""]
    assert all(data[12 + i * 65 + 64] == 0 for i in range(6))  # each field NUL-terminated


def test_a_kdump_file_without_vmcoreinfo_says_why(tmp_path: Path) -> None:
    with pytest.raises(DebugError, match="no VMCOREINFO") as exc:
        kdump.note_of(_fd(tmp_path, "core", _kdump_header(b"")))
    assert "-device vmcoreinfo" in (exc.value.hint or "")


# -- the QEMU command line ------------------------------------------------------------------------

def test_every_qemu_guest_has_the_vmcoreinfo_device(tmp_path: Path) -> None:
    from labctl.backends.qemu.argv import build_argv
    from tests.unit.test_qemu_argv import _plans

    for plan in _plans(tmp_path, ROOT / "labs" / "quickstart.yaml").values():
        argv = build_argv(plan)
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "-device"].count("vmcoreinfo") == 1


# -- the user's code against a drgn program -------------------------------------------------------

def test_code_exits_with_its_status_and_its_own_traceback() -> None:
    import drgn

    from labctl.inspect import run_code

    prog = drgn.Program()
    assert run_code(prog, "assert prog is not None and callable(container_of)").status == 0
    assert run_code(prog, "import sys; sys.exit(7)").status == 7
    assert run_code(prog, "import sys; sys.exit('bye')").message == "bye"
    failed = run_code(prog, "x = 1\nundefined_name")
    assert failed.status == 1
    assert failed.traceback.splitlines()[1].strip() == 'File "<-c>", line 2, in <module>'  # none of labctl's frames
    assert "NameError" in failed.traceback
    with pytest.raises(KeyboardInterrupt):
        run_code(prog, "raise KeyboardInterrupt")


def test_a_script_gets_its_arguments_and_prog(tmp_path: Path) -> None:
    import drgn

    from labctl.inspect import run_script

    script = tmp_path / "s.py"
    script.write_text("import sys\nassert prog is not None\nsys.exit(len(sys.argv))\n")
    argv_before = list(sys.argv)
    assert run_script(drgn.Program(), script, ["--x", "y"]).status == 3
    assert sys.argv == argv_before
    with pytest.raises(DebugError, match="no script"):
        run_script(drgn.Program(), tmp_path / "missing.py", [])


# -- refusals -------------------------------------------------------------------------------------

def test_without_drgn_a_clear_error_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.inspect.program import require_drgn

    monkeypatch.setitem(sys.modules, "drgn", None)
    with pytest.raises(HostError, match="drgn is not installed") as exc:
        require_drgn()
    assert exc.value.exit_code == 3 and "drgn==0.3.0" in (exc.value.hint or "")


def test_the_cli_without_drgn_exits_3_without_a_traceback(tmp_path: Path) -> None:
    core = tmp_path / "x.vmcore"
    core.write_bytes(b"\0" * 64)
    code = ("import sys; sys.modules['drgn'] = None\nfrom labctl.cli.main import main\n"
            f"sys.exit(main(['drgn', '--core', {str(core)!r}, '-c', 'pass']))")
    res = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 3, res.stderr
    assert "drgn is not installed" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("argv, message", [
    (["dx"], "needs LAB GUEST"),
    (["dx", "a", "-c", "1", "s.py"], "-c CODE or SCRIPT"),
    (["dx", "a", "--json", "-c", "1"], "--json goes with --summary"),
    (["--core", "x", "--pause"], "--pause is for a running guest"),
    (["dx", "a", "--vmlinux", "v"], "go with --core"),
    (["--core", "x", "--modules", "m"], "--modules goes with --vmlinux"),
    (["dx", "a", "--summary", "-c", "1"], "without code"),
    (["dx", "a", "--nic", "eth1"], "--nic goes with --summary"),
])
def test_command_line_refusals(argv: list[str], message: str) -> None:
    from labctl.cli.drgn_cmd import _parse
    from labctl.cli.main import build_parser

    args = build_parser().parse_args(["drgn", *argv])
    with pytest.raises(UsageError, match=message):
        _parse(args)


def test_options_after_the_guest_are_labctls_and_words_after_the_script_are_its() -> None:
    from labctl.cli.drgn_cmd import _parse
    from labctl.cli.main import build_parser

    args = build_parser().parse_args(["drgn", "dx@1", "a", "--pause", "s.py", "--pause", "-c", "x"])
    assert _parse(args) == ("dx@1", "a", ["s.py", "--pause", "-c", "x"]) and args.pause and args.code is None
    args = build_parser().parse_args(["drgn", "dx", "a", "-c", "print(1)", "--pause"])
    assert _parse(args) == ("dx", "a", []) and args.code == "print(1)" and args.pause
    args = build_parser().parse_args(["drgn", "--core", "v.core", "--summary", "--nic", "eth1"])
    assert _parse(args) == (None, None, []) and args.summary and args.nic == ["eth1"]


def test_a_kernel_without_debug_info_says_what_gives_it_one(tmp_path: Path) -> None:
    import json

    from labctl.inspect import debuginfo
    from labctl.kernel.cached import Kernel

    for source, says in (({"kind": "debian", "release": "6.1.0-56-amd64"}, "linux-image-6.1.0-56-amd64-dbg"),
                         ({"kind": "tree", "tree": "/src/linux"}, "CONFIG_DEBUG_INFO_DWARF5"),
                         ({"kind": "files", "image": "/k/bzImage"}, "debug: VMLINUX")):
        d = tmp_path / source["kind"]
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({"release": "6.1.0-56-amd64", "source": source}))
        with pytest.raises(HostError, match="has no vmlinux with debug info") as exc:
            debuginfo.for_kernel(Kernel.at(d))
        assert exc.value.exit_code == 3 and says in (exc.value.hint or "")
    with pytest.raises(HostError, match="no kernel prepared on this machine has build ID ab12") as exc:
        debuginfo.for_vmcore("ab12", "6.9.0", None)
    assert "--vmlinux" in (exc.value.hint or "")
    with pytest.raises(UsageError, match="is not a file"):
        debuginfo.for_vmcore("ab12", "6.9.0", tmp_path / "nope")


def test_a_guest_on_a_remote_libvirt_host_is_refused_with_exit_3() -> None:
    from labctl.backends.base import GuestRecord
    from labctl.inspect.guest_target import guest_target

    class State:  # what a lab state records of such a guest
        lab, backend = "x", "libvirt"
        guests = {  # noqa: RUF012 - a stand-in record, never changed
            "a": GuestRecord(name="a", backend="libvirt", pid=0, dir="/nonexistent", console="", qmp="",
                                   ssh_port=22, accel="tcg", extra={"remote": True, "host": "h2",
                                                                    "domain": "labctl-x-a",
                                                                    "uri": "qemu+ssh://root@h2/system"})}

        def endpoint(self, guest: str) -> object:
            return object()

        def kernel(self, guest: str) -> object:
            raise AssertionError("never asked")

    with pytest.raises(HostError, match="runs on remote libvirt host h2") as exc:
        guest_target(State(), "a")  # type: ignore[arg-type]
    assert exc.value.exit_code == 3 and "labctl gdb" in (exc.value.hint or "")


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/sbin/runuser").exists(), reason="plays another user: root only")
def test_another_user_cannot_read_a_process_memory_and_is_told_what_to_do() -> None:
    """Another local user running labctl's reader on a process of root's (the role of a lab owner's
    QEMU) is refused by the kernel: a clear error and the way round it, no traceback."""
    code = ("import sys; sys.path.insert(0, '.')\nfrom labctl.errors import HostError\n"
            "from labctl.inspect.memory import GuestMemory\n"
            f"try:\n    GuestMemory.open({os.getpid()}, lambda argv: True, [])\n"
            "except HostError as e:\n    print(e.exit_code, e.message, '|', e.hint)\n")
    res = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", code], cwd=ROOT, check=False,
                         capture_output=True, text=True, timeout=60)
    assert res.stdout.startswith("3 this user may not read the memory of the guest's QEMU"), res.stdout + res.stderr
    assert "labctl dump" in res.stdout and "Traceback" not in res.stderr
