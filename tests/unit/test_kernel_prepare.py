"""Preparing kernels without downloads: --kernel forms, built trees (keys, checks, the prepared
directory), module load order with built-in modules, and the preflight of a lab's kernels."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import labctl.kernel.guest_kernels as gk
import labctl.kernel.prepare as prep
from labctl.errors import ImageError, LabFileError, UsageError
from labctl.kernel.cached import KernelStore
from labctl.kernel.modules import builtin_names, module_load_order
from labctl.lab import load_lab_text
from labctl.lab.kernels import FILES, TREE, KernelSpec, debian, from_command_line

OPTS = prep.Options(initramfs_modules=("virtio_blk",))


def fake_tree(root: Path, release: str = "6.1.192-labctl-test", modules: bool = True) -> Path:
    """A kernel tree as `make` leaves it, with stand-in files: enough to be prepared."""
    tree = root / "linux"
    (tree / "include" / "config").mkdir(parents=True)
    (tree / "include" / "config" / "kernel.release").write_text(release + "\n")
    (tree / "vmlinux").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57 + b"Linux version " + release.encode() + b"\0")
    (tree / ".config").write_text("CONFIG_E1000=m\nCONFIG_VIRTIO_BLK=y\n")
    (tree / "System.map").write_text("ffffffff81000000 T _text\n")
    if modules:
        ko = tree / "drivers" / "net" / "ethernet" / "intel" / "e1000" / "e1000.ko"
        ko.parent.mkdir(parents=True)
        ko.write_bytes(b"e1000 module v1")
        (tree / "modules.order").write_text("drivers/net/ethernet/intel/e1000/e1000.ko\n")
        (tree / "modules.builtin").write_text("kernel/drivers/block/virtio_blk.ko\n")
    return tree


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- --kernel ------------------------------------------------------------------------------------

def test_command_line_forms(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path)
    (tmp_path / "bzImage").write_bytes(b"MZ")
    assert from_command_line("debian:6.1.0-53-rt-amd64", tmp_path).release == "6.1.0-53-rt-amd64"
    assert from_command_line("tree:linux", tmp_path).tree == tree
    assert from_command_line("linux", tmp_path).tree == tree  # a directory is a tree
    spec = from_command_line("bzImage", tmp_path)
    assert (spec.kind, spec.image) == (FILES, tmp_path / "bzImage")
    assert from_command_line("image:bzImage", tmp_path).image == tmp_path / "bzImage"
    k612 = from_command_line("debian:6.12.117+deb12-cloud-amd64", tmp_path)
    assert (k612.abi, k612.flavour, k612.series, k612.release) == (
        "6.12.117+deb12", "cloud-amd64", "6.12", "6.12.117+deb12-cloud-amd64")
    assert prep.debian_packages(k612) == ("linux-image-6.12.117+deb12-cloud-amd64-unsigned",
                                          "linux-image-6.12.117+deb12-cloud-amd64-dbg")
    assert debian("debian:6.1.0-56-amd64").series == "6.1"
    for bad in ("debian:6.1.0-53-arm64", "debian:latest", "", "debian:6.12.117+deb12-arm64",
                "debian:6.12.117-amd64", "debian:6.12.117+deb-amd64", "debian:6.12+deb12-amd64"):
        with pytest.raises(ValueError):
            from_command_line(bad, tmp_path)


def test_lab_file_paths_are_relative_to_the_lab_file(tmp_path: Path) -> None:
    fake_tree(tmp_path / "src")
    lab_dir = tmp_path / "labs"
    lab_dir.mkdir()
    (lab_dir / "l.yaml").write_text("name: l\nkernel: {tree: ../src/linux}\nnetworks: {}\n"
                                    "guests:\n  a: {}\n  b: {kernel: 'debian:6.1.0-53-amd64'}\n")
    from labctl.lab import load_lab

    lab = load_lab(lab_dir / "l.yaml")
    a, b = lab.kernel_of("a"), lab.kernel_of("b")
    assert a is not None and a.tree == tmp_path / "src" / "linux" and a.line == 2
    assert b is not None and b.release == "6.1.0-53-amd64" and b.path == "guests.b.kernel"
    # --kernel replaces every guest's choice
    forced = lab.with_kernel(debian("debian:6.1.0-56-rt-amd64", path="--kernel"))
    assert {g: (forced.kernel_of(g) or debian("debian:0.0.0-0-amd64")).release for g in "ab"} \
        == {"a": "6.1.0-56-rt-amd64", "b": "6.1.0-56-rt-amd64"}


# -- checks ---------------------------------------------------------------------------------------

def test_check_names_what_is_missing(tmp_path: Path) -> None:
    assert "no kernel tree at" in str(prep.check(KernelSpec(TREE, tree=tmp_path / "none")))
    unbuilt = tmp_path / "unbuilt"
    unbuilt.mkdir()
    (unbuilt / "Makefile").write_text("")
    assert "was not built" in str(prep.check(KernelSpec(TREE, tree=unbuilt)))
    assert prep.check(KernelSpec(TREE, tree=fake_tree(tmp_path))) is None
    why = prep.check(KernelSpec(FILES, image=tmp_path / "bz", modules=tmp_path / "m"))
    assert why is not None and "image" in why and str(tmp_path / "bz") in why


# ``apt-cache pkgnames linux-image-6.12`` here (Debian 12 with bookworm-security, 2026-12-01), cut
ARCHIVE_612 = ["linux-image-6.12-amd64-dbg", "linux-image-6.12.115+deb12-amd64-unsigned", "linux-image-6.12.107+deb12-amd64-dbg", "linux-image-6.12.107+deb12-amd64-unsigned", "linux-image-6.12.117+deb12-rt-amd64-unsigned", "linux-image-6.12.117+deb12-amd64-dbg", "linux-image-6.12.117+deb12-amd64-unsigned", "linux-image-6.12.117+deb12-rt-amd64-dbg", "linux-image-6.12.111+deb12-amd64-unsigned", "linux-image-6.12.111+deb12-amd64-dbg", "linux-image-6.12.100+deb12-amd64", "linux-image-6.12-amd64"]


def test_archive_releases_have_both_packages_in_version_order() -> None:
    # 6.12.115 has no -dbg here, 6.12.100 only the signed image: neither can be prepared
    assert prep.archive_releases(ARCHIVE_612, "6.12", "amd64") == ["6.12.107+deb12", "6.12.111+deb12",
                                                                   "6.12.117+deb12"]
    assert prep.archive_releases(ARCHIVE_612, "6.12", "rt-amd64") == ["6.12.117+deb12"]
    assert prep.archive_releases(ARCHIVE_612, "6.12", "cloud-amd64") == []
    assert prep.archive_releases(["linux-image-6.1.0-9-amd64-unsigned", "linux-image-6.1.0-9-amd64-dbg",
                                  "linux-image-6.1.0-10-amd64-unsigned", "linux-image-6.1.0-10-amd64-dbg",
                                  *ARCHIVE_612], "6.1", "amd64") == ["6.1.0-9", "6.1.0-10"]


def test_an_unknown_6_12_kernel_is_refused_at_its_line_with_what_the_archive_has(
        tmp_path: Path, image_stub: object, monkeypatch: pytest.MonkeyPatch) -> None:
    known = {f"linux-image-{r}-amd64-{k}" for r in ("6.12.111+deb12", "6.12.117+deb12") for k in ("unsigned", "dbg")}
    known.add("linux-image-6.1.0-56-amd64-unsigned")
    known.add("linux-image-6.1.0-56-amd64-dbg")
    monkeypatch.setattr(prep, "candidate", lambda package: "1" if package in known else None)
    monkeypatch.setattr(prep, "versions", lambda package: ["1"] if package in known else [])
    monkeypatch.setattr(prep, "_archive_names", lambda series: ARCHIVE_612)
    lab = load_lab_text("name: l\nnetworks: {}\nguests:\n  a: {}\n  b:\n    kernel: debian:6.12.118+deb12-amd64\n"
                        "  c:\n    kernel: debian:6.12.117+deb12-cloud-amd64\n  d:\n"
                        "    kernel: debian:6.12.117+deb12-amd64\n", str(tmp_path / "l.yaml"))
    with pytest.raises(LabFileError) as exc:
        gk.check(lab, gk.specs(lab, image_stub))  # type: ignore[arg-type]
    assert [str(p) for p in exc.value.problems] == [
        (f"{tmp_path}/l.yaml:6: guests.b.kernel: Debian has no kernel 6.12.118+deb12-amd64 "
        "(linux-image-6.12.118+deb12-amd64-unsigned is not in the archive); the archive has 6.12 amd64 kernels "
        "6.12.107+deb12, 6.12.111+deb12, 6.12.117+deb12 (run 'apt-get update' for newer ones)"),
        (f"{tmp_path}/l.yaml:8: guests.c.kernel: Debian has no kernel 6.12.117+deb12-cloud-amd64 "
        "(linux-image-6.12.117+deb12-cloud-amd64-unsigned is not in the archive); the archive has no 6.12 kernel "
        "of flavour cloud-amd64 (run 'apt-get update' for newer ones)"),
    ]  # a and d (6.1's default, 6.12.117) are there
    known.discard("linux-image-6.12.117+deb12-amd64-dbg")
    with pytest.raises(LabFileError, match="6.12.117[+]deb12-amd64-dbg is not in the archive"):
        other = lab.with_kernel(debian("debian:6.12.117+deb12-amd64", 10))
        gk.check(other, gk.specs(other, image_stub))  # type: ignore[arg-type]


def test_a_missing_tree_is_a_lab_file_error_at_its_line(tmp_path: Path, image_stub: object) -> None:
    lab = load_lab_text("name: l\nnetworks: {}\nguests:\n  a:\n    kernel: {tree: /nonexistent/linux}\n",
                        str(tmp_path / "l.yaml"))
    with pytest.raises(LabFileError) as exc:
        gk.check(lab, gk.specs(lab, image_stub))  # type: ignore[arg-type]
    [problem] = exc.value.problems
    assert (problem.line, problem.path) == (5, "guests.a.kernel")
    assert "no kernel tree at /nonexistent/linux" in problem.message
    forced = lab.with_kernel(KernelSpec(TREE, tree=tmp_path / "gone", path="--kernel"))
    with pytest.raises(UsageError, match="--kernel: no kernel tree at"):
        gk.check(forced, gk.specs(forced, image_stub))  # type: ignore[arg-type]


@pytest.fixture
def image_stub(tmp_path: Path) -> object:
    class Stub:
        default_kernel = "debian:6.1.0-56-amd64"

    return Stub()


# -- keys and preparation ------------------------------------------------------------------------

def test_tree_key_follows_its_content(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path)
    spec = KernelSpec(TREE, tree=tree)
    key = prep.content_key(spec, OPTS)
    assert prep.content_key(spec, OPTS) == key  # unchanged tree: the same kernel
    ko = tree / "drivers" / "net" / "ethernet" / "intel" / "e1000" / "e1000.ko"
    ko.write_bytes(b"e1000 module v2")  # rebuilt a module
    assert prep.content_key(spec, OPTS) != key
    ko.write_bytes(b"e1000 module v1")
    assert prep.content_key(spec, OPTS) == key
    (tree / ".config").write_text("CONFIG_E1000=y\n")
    assert prep.content_key(spec, OPTS) != key
    assert prep.content_key(spec, prep.Options(initramfs_modules=("ext4",))) != prep.content_key(spec, OPTS)


def test_preparing_a_tree_once_then_from_the_cache(tmp_path: Path, cache: Path) -> None:
    tree = fake_tree(tmp_path)
    spec = KernelSpec(TREE, tree=tree)
    k = prep.prepare(spec, OPTS)  # depmod (kmod) and mke2fs (e2fsprogs) are setup.sh's packages
    assert k.dir.parent == cache / "kernels" and k.release == "6.1.192-labctl-test"
    assert k.manifest["source"] == {"kind": "tree", "tree": str(tree)}
    assert (k.dir / "boot").read_bytes() == (tree / "vmlinux").read_bytes()
    assert k.vmlinux_debug.samefile(k.dir / "boot")  # the tree's vmlinux is its own debug file
    assert (k.dir / "config").read_text() == (tree / ".config").read_text()
    assert (k.debug_modules / "drivers/net/ethernet/intel/e1000/e1000.ko").is_file()
    assert (k.dir / "modules.img").stat().st_size > 0
    assert k.manifest["banner"] == "Linux version 6.1.192-labctl-test"
    assert set(k.manifest["files"]) >= {"boot", "vmlinux.debug", "config", "System.map", "modules.img"}
    assert not list((cache / "kernels").glob(".prep-*"))  # the work directory is gone
    stamp = (k.dir / "manifest.json").stat().st_mtime_ns
    again = prep.prepare(spec, OPTS)
    assert again.dir == k.dir and (k.dir / "manifest.json").stat().st_mtime_ns == stamp  # from the cache
    # A rebuilt tree is another kernel; prune keeps what is asked and removes the rest.
    (tree / "vmlinux").write_bytes((tree / "vmlinux").read_bytes() + b"rebuilt")
    newer = prep.prepare(spec, OPTS)
    assert newer.dir != k.dir
    gone = KernelStore().prune({newer.dir.resolve()})
    assert [g.dir for g in gone] == [k.dir] and newer.dir.is_dir() and not k.dir.exists()


def test_two_processes_preparing_one_kernel_both_get_it(tmp_path: Path, cache: Path) -> None:
    """Two labctls (a user's up beside a test run, say) preparing the same kernel at once: one
    prepares it, the other waits for it; both end with the same complete directory."""
    import subprocess
    import sys

    tree = fake_tree(tmp_path)
    code = ("import sys; from labctl.kernel import prepare as p; from labctl.lab import kernels as k; "
            "print(p.prepare(k.KernelSpec(k.TREE, tree=__import__('pathlib').Path(sys.argv[1])), "
            "p.Options(initramfs_modules=('virtio_blk',))).dir)")
    env = {**os.environ, "LABCTL_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tree)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    dirs = {out.strip() for out, _ in outs}
    assert len(dirs) == 1 and (Path(dirs.pop()) / "manifest.json").is_file()
    assert [d.name for d in (cache / "kernels").iterdir() if d.name.startswith(".new-")] == []


def test_initrd_is_the_image_part_then_the_kernel_part(tmp_path: Path, cache: Path) -> None:
    from tests.conftest import fake_kernel

    k = fake_kernel(tmp_path / "k")
    (k.dir / prep.KERNEL_CPIO).write_bytes(b"KERNEL")
    image_cpio = tmp_path / "image.cpio"
    image_cpio.write_bytes(b"IMAGE")
    out = prep.initrd(k, image_cpio, "abc")
    assert out.read_bytes() == b"IMAGEKERNEL"
    image_cpio.write_bytes(b"CHANGED")  # made once per image key, then kept
    assert prep.initrd(k, image_cpio, "abc").read_bytes() == b"IMAGEKERNEL"


# -- modules -------------------------------------------------------------------------------------

DEP = """\
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko
kernel/fs/jbd2/jbd2.ko:
"""


def test_load_order_puts_dependencies_first_and_skips_built_in_modules() -> None:
    assert module_load_order(DEP, ["virtio_pci", "virtio_blk"]) == [
        "kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko",
        "kernel/drivers/virtio/virtio_pci.ko", "kernel/drivers/block/virtio_blk.ko"]
    builtin = builtin_names("kernel/drivers/block/virtio_blk.ko\nkernel/fs/ext4/ext4.ko\nkernel/fs/qemu-fw-cfg.ko\n")
    dep = "\n".join(line for line in DEP.splitlines() if "ext4.ko:" not in line)
    assert module_load_order(dep, ["ext4", "qemu_fw_cfg"], builtin) == []
    with pytest.raises(ImageError, match="'nope' is neither built into the kernel nor in its modules.dep"):
        module_load_order(DEP, ["nope"], builtin)


# -- preflight -----------------------------------------------------------------------------------

def bootable_config() -> str:
    """A configuration with everything a virtio-only lab needs (and no e1000 driver)."""
    from labctl.kernel.requirements import config_fragment

    lab = load_lab_text("name: v\nnetworks: {}\nguests: {a: {}}\n", "v.yaml")
    return "\n".join(line for line in config_fragment(lab).splitlines() if line.startswith("CONFIG_")) + "\n"


def test_preflight_reads_each_guests_own_kernel_config(tmp_path: Path, image_stub: object,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tree = fake_tree(tmp_path)
    (tree / ".config").write_text(bootable_config())
    lab = load_lab_text(f"name: l\nnetworks: {{lan: {{}}}}\nguests:\n"
                        f"  a:\n    kernel: {{tree: {tree}}}\n"
                        f"    nics: [{{name: eth1, model: e1000, network: lan}}]\n"
                        f"  b:\n    nics: [{{name: eth1, model: e1000, network: lan}}]\n",
                        str(tmp_path / "l.yaml"))
    seen: list[str] = []

    def config_text(spec: KernelSpec) -> str | None:
        seen.append(spec.describe())
        return (tree / ".config").read_text() if spec.kind == TREE else "CONFIG_E1000=m\n" + bootable_config()

    monkeypatch.setattr(prep, "config_text", config_text)
    report = gk.preflight(lab, gk.specs(lab, image_stub))  # type: ignore[arg-type]
    assert sorted(seen) == sorted([f"tree {tree}", "debian:6.1.0-56-amd64"])
    [refusal] = report.refusals
    assert (refusal.line, refusal.path) == (6, "guests.a.nics[0].model")  # b's kernel has the driver
    assert "CONFIG_E1000" in refusal.message and str(tree) in refusal.message
    with pytest.raises(LabFileError):
        gk.refuse(report)


def test_kernel_list_json_names_the_prepared_kernels(tmp_path: Path, cache: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from labctl.cli.main import main
    from tests.conftest import fake_kernel

    fake_kernel(cache / "kernels" / "0123456789abcdef")
    assert main(["kernel", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["kernels"]
    assert (row["key"], row["release"], row["used_by"]) == ("0123456789abcdef", "6.1.0-56-amd64", [])


def test_manifest_records_sha256_of_boot_and_debug(tmp_path: Path) -> None:
    from tests.conftest import fake_kernel

    k = fake_kernel(tmp_path / "k")
    summary = k.summary()
    assert summary["release"] == "6.1.0-56-amd64" and summary["sha256"]["boot"] == "a" * 64
    json.dumps(summary)
    assert os.fspath(k.dir) == summary["dir"]


def test_prepare_kernels_works_out_each_guests_kernel_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks, the preflight, the cache look-up and the preparation all read one guest -> kernel map."""
    from labctl import pipeline
    from labctl.image import load_recipe

    lab = load_lab_text("name: l\nnetworks: {}\nguests:\n  a: {}\n  b: {}\n", str(tmp_path / "l.yaml"))

    class Image:
        name, default_kernel = "debian-12", "debian:6.1.0-56-amd64"

    calls: list[str] = []
    real_specs = gk.specs

    def specs(lab_: object, image: object) -> dict[str, KernelSpec]:
        calls.append("specs")
        return real_specs(lab_, image)  # type: ignore[arg-type]

    prepared: list[str] = []

    def prepare(spec: KernelSpec, options: object, reporter: object = None) -> str:
        prepared.append(spec.describe())
        return f"kernel {spec.describe()}"

    monkeypatch.setattr(pipeline, "kernel_specs", specs)  # where prepare_kernels looks it up
    monkeypatch.setattr(prep, "check", lambda spec: None)
    monkeypatch.setattr(prep, "config_text", lambda spec: bootable_config())
    monkeypatch.setattr(prep, "prepare", prepare)
    monkeypatch.setattr(pipeline, "load_recipe", lambda name: load_recipe(name))
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    got = pipeline.prepare_kernels(lab, Image())  # type: ignore[arg-type]
    assert got == {"a": "kernel debian:6.1.0-56-amd64", "b": "kernel debian:6.1.0-56-amd64"}
    assert calls == ["specs"] and prepared == ["debian:6.1.0-56-amd64"]  # one kernel for both guests, prepared once
