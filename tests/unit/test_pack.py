"""labctl.pack on small stand-ins: a round trip with a fake image and a fake tree kernel, and every
refusal of a damaged, truncated or foreign file, or of an image or kernel that is not the packed one."""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.errors import UsageError
from labctl.image import Image, sha256_file
from labctl.kernel import Kernel
from labctl.lab import load_lab_text
from labctl.pack import (
    check_archive,
    check_image,
    check_kernels,
    fetch_url,
    identity,
    is_pack,
    open_pack,
    pack_lab,
    url_lab,
)

LAB = """name: packed
networks:
  lan: {}
guests:
  a:
    kernel: {tree: /nonexistent/linux}
    nics: [{name: eth1, model: e1000, network: lan}]
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    c = tmp_path / "cache"
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(c))
    return c


def fake_image(d: Path) -> Image:
    d.mkdir(parents=True)
    rootfs = bytes(3 << 20) + b"root file system" + bytes(1 << 20)  # mostly zeros: written back as holes
    (d / "rootfs.img").write_bytes(rootfs)
    (d / "initramfs.cpio").write_bytes(b"cpio")
    manifest = {"name": "debian-12", "key": "0123456789abcdef", "default_kernel": "debian:6.1.0-56-amd64",
                "files": {"rootfs.img": {"size": len(rootfs), "sha256": sha256_file(d / "rootfs.img")}},
                "packages": {"bash": "5.2", "iperf3": "3.12"}}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return Image.at(d)


def fake_tree_kernel(d: Path) -> Kernel:
    d.mkdir(parents=True)
    (d / "boot").write_bytes(b"\x7fELF kernel bytes")
    (d / "config").write_text("CONFIG_E1000=m\n")
    (d / "manifest.json").write_text(json.dumps({"source": {"kind": "tree", "tree": "/nonexistent/linux"},
                                                 "release": "6.1.0-test", "build_id": "ab" * 20}))
    return Kernel.at(d)


@pytest.fixture
def packed(cache: Path, tmp_path: Path) -> Path:
    lab = load_lab_text(LAB, str(tmp_path / "lab.yaml"))
    out = tmp_path / "lab.labpack"
    kernel = fake_tree_kernel(tmp_path / "src-kernel" / "0123456789abcdef")
    result = pack_lab(lab, fake_image(tmp_path / "src-image"), {"a": kernel}, out)
    assert result.size == out.stat().st_size and set(result.contents) == {
        "lab file", "kernel 6.1.0-test", "image debian-12"}
    return out


def members(path: Path) -> list[str]:
    raw = subprocess.run(["zstd", "-dcq", str(path)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return [m.name for m in tar if m.isfile()]


def test_round_trip_with_the_image(packed: Path, cache: Path) -> None:
    assert is_pack(packed)
    names = members(packed)
    assert names[0] == "pack.json" and names[-1] == "image/rootfs.img"
    assert set(names) == {"pack.json", "lab/lab.yaml", "kernels/0123456789abcdef/boot",
                          "kernels/0123456789abcdef/config", "image/manifest.json", "image/initramfs.cpio",
                          "image/rootfs.img"}
    opened = open_pack(packed)
    assert opened.pinned.image is not None
    image = opened.pinned.image
    assert image.dir.parent == cache / "images" / "debian-12" and image.key.startswith("pack-")
    assert image.rootfs.stat().st_blocks * 512 < image.rootfs.stat().st_size  # holes where the zeros were
    check_image(opened.pinned, image)  # the real digest of the installed root file system
    lab = opened.lab()
    spec = lab.kernel_of("a")
    assert spec is not None and spec.kind == "files" and spec.image == opened.dir / "kernels/0123456789abcdef/boot"
    assert spec.config is not None and spec.config.read_text() == "CONFIG_E1000=m\n"
    assert open_pack(packed).dir == opened.dir  # unpacked once


def test_an_image_that_is_not_the_packed_one_is_refused(packed: Path) -> None:
    opened = open_pack(packed)
    image = opened.pinned.image
    assert image is not None
    with open(image.rootfs, "r+b") as f:
        f.write(b"X")
    with pytest.raises(UsageError, match="root file system sha256 .* packed"):
        check_image(opened.pinned, image)


def test_a_kernel_with_another_build_id_is_refused(packed: Path, tmp_path: Path) -> None:
    opened = open_pack(packed)
    same = Kernel(tmp_path, {"build_id": "ab" * 20, "release": "6.1.0-test"})
    check_kernels(opened.pinned, {"a": same})
    other = Kernel(tmp_path, {"build_id": "cd" * 20, "release": "6.1.0-test"})
    with pytest.raises(UsageError, match=f"guest a: kernel 6.1.0-test has build id {'cd' * 20}, packed {'ab' * 20}"):
        check_kernels(opened.pinned, {"a": other})


def test_no_image_packs_the_package_list_and_refuses_another(cache: Path, tmp_path: Path) -> None:
    lab = load_lab_text(LAB, str(tmp_path / "lab.yaml"))
    image = fake_image(tmp_path / "src-image")
    out = tmp_path / "noimg.labpack"
    pack_lab(lab, image, {"a": fake_tree_kernel(tmp_path / "k" / "0123456789abcdef")}, out, with_image=False)
    assert not any(n.startswith("image/") for n in members(out))
    opened = open_pack(out)
    assert opened.pinned.image is None
    check_image(opened.pinned, image)
    other = Image(image.name, image.key, image.dir, {**image.manifest, "packages": {"bash": "5.3", "iperf3": "3.12"}})
    with pytest.raises(UsageError, match="bash 5.2 packed, 5.3 here"):
        check_image(opened.pinned, other)


def test_a_debian_kernel_gone_from_the_archive_is_refused(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened = open_pack(packed)
    guests = {"a": {"kind": "debian", "release": "6.1.0-56-amd64", "package": "linux-image-6.1.0-56-amd64-unsigned",
                    "version": "6.1.192-2"}}
    pinned = identity.Pinned("x.labpack", type(opened.index)({**opened.index.data, "guests": guests}), opened.dir, None)
    monkeypatch.setattr(identity, "versions", lambda package: ["6.1.192-2"])
    check_archive(pinned)
    monkeypatch.setattr(identity, "versions", lambda package: ["6.1.200-1", "6.1.192-2"])
    check_archive(pinned)  # a newer version beside it: the packed one can still be had
    monkeypatch.setattr(identity, "versions", lambda package: ["6.1.200-1", "6.1.192-1"])
    with pytest.raises(UsageError, match="packed as linux-image-6.1.0-56-amd64-unsigned 6.1.192-2, the archive "
                                         "here has 6.1.200-1, 6.1.192-1"):
        check_archive(pinned)


def test_a_truncated_file_is_refused(packed: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.labpack"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    with pytest.raises(UsageError, match="damaged or truncated pack"):
        open_pack(cut)


def _repack(src: Path, dst: Path, edit) -> None:  # type: ignore[no-untyped-def]
    raw = subprocess.run(["zstd", "-dcq", str(src)], capture_output=True, check=True).stdout
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tin, tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tout:
        for m in tin:
            data = tin.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            for m2, d2 in edit(m, data):
                tout.addfile(m2, io.BytesIO(d2) if d2 is not None else None)
    dst.write_bytes(subprocess.run(["zstd", "-q", "-c"], input=out.getvalue(), capture_output=True, check=True).stdout)


def _replace(m: tarfile.TarInfo, data: bytes) -> tarfile.TarInfo:
    m2 = tarfile.TarInfo(m.name)
    m2.size, m2.mode = len(data), 0o644
    return m2


def test_a_member_whose_digest_differs_is_refused(packed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.labpack"
    _repack(packed, bad, lambda m, d: [(_replace(m, b"\x7fELF another kernel"), b"\x7fELF another kernel")]
            if m.name.endswith("/boot") else [(m, d)])
    with pytest.raises(UsageError, match="member kernels/0123456789abcdef/boot has .* its index"):
        open_pack(bad)


def test_a_member_of_the_right_size_with_another_digest_is_refused(packed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.labpack"

    def flip(m: tarfile.TarInfo, d: bytes | None) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        if not m.name.endswith("/boot") or d is None:
            return [(m, d)]
        same_size = d[:-1] + bytes([d[-1] ^ 1])  # one bit of the kernel changed, its size as the index says
        return [(_replace(m, same_size), same_size)]

    _repack(packed, bad, flip)
    with pytest.raises(UsageError, match=r"member kernels/0123456789abcdef/boot has sha256 \w+ \(17 bytes\), its "
                                         r"index \w+ \(17 bytes\); nothing started"):
        open_pack(bad)
    assert not list((tmp_path / "cache" / "packs").glob("*/kernels"))  # nothing left unpacked


@pytest.mark.parametrize("gone", ["kernels/0123456789abcdef/config", "lab/lab.yaml"])
def test_a_member_its_index_lists_but_the_file_lacks_is_refused(packed: Path, tmp_path: Path, gone: str) -> None:
    bad = tmp_path / "bad.labpack"
    assert gone in members(packed)
    _repack(packed, bad, lambda m, d: [] if m.name == gone else [(m, d)])
    assert gone not in members(bad)
    with pytest.raises(UsageError, match=f"members missing: {gone}; nothing started"):
        open_pack(bad)


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", "kernels/0123456789abcdef/../../x", "lab/a b"])
def test_a_member_outside_the_layout_is_refused(packed: Path, tmp_path: Path, name: str) -> None:
    bad = tmp_path / "bad.labpack"

    def add(m: tarfile.TarInfo, d: bytes | None) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        if m.name != "lab/lab.yaml":
            return [(m, d)]
        evil = tarfile.TarInfo(name)
        evil.size = 4
        return [(m, d), (evil, b"evil")]

    _repack(packed, bad, add)
    with pytest.raises(UsageError, match="is not one its index names"):
        open_pack(bad)
    assert not (tmp_path / "evil").exists()


def test_a_symlink_member_is_refused(packed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.labpack"

    def add(m: tarfile.TarInfo, d: bytes | None) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        if m.name != "lab/lab.yaml":
            return [(m, d)]
        link = tarfile.TarInfo("lab/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        return [(link, None), (m, d)]

    _repack(packed, bad, add)
    with pytest.raises(UsageError, match="'lab/link' is not one its index names"):
        open_pack(bad)


def test_a_foreign_index_is_refused(packed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.labpack"
    _repack(packed, bad, lambda m, d: [(_replace(m, b'{"format": "other"}'), b'{"format": "other"}')]
            if m.name == "pack.json" else [(m, d)])
    with pytest.raises(UsageError, match="not a labctl pack"):
        open_pack(bad)


def test_another_architecture_is_refused(packed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "arm.labpack"

    def arch(m: tarfile.TarInfo, d: bytes | None) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        if m.name != "pack.json" or d is None:
            return [(m, d)]
        data = json.loads(d)
        data["host"]["arch"] = "aarch64"
        raw = json.dumps(data).encode()
        return [(_replace(m, raw), raw)]

    _repack(packed, bad, arch)
    with pytest.raises(UsageError, match="packed on aarch64, this host is"):
        open_pack(bad)


def test_a_lab_with_shares_is_not_packed(cache: Path, tmp_path: Path) -> None:
    shared = tmp_path / "data"
    shared.mkdir()
    text = LAB + f"    shares: [{{host: {shared}, mount: /mnt/data}}]\n"
    lab = load_lab_text(text, str(tmp_path / "lab.yaml"))
    with pytest.raises(UsageError, match="carries no host directory"):
        pack_lab(lab, fake_image(tmp_path / "img"), {"a": fake_tree_kernel(tmp_path / "k" / "0123456789abcdef")},
                 tmp_path / "x.labpack")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A loopback http server over tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, directory=str(www), **kw)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_lab_file_from_a_url_names_no_host_path(served: str, cache: Path, tmp_path: Path) -> None:
    (tmp_path / "www" / "tree.yaml").write_text(LAB)
    (tmp_path / "www" / "debian.yaml").write_text(LAB.replace("{tree: /nonexistent/linux}", "debian:6.1.0-56-amd64"))
    with pytest.raises(UsageError, match=r"may not name a path of this host \(guests.a.kernel: tree /nonexistent"):
        url_lab(fetch_url(f"{served}/tree.yaml"), f"{served}/tree.yaml")
    lab = url_lab(fetch_url(f"{served}/debian.yaml"), f"{served}/debian.yaml")
    assert lab.source == f"{served}/debian.yaml"
    with pytest.raises(UsageError, match="404"):
        fetch_url(f"{served}/missing.labpack")
    with pytest.raises(UsageError, match="only http:// and https://"):
        fetch_url("file:///etc/passwd")


def test_a_packed_file_from_a_url_opens_as_the_file(served: str, packed: Path, tmp_path: Path) -> None:
    os.link(packed, tmp_path / "www" / "lab.labpack")
    got = fetch_url(f"{served}/lab.labpack")
    assert got.read_bytes() == packed.read_bytes() and got.stat().st_mode & 0o077 == 0
    assert open_pack(got).index.lab_name == "packed"


def test_tar_reading_a_file_linked_meanwhile_is_tried_again(cache: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Another labctl linking a cached file while tar reads it changes its ctime: tar says the file changed
    (exit 1), and the pack is written again; any other failure is not."""
    from labctl.errors import ProcessError
    from labctl.pack import packing

    real, calls = packing.run_pipeline, []

    def flaky(argvs, timeout, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise ProcessError("tar ... exited with status 1", output="tar: image/rootfs.img: file changed as we read it")
        return real(argvs, timeout, **kw)

    monkeypatch.setattr(packing, "run_pipeline", flaky)
    lab = load_lab_text(LAB, str(tmp_path / "lab.yaml"))
    out = tmp_path / "again.labpack"
    pack_lab(lab, fake_image(tmp_path / "img"), {"a": fake_tree_kernel(tmp_path / "k" / "0123456789abcdef")}, out)
    assert len(calls) == 2 and open_pack(out).index.lab_name == "packed"
    monkeypatch.setattr(packing, "run_pipeline", lambda *a, **kw: (_ for _ in ()).throw(ProcessError("tar: disk full")))
    with pytest.raises(ProcessError, match="disk full"):
        pack_lab(lab, fake_image(tmp_path / "img2"), {"a": fake_tree_kernel(tmp_path / "k2" / "0123456789abcdef")},
                 tmp_path / "never.labpack")
    assert not (tmp_path / "never.labpack").exists()
