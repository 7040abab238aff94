"""Issue 47 (round four), the pack's findings as attacks on real files: an index whose values are
paths or options (a recipe path, an install path out of the store, an apt option, a kernel key
out of the pack), members over their sizes, a pack image without a default kernel. Each is
refused before anything is written or run, and a refused pack leaves nothing in the cache."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from labctl.errors import ImageError, LabFileError, UnsafePath, UsageError
from labctl.image import candidate, load_recipe
from labctl.pack import PackIndex, open_pack
from labctl.pack.cache import pin
from labctl.pack.packfile import MAX_TOTAL
from labctl.paths import build_into
from tests.unit.test_pack import cache, packed  # noqa: F401  (fixtures)

Edit = Callable[[dict[str, Any], dict[str, bytes]], None]


def _craft(src: Path, dst: Path, edit: Edit, sizes: dict[str, int] | None = None) -> None:
    """``src`` repacked as ``dst`` with ``edit`` applied to its index and members (name -> bytes), the
    index's sizes and digests then made to match the members (an author crafting a pack does that)."""
    raw = subprocess.run(["zstd", "-dcq", str(src)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tin:
        files = {m.name: tin.extractfile(m).read() for m in tin if m.isfile()}  # type: ignore[union-attr]
    index = json.loads(files.pop("pack.json"))
    edit(index, files)
    import hashlib
    index["files"] = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}
    for n, size in (sizes or {}).items():
        index["files"][n]["size"] = size
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tout:
        for name, data in [("pack.json", json.dumps(index).encode()), *files.items()]:
            m = tarfile.TarInfo(name)
            m.size, m.mode = len(data), 0o644
            tout.addfile(m, io.BytesIO(data))
    dst.write_bytes(subprocess.run(["zstd", "-q", "-c"], input=out.getvalue(), capture_output=True, check=True).stdout)


def _nothing_unpacked(cache_dir: Path) -> bool:
    packs = cache_dir / "packs"
    return not packs.is_dir() or not [p for p in packs.iterdir() if not p.name.startswith(".")]


# -- High 1: an image name that is a recipe path -------------------------------------------------

def test_a_pack_naming_a_recipe_path_is_refused_and_no_recipe_is_taken_from_it(
        packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    evil = tmp_path / "home" / "r"
    evil.mkdir(parents=True)
    (evil / "recipe.toml").write_text('name = "r"\n[kernel]\nextra_modules = ["/home/u/kbuild"]\n')
    bad = tmp_path / "bad.labpack"

    def name(index: dict[str, Any], files: dict[str, bytes]) -> None:
        index["image"]["name"] = str(evil)
    _craft(packed, bad, name)
    with pytest.raises(UsageError, match=r"image.name: not an image's name"):
        open_pack(bad)
    assert _nothing_unpacked(cache)
    with pytest.raises(ImageError, match="no image recipe named"):
        load_recipe(str(evil))  # a recipe is labctl's own, by name, never a path


def test_the_packed_labs_image_decides_never_the_index(packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    bad = tmp_path / "bad.labpack"

    def name(index: dict[str, Any], files: dict[str, bytes]) -> None:
        index["image"]["name"] = "other-image"  # of a valid shape, but not the lab's image
    _craft(packed, bad, name)
    with pytest.raises(UsageError, match="its index packs image 'other-image', its lab runs on 'debian-12'"):
        open_pack(bad)
    assert not (cache / "images" / "other-image").exists()


# -- High 2: an install path out of the image store -----------------------------------------------

def test_a_pack_cannot_replace_a_directory_outside_its_store(packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    victim = tmp_path / "root"
    victim.mkdir()
    (victim / "precious").write_text("root's\n")
    bad = tmp_path / "bad.labpack"

    def escape(index: dict[str, Any], files: dict[str, bytes]) -> None:
        index["image"]["name"] = str(victim)
        index["image"]["rootfs_sha256"] = "/../LEAF"
    _craft(packed, bad, escape)
    with pytest.raises(UsageError, match=r"image.name: not an image's name; image.rootfs_sha256: not a sha256"):
        open_pack(bad)
    assert (victim / "precious").read_text() == "root's\n" and sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert _nothing_unpacked(cache)


def test_build_into_and_pin_refuse_a_path_outside_their_store(cache: Path, tmp_path: Path) -> None:  # noqa: F811
    store = cache / "images"
    store.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("x")
    for final in (store / "debian-12" / ".." / ".." / ".." / "victim", victim, store / "pack-x" / "..", store):
        with pytest.raises(UnsafePath, match="outside labctl's store"), build_into(final, store=store) as work:
            (work / "planted").write_text("x")
        assert (victim / "precious").is_file() and not (victim / "planted").exists()
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(UnsafePath), build_into(store / ".." / "link" / "x", store=store):
        pass
    with pytest.raises(UnsafePath, match="outside labctl's store"):
        pin(victim / "entry")
    assert not (victim / ".entry.pin").exists()
    with build_into(store / "debian-12" / "pack-0123", store=store) as work:  # inside: as ever
        (work / "f").write_text("ok")
    assert (store / "debian-12" / "pack-0123" / "f").read_text() == "ok"


# -- High 3: an apt option for a package name ------------------------------------------------------

OPTION = "-oDir::Cache::pkgcache={}"


def test_a_packs_package_that_is_an_option_is_refused(packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    bad = tmp_path / "bad.labpack"
    target = tmp_path / "target"

    def debian(index: dict[str, Any], files: dict[str, bytes]) -> None:
        index["guests"]["a"] = {"kind": "debian", "release": "6.1.0-56-amd64", "build_id": "ab" * 20,
                                "package": OPTION.format(target), "version": "6.1.158-1", "sha256": "0" * 64}
    _craft(packed, bad, debian)
    with pytest.raises(UsageError, match=r"guests.a.package: not a Debian package name"):
        open_pack(bad)


def test_apt_never_takes_a_package_for_an_option(cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """The real apt-cache: ``-oDir::Cache::pkgcache=FILE`` as the package would overwrite FILE with
    37 MB of apt's cache (as root, any file)."""
    target = tmp_path / "target"
    target.write_text("root's file\n")
    with pytest.raises(ImageError, match="is not a Debian package's name"):
        candidate(OPTION.format(target))
    assert target.read_text() == "root's file\n"


# -- Medium 5: a kernel key that is a path --------------------------------------------------------

@pytest.mark.parametrize("key", ["/root", "../../../../etc", "0123456789abcdef/../../x", "-x"])
def test_a_kernel_key_that_is_a_path_is_refused(packed: Path, cache: Path, tmp_path: Path, key: str) -> None:  # noqa: F811
    bad = tmp_path / "bad.labpack"

    def rekey(index: dict[str, Any], files: dict[str, bytes]) -> None:
        index["guests"]["a"]["key"] = key
    _craft(packed, bad, rekey)
    with pytest.raises(UsageError, match=r"guests.a.key: not a kernel's key"):
        open_pack(bad)
    assert _nothing_unpacked(cache)


def test_the_index_is_checked_as_a_whole() -> None:
    base = {"format": "labctl-pack", "version": 1, "files": {"lab/lab.yaml": {"size": 3, "sha256": "a" * 64}},
            "lab": {"name": "x"}, "host": {"arch": "x86_64"}, "guests": {},
            "image": {"name": "debian-12", "packed": False, "packages": {"bash": "5.2.15-2+b2", "libc6": "1:2.36-9"}}}
    PackIndex.parse(json.dumps(base).encode(), "t")
    for path, value, why in [
            (("files", "lab/lab.yaml", "sha256"), "/etc", "files.lab/lab.yaml.sha256: not a sha256"),
            (("files", "lab/lab.yaml", "size"), -1, "size: not a size"),
            (("files", "lab/lab.yaml", "size"), MAX_TOTAL + 1, "more than"),
            (("image", "packages"), {"-oDir::x=/y": "1"}, "not Debian packages"),
            (("image", "packages"), {"bash": "--force"}, "not Debian packages"),
            (("image", "default_kernel"), "/boot/x", "default_kernel: not a Debian kernel"),
            (("host", "arch"), "../x", "host.arch"),
            (("guests",), {"../a": {}}, "not a guest's name")]:
        data = json.loads(json.dumps(base))
        where = data
        for k in path[:-1]:
            where = where[k]
        where[path[-1]] = value
        with pytest.raises(UsageError, match=why):
            PackIndex.parse(json.dumps(data).encode(), "t")


# -- Low 9 and the "Also": sizes before writing, a default kernel --------------------------------

def test_a_member_over_its_indexed_size_is_refused_before_it_is_written(
        packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    bad = tmp_path / "bad.labpack"

    def zeros(index: dict[str, Any], files: dict[str, bytes]) -> None:
        files["image/rootfs.img"] = bytes(64 << 20)  # a few KB compressed
    _craft(packed, bad, zeros, sizes={"image/rootfs.img": 4})
    assert bad.stat().st_size < 1 << 20
    with pytest.raises(UsageError, match=r"member image/rootfs.img has 67108864 bytes, its index 4"):
        open_pack(bad)
    assert _nothing_unpacked(cache)
    assert sum(f.stat().st_blocks for f in cache.rglob("*") if f.is_file()) * 512 < 1 << 20


def test_a_refused_lab_leaves_nothing_in_the_cache(packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    bad = tmp_path / "bad.labpack"

    def share(index: dict[str, Any], files: dict[str, bytes]) -> None:
        files["lab/lab.yaml"] = files["lab/lab.yaml"].replace(
            b"    nics:", b"    shares: [{host: /srv, mount: /mnt/x}]\n    nics:")
    _craft(packed, bad, share)
    with pytest.raises(LabFileError, match="shares.0..host: host directory /srv cannot be shared: a lab file from "
                                           ".*bad.labpack may not name a path of this host"):
        open_pack(bad)
    assert _nothing_unpacked(cache)


def test_a_pack_image_without_a_default_kernel_is_a_usage_error(packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    bad = tmp_path / "bad.labpack"

    def no_kernel(index: dict[str, Any], files: dict[str, bytes]) -> None:
        manifest = json.loads(files["image/manifest.json"])
        del manifest["default_kernel"]
        files["image/manifest.json"] = json.dumps(manifest).encode()
    _craft(packed, bad, no_kernel)
    with pytest.raises(UsageError, match="its image's manifest names no default kernel"):
        open_pack(bad)


def test_a_packed_labs_bpftrace_file_is_refused_before_it_is_read(packed: Path, cache: Path, tmp_path: Path) -> None:  # noqa: F811
    secret = tmp_path / "secret.bt"
    secret.write_text("BEGIN { printf(\"root's\"); }\n")
    secret.chmod(0o600)
    bad = tmp_path / "bad.labpack"

    def bpf(index: dict[str, Any], files: dict[str, bytes]) -> None:
        files["lab/lab.yaml"] += (f"steps:\n  - name: s\n    run: [{{guest: a, command: 'true'}}]\n    trace:\n"
                                  f"      a: {{bpftrace: {{file: {secret}}}}}\n").encode()
    _craft(packed, bad, bpf)
    with pytest.raises(LabFileError, match=r"bpftrace.file: bpftrace file .*secret.bt is not trusted: a lab file from "
                                           r".*bad.labpack may not name a path of this host"):
        open_pack(bad)
    assert _nothing_unpacked(cache)


# -- the "Also": prune's pins and locks, pack RUN_DIR's manifest ----------------------------------

def test_prune_removes_the_entrys_pin_and_lock(cache: Path) -> None:  # noqa: F811
    from labctl.pack import prune_cache

    entry = cache / "packs" / "0123456789abcdef"
    (entry / "lab").mkdir(parents=True)
    (entry.parent / f".{entry.name}.lock").write_text("")
    removed, _ = prune_cache([])
    assert [e.path for e in removed] == [entry]
    assert sorted(p.name for p in entry.parent.iterdir()) == []
    pin(entry)  # a later pin makes its file again
    assert (entry.parent / f".{entry.name}.pin").is_file()


def test_pack_run_dir_trusts_no_manifest_of_another_user_nor_a_path_out_of_the_store(
        cache: Path, tmp_path: Path) -> None:  # noqa: F811
    import os

    from labctl.pack import run_inputs

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "lab.yaml").write_text("name: r\n")
    secret = tmp_path / "root-only"
    secret.mkdir()
    (secret / "manifest.json").write_text("{}")
    (run / "manifest.json").write_text(json.dumps({"kernels": {"a": {"dir": str(secret)}},
                                                   "image": {"name": "debian-12", "key": "0123456789abcdef"}}))
    with pytest.raises(UsageError, match=r"names what is not in labctl's store: a \(.*root-only\)"):
        run_inputs(run)
    (run / "manifest.json").write_text(json.dumps({"kernels": {}, "image": {"name": "/root", "key": "../x"}}))
    with pytest.raises(UsageError, match="names what is not in labctl's store: image '/root' '../x'"):
        run_inputs(run)
    if os.geteuid() == 0:
        os.chown(run / "manifest.json", 65534, 65534)
        with pytest.raises(UsageError, match=r"not a run of yours to pack: it is owned by nobody"):
            run_inputs(run)


def test_an_image_without_a_default_kernel_is_an_image_error(tmp_path: Path) -> None:
    from labctl.image import Image
    from labctl.kernel.guest_kernels import default_spec

    (tmp_path / "manifest.json").write_text(json.dumps({"name": "debian-12", "key": "0123456789abcdef"}))
    with pytest.raises(ImageError, match="its manifest names no default kernel"):
        default_spec(Image.at(tmp_path))
