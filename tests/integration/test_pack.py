"""A reproducer is one file, for real: a run on the suite's kernel tree and a Debian kernel is
packed (its lab, the tree's kernel files, the Debian kernel by package digest, the image, the
run's summary) while the lab is still up, and the pack holds none of the lab's keys; from a
fresh cache (no image, no tree kernel), ``labctl run`` of the packed file boots the same kernels
(same ``uname -r``, same build ids) on the same image (same root file system sha256) and the step
gives the same result; ``labctl compare`` of the packed run and the new one works; the same file
over http on loopback is shown and prepared (``up --dry-run``); a truncated file, a pack whose
kernel build id was changed, a ``--no-image`` pack whose package list differs and one whose Debian
``-dbg`` digest differs are refused with exit 2 and nothing started. Packed ``--with-debug``, the tree
kernel's modules are its debug modules where the pack runs. A lab file from a git repository served
by ``git daemon`` on loopback runs with its commit recorded, and ``cache prune`` keeps what a lab that
is up uses."""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labctl.kernel.vmlinux import has_dwarf
from tests import isolation
from tests.conftest import Cli, new_cli
from tests.integration.conftest import qemu_pids_under, with_abi

#: Two runs of a two-guest lab under TCG are the floor of what this file shows (the run that is packed,
#: and the packed file's run from a new cache); every other check reads them or refuses before a boot, but
#: the lab from git (one guest, one step: its run, kept up while the cache is pruned).
#: 3.9 min at load average 9 on the 2-core host beside other helpers' guests (3.1 of them the two runs and the
#: pack); 8.6 min at load average 12.9. With the git lab (one guest, 26 s) and the -dbg refusal: 3.6 and 4.4 min at
#: load average 7.
#: With the other files on the suite's kernel tree, on one worker: a test here boots the tree's kernel,
#: and on a new machine the other worker would sit waiting for its build (204 s here, ~10 min on CI).
pytestmark = pytest.mark.xdist_group("kernel-tree")

OVER_3_MIN = "two TCG runs of a two-guest lab (the packed run, and the pack's run from a new cache)"

LAB = """\
name: packed
networks:
  lan: {{}}
guests:
  a:
    kernel: {{tree: {tree}}}
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.62.0.1/24}}]
  b:
    kernel: debian:6.1.0-56-amd64
    nics: [{{name: eth1, model: virtio, network: lan, ip: 10.62.0.2/24}}]
steps:
  - name: ping
    run:
      - {{guest: a, command: "ping -c 2 10.62.0.2 >/dev/null && uname -r"}}
      - {{guest: b, command: "uname -r"}}
"""


@dataclass
class Packed:
    first: Path  # the run that was packed
    pack: Path
    second: Path  # the packed file's run from a fresh cache
    fresh: Cli  # labctl with that fresh cache


def _fresh_cache(path: Path) -> Path:
    """A cache with neither image nor tree kernel: only what a machine has from Debian's archive
    (the downloaded packages, the Debian kernel prepared from them) and the host's probes."""
    suite = Path(os.environ["LABCTL_CACHE_DIR"])
    path.mkdir(mode=0o700)
    for entry in sorted(suite.glob("downloads/*")):
        isolation._link(entry, path / "downloads" / entry.name)
    for entry in sorted(suite.glob("kernels/*")):
        if isolation._complete(entry, "kernels"):  # Debian's only
            isolation._link(entry, path / "kernels" / entry.name)
    for name in isolation.HOST_FACTS:
        if (suite / name).is_file():
            shutil.copy(suite / name, path / name)
    return path


def _bundle(out: str) -> Path:
    return Path(json.loads(out)["bundle"])


def _contents(pack: Path) -> dict[str, bytes]:
    raw = subprocess.run(["zstd", "-dcq", str(pack)], capture_output=True, check=True, timeout=300).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def _key_lines(state: Path) -> set[bytes]:
    """The body lines of every private key under a lab's state directory (its client key, host keys)."""
    lines: set[bytes] = set()
    for p in state.rglob("*"):
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 65536:
            data = p.read_bytes()
            if b"PRIVATE KEY-----" in data:
                lines |= {ln.strip() for ln in data.splitlines() if len(ln.strip()) >= 40 and b"-----" not in ln}
    return lines


@pytest.fixture(scope="module")
def packed(tree_kernel: Path, abi: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Packed]:
    work = tmp_path_factory.mktemp("pack")
    lab = work / "lab.yaml"
    lab.write_text(with_abi(LAB.format(tree=tree_kernel), abi))
    cli = new_cli(tmp_path_factory)
    try:
        res = cli("run", str(lab), "--out", str(work / "runs"), "--accel", "tcg", "--keep", "--json", timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        first = _bundle(res.stdout)
        res = cli("pack", str(first), "-o", str(work / "run.labpack"), "--with-debug", "--json", timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        keys = _key_lines(cli.state_dir)
    finally:
        cli.teardown()
    assert len(keys) >= 3  # the lab's client key and the guests' host keys were there to leak
    inside = _contents(work / "run.labpack")
    leaked = [name for name, data in inside.items() if name != "image/rootfs.img" and any(k in data for k in keys)]
    assert not leaked, leaked
    assert not any(k in inside["image/rootfs.img"] for k in keys)
    assert not any(n.startswith(("state", "snapshots")) or "known_hosts" in n or "key" in n.split("/")[-1]
                   for n in inside), sorted(inside)
    fresh = new_cli(tmp_path_factory)
    fresh.env["LABCTL_CACHE_DIR"] = str(_fresh_cache(work / "fresh-cache"))
    try:
        res = fresh("run", str(work / "run.labpack"), "--out", str(work / "runs2"), "--accel", "tcg", "--json",
                    timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        yield Packed(first, work / "run.labpack", _bundle(res.stdout), fresh)
    finally:
        fresh.teardown()


def test_the_packed_run_boots_the_same_kernels_on_the_same_image(packed: Packed, release: str) -> None:
    a, b = (json.loads((run / "manifest.json").read_text()) for run in (packed.first, packed.second))
    for guest in ("a", "b"):
        assert b["kernels"][guest]["build_id"] == a["kernels"][guest]["build_id"]
        assert b["kernels"][guest]["release"] == a["kernels"][guest]["release"]
    assert b["kernels"]["a"]["release"].endswith("-labctl-test") and b["kernels"]["b"]["release"] == release
    assert b["kernels"]["a"]["source"]["kind"] == "files"  # from the pack: the tree is not read
    # --with-debug: the tree kernel's modules are its debug modules where the pack runs (module symbols for
    # gdb, drgn, oops decoding), and the Debian kernel's -dbg package was checked by its packed digest
    e1000 = list((Path(b["kernels"]["a"]["dir"]) / "debug-modules").rglob("e1000.ko"))
    assert len(e1000) == 1 and has_dwarf(e1000[0])
    assert len(json.loads(_contents(packed.pack)["pack.json"])["guests"]["b"]["debug_sha256"]) == 64
    assert b["image"]["files"]["rootfs.img"]["sha256"] == a["image"]["files"]["rootfs.img"]["sha256"]
    cache = Path(packed.fresh.env["LABCTL_CACHE_DIR"])
    assert [p.name for p in (cache / "images" / "debian-12").iterdir() if not p.name.startswith(".")] == [
        f"pack-{a['image']['files']['rootfs.img']['sha256'][:16]}"]  # the packed image, not a build
    outs = {run: sorted((run / "steps" / "ping").rglob("cmd-*.out")) for run in (packed.first, packed.second)}
    assert [p.read_text() for p in outs[packed.first]] == [p.read_text() for p in outs[packed.second]]
    assert release in "".join(p.read_text() for p in outs[packed.second])
    s1, s2 = (json.loads((run / "summary.json").read_text()) for run in (packed.first, packed.second))
    assert s1["status"] == s2["status"] == "ok"


def test_compare_the_packed_run_with_the_new_one(packed: Packed) -> None:
    res = packed.fresh("compare", str(packed.pack), str(packed.second), "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout)
    assert result["lab"] == "packed"
    assert Path(result["a"]["dir"]).name == "run" and Path(result["b"]["dir"]) == packed.second
    what = {d["what"] for d in result["differences"]}
    assert not any("build" in str(w) for w in what), result["differences"]


def _refused(cli: Cli, *args: str) -> str:
    res = cli(*args, timeout=900)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "nothing started" in res.stderr
    assert not (cli.state_dir / "labs" / "packed").exists()
    assert qemu_pids_under(cli.state_dir) == []
    return " ".join(res.stderr.split())  # as one line: the console wraps it


def _with_index(src: Path, dst: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """``src`` with its index edited, the rest as it is, packed again."""
    raw = subprocess.run(["zstd", "-dcq", str(src)], capture_output=True, check=True, timeout=300).stdout
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tin, tarfile.open(fileobj=out, mode="w",
                                                                    format=tarfile.GNU_FORMAT) as tout:
        for m in tin:
            data = tin.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            if m.name == "pack.json":
                index = json.loads(data or b"")
                edit(index)
                data = json.dumps(index).encode()
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data) if data is not None else None)
    dst.write_bytes(subprocess.run(["zstd", "-q", "-T0", "-c"], input=out.getvalue(), capture_output=True,
                                   check=True, timeout=300).stdout)


def test_a_truncated_pack_is_refused(packed: Packed, tmp_path: Path) -> None:
    cut = tmp_path / "cut.labpack"
    with open(packed.pack, "rb") as f:
        cut.write_bytes(f.read(packed.pack.stat().st_size * 2 // 3))
    assert "damaged or truncated pack" in _refused(packed.fresh, "up", str(cut), "--accel", "tcg")


def test_a_no_image_pack_needs_the_same_packages_and_build_ids(tree_kernel: Path, cli: Cli, tmp_path: Path) -> None:
    """In the suite's cache (its image is built): the package list is what is checked; and a
    kernel prepared from the pack with another build id than the index's is refused."""
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB.format(tree=tree_kernel))
    res = cli("pack", str(lab), "-o", str(tmp_path / "noimg.labpack"), "--no-image", "--with-debug", "--json",
              timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    made = json.loads(res.stdout)
    assert made["image"]["packed"] is False and made["bytes"] < 100 << 20
    assert not any(n.startswith("image/") for n in _contents(tmp_path / "noimg.labpack"))
    bad = tmp_path / "older.labpack"
    _with_index(tmp_path / "noimg.labpack", bad, lambda index: index["image"]["packages"].update(iperf3="3.9-1"))
    err = _refused(cli, "up", str(bad), "--accel", "tcg")
    assert "image debian-12 here is not the packed one (iperf3 3.9-1 packed" in err
    other = tmp_path / "other-build.labpack"
    _with_index(tmp_path / "noimg.labpack", other, lambda index: index["guests"]["a"].update(build_id="0" * 40))
    err = _refused(cli, "up", str(other), "--accel", "tcg")
    assert re.search(r"guest a: kernel \S+-labctl-test has build id ", err) and f"packed {'0' * 40}" in err
    dbg = tmp_path / "other-dbg.labpack"
    _with_index(tmp_path / "noimg.labpack", dbg, lambda index: index["guests"]["b"].update(debug_sha256="0" * 64))
    err = _refused(cli, "up", str(dbg), "--accel", "tcg")
    assert re.search(r"guest b: linux-image-6\.1\.0-56-amd64-dbg \S+ from the archive has sha256 \w+, packed 0{16}", err)


@pytest.fixture
def served(packed: Packed, tree_kernel: Path, tmp_path: Path) -> Iterator[str]:
    """A loopback http server with the packed file and a lab file naming a kernel tree."""
    www = tmp_path / "www"
    www.mkdir()
    os.link(packed.pack, www / "run.labpack")
    (www / "tree.yaml").write_text(LAB.format(tree=tree_kernel))

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


def test_a_pack_from_a_url_is_shown_then_prepared(packed: Packed, served: str) -> None:
    res = packed.fresh("up", f"{served}/run.labpack", "--accel", "tcg", "--dry-run", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    shown = res.stdout + res.stderr
    assert f"from {served}/run.labpack: lab packed" in " ".join(shown.split())
    assert "guest a: kernel image" in shown and "build id" in shown and "image debian-12 (packed" in shown
    assert "qemu-system-x86_64" in shown  # prepared and checked, then the commands, nothing started
    assert qemu_pids_under(packed.fresh.state_dir) == []
    res = packed.fresh("up", f"{served}/tree.yaml", "--accel", "tcg", timeout=300)
    assert res.returncode == 2 and "may not name a path of this host" in " ".join(res.stderr.split())


GIT_LAB = """\
name: fromgit
networks: {}
guests:
  a: {}
steps:
  - name: hello
    run:
      - {guest: a, command: "uname -r"}
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def git_served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``git daemon`` on loopback serving ``repo.git`` (its work tree: the Path, committed by the test)."""
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True, timeout=60)
    port = _free_port()
    daemon = subprocess.Popen(["git", "daemon", "--listen=127.0.0.1", f"--port={port}", f"--base-path={tmp_path}",
                               "--export-all", "--reuseaddr", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"git://127.0.0.1:{port}/repo.git", src
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def _commit(src: Path, bare: Path) -> str:
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "add", "-A"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-qm", "lab"], check=True, timeout=60)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(bare)], check=True, timeout=60)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def _removed_kept(cli: Cli) -> tuple[dict[str, str], dict[str, str]]:
    res = cli("cache", "prune", "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    return ({e["path"]: e["kind"] for e in data["removed"]}, {e["path"]: e["kind"] for e in data["kept"]})


def test_a_lab_from_git_runs_and_prune_keeps_what_a_lab_up_uses(git_served: tuple[str, Path], cli: Cli) -> None:
    """A lab file from a git repository served on loopback: refused with exit 2 for a missing revision,
    path or file; else shown with its commit and run, its bundle naming that commit. A packed file
    from the same repository is opened (``--dry-run``). ``cache prune`` then removes the unpacked
    pack, which nothing uses, and keeps the git repository the lab that is up came from; once it is
    down, prune removes that too."""
    repo, src = git_served
    (src / "labs").mkdir()
    (src / "labs" / "one.yaml").write_text(GIT_LAB)
    res = cli("pack", str(src / "labs" / "one.yaml"), "-o", str(src / "bug.labpack"), "--no-image", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    commit = _commit(src, src.parent / "repo.git")
    for url, why in ((f"{repo}@nosuch#labs/one.yaml", "git could not fetch nosuch"),
                     (f"{repo}#labs/none.yaml", f"no file labs/none.yaml in {repo} at commit {commit}"),
                     (repo, "no path of a file in the repository")):
        res = cli("up", url, "--accel", "tcg", timeout=300)
        assert res.returncode == 2 and why in " ".join(res.stderr.split()), res.stdout + res.stderr
        assert "Traceback" not in res.stderr and not (cli.state_dir / "labs" / "fromgit").exists()
    res = cli("up", f"{repo}#bug.labpack", "--accel", "tcg", "--dry-run", timeout=600)
    assert res.returncode == 0 and f"commit {commit} of {repo}" in res.stdout + res.stderr, res.stdout + res.stderr
    res = cli("up", f"{repo}#labs/one.yaml", "--accel", "tcg", "--json", timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"commit {commit} of {repo}, file labs/one.yaml" in " ".join(res.stderr.split())
    bundle = _bundle(res.stdout)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["lab"]["source"] == f"{repo}@{commit}#labs/one.yaml"
    assert f"{repo}@{commit}#labs/one.yaml" in (bundle / "report.md").read_text()  # the run card's lab file
    assert re.fullmatch(r"6\.1\.0-\d+-amd64\n", next((bundle / "steps" / "hello").rglob("cmd-*.out")).read_text())
    removed, kept = _removed_kept(cli)
    assert "pack" in removed.values() and "git" not in removed.values(), removed
    assert list(kept.values()).count("git") == 1, kept
    cli("down", "fromgit", check=True)
    removed, _kept = _removed_kept(cli)
    assert list(removed.values()).count("git") == 1, removed
