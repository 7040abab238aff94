"""Debug info that travels in a pack: a Debian kernel's -dbg package pinned by digest (``--with-debug``),
and a loose kernel given with its debug file keeping its modules with DWARF as its debug modules (a packed
tree kernel's, where it is opened)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import labctl.kernel.prepare as prep
from labctl.errors import UsageError
from labctl.image import sha256_file
from labctl.kernel import Kernel
from labctl.kernel.vmlinux import has_dwarf
from labctl.lab.kernels import FILES, KernelSpec
from labctl.pack import check_archive, check_kernels, identity
from labctl.pack.packfile import PackIndex

RELEASE = "6.1.0-56-amd64"
UNSIGNED, DBG = f"linux-image-{RELEASE}-unsigned", f"linux-image-{RELEASE}-dbg"


def elf(sections: list[str], tail_merged: bool = False) -> bytes:
    """A 64-bit ELF file with empty sections of these names (``tail_merged``: ``.debug_info``'s name is
    the tail of ``.rela.debug_info``'s, as linkers write it)."""
    names = b"\0.shstrtab\0"
    offsets = []
    for n in sections:
        if tail_merged and n == ".debug_info" and b".rela.debug_info\0" in names:
            offsets.append(names.index(b".rela.debug_info\0") + len(".rela"))
            continue
        offsets.append(len(names))
        names += n.encode() + b"\0"
    shoff = 64 + len(names)
    headers = [bytes(64)] + [struct.pack("<IIQQQQIIQQ", off, 1, 0, 0, 64, 0, 0, 0, 1, 0) for off in offsets]
    headers.append(struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0))
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(headers),
                                 len(headers) - 1)
    return header + names + b"".join(headers)


def test_dwarf_is_told_by_the_section_names(tmp_path: Path) -> None:
    assert not has_dwarf(Path("/dev/null"))
    for data, want in ((elf([".text", ".debug_info"]), True), (elf([".text", ".rela.debug_info", ".debug_info"],
                       tail_merged=True), True), (elf([".text", ".rela.debug_info"]), False), (elf([".text"]), False)):
        p = tmp_path / "probe.ko"
        p.write_bytes(data)
        assert has_dwarf(p) is want, data


def test_a_loose_kernel_with_its_debug_file_keeps_its_modules_with_dwarf(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    vmlinux = tmp_path / "vmlinux"
    vmlinux.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57 + b"Linux version 6.1.192-packed\0")
    mods = tmp_path / "modules" / "lib" / "modules" / "6.1.192-packed"
    (mods / "kernel" / "e1000").mkdir(parents=True)
    (mods / "extra").mkdir()
    (mods / "kernel" / "e1000" / "e1000.ko").write_bytes(elf([".text", ".debug_info"]))
    (mods / "extra" / "stripped.ko").write_bytes(elf([".text"]))
    (mods / "modules.order").write_text("kernel/e1000/e1000.ko\nextra/stripped.ko\n")
    opts = prep.Options(initramfs_modules=())
    spec = KernelSpec(FILES, image=vmlinux, modules=tmp_path / "modules", debug=vmlinux)
    k = prep.prepare(spec, opts)
    assert sorted(p.relative_to(k.debug_modules).as_posix() for p in k.debug_modules.rglob("*.ko")) == [
        "kernel/e1000/e1000.ko"]
    without = prep.prepare(KernelSpec(FILES, image=vmlinux, modules=tmp_path / "modules"), opts)
    assert without.dir != k.dir and not without.debug_modules.exists()


def _debian_kernel(d: Path) -> Kernel:
    return Kernel(d, {"source": {"kind": "debian", "release": RELEASE}, "release": RELEASE, "build_id": "ab" * 20,
                      "debian": {"package": UNSIGNED, "version": "6.1.192-2", "debug_package": DBG,
                                 "debug_version": "6.1.192-2"}})


def test_a_debian_dbg_package_packed_with_debug_is_pinned_by_digest(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    debs = {UNSIGNED: tmp_path / "unsigned.deb", DBG: tmp_path / "dbg.deb"}
    debs[UNSIGNED].write_bytes(b"kernel package")
    debs[DBG].write_bytes(b"debug package")
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(identity, "apt_download", lambda package, version: asked.append((package, version))
                        or debs[package])
    versions = {UNSIGNED: "6.1.192-2", DBG: "6.1.192-2"}
    monkeypatch.setattr(identity, "versions", lambda package: [versions[package]])
    kernel = _debian_kernel(tmp_path)
    assert "debug_sha256" not in identity.kernel_record(kernel)
    rec = identity.kernel_record(kernel, debug=True)
    assert rec["debug_sha256"] == sha256_file(debs[DBG])
    pinned = identity.Pinned("bug.labpack", PackIndex({"guests": {"b": rec}}), tmp_path, None)
    check_archive(pinned)
    check_kernels(pinned, {"b": kernel})
    debs[DBG].write_bytes(b"another debug package")
    with pytest.raises(UsageError, match=f"guest b: {DBG} 6.1.192-2 from the archive has sha256 .*, packed "
                                         f"{rec['debug_sha256'][:16]}; nothing started") as err:
        check_kernels(pinned, {"b": kernel})
    assert err.value.hint and "debug info" in err.value.hint
    assert asked and set(asked) == {(UNSIGNED, "6.1.192-2"), (DBG, "6.1.192-2")}  # by exact version, never the newest
    versions[DBG] = "6.1.192-3"
    with pytest.raises(UsageError, match=f"packed as {DBG} 6.1.192-2, the archive here has 6.1.192-3"):
        check_archive(pinned)
