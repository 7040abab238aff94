"""Kernel paths a lab file names are used only when nobody else could change them
(issue 19, item 3): owned by the user running labctl or root, not group- or
other-writable, the same for every directory above; ``--trust-dir`` overrides."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import labctl.kernel.prepare as prep
from labctl.errors import LabFileError
from labctl.lab import load_lab
from tests.unit.test_kernel_prepare import fake_tree

ROOT = Path(__file__).resolve().parents[2]
TRUST_ENV = "LABCTL_TRUSTED_DIRS"
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def other_user() -> Iterator[tuple[str, int]]:
    """A throwaway system user (another engineer on a shared machine), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd")
    name = f"labctl-t{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        uid = int(subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout)
        yield name, uid
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _chown_tree(path: Path, uid: int) -> None:
    for dirpath, _dirs, files in os.walk(path):
        os.chown(dirpath, uid, uid)
        for f in files:
            os.chown(os.path.join(dirpath, f), uid, uid)


def _hostile_tree(tmp_path: Path, uid: int) -> tuple[Path, Path]:
    """A built kernel tree of user ``uid`` whose Makefile touches a marker (stands for any command)."""
    tree = fake_tree(tmp_path)
    marker = tmp_path / "makefile-ran"
    (tree / "Makefile").write_text(f"modules:\n\ttouch {marker}\n")
    _chown_tree(tree, uid)
    return tree, marker


def _lab(tmp_path: Path, kernel: str) -> Path:
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"name: t\nnetworks: {{}}\nguests:\n  a:\n    kernel: {kernel}\n")
    return lab


# -- the reproductions ------------------------------------------------------------------

def test_a_tree_of_another_user_never_runs_its_makefile(tmp_path: Path, other_user: tuple[str, int],
                                                        cache: Path) -> None:
    name, uid = other_user
    tree, marker = _hostile_tree(tmp_path, uid)
    refused = None
    try:
        lab = load_lab(_lab(tmp_path, "{tree: linux}"))
    except LabFileError as exc:
        refused = exc
    else:  # what up does next: prepare the kernel, building the image's out-of-tree module against the tree
        spec = lab.guests["a"].kernel
        assert spec is not None
        prep.prepare(spec, prep.Options(initramfs_modules=("virtio_blk",), extra_modules=("buggy_nf",)))
    assert not marker.exists(), "the other user's Makefile ran"
    assert refused is not None and refused.exit_code == 2
    (problem,) = refused.problems
    assert (problem.line, problem.path) == (5, "guests.a.kernel.tree")
    assert f"kernel tree {tree} is not trusted" in problem.message
    assert f"owned by {name} (uid {uid})" in problem.message and f"--trust-dir {tree}" in problem.message


def test_modules_of_another_user_are_not_copied_to_the_guest(tmp_path: Path, other_user: tuple[str, int]) -> None:
    name, uid = other_user
    mods = tmp_path / "mods"
    (mods / "lib" / "modules" / "6.1.0").mkdir(parents=True)
    (tmp_path / "bz").write_bytes(b"kernel")
    _chown_tree(mods, uid)
    with pytest.raises(LabFileError) as info:
        load_lab(_lab(tmp_path, "{image: bz, modules: mods}"))
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (5, "guests.a.kernel.modules")
    assert f"owned by {name} (uid {uid})" in problem.message
    assert "copies its files onto the guests' disk" in problem.message


# -- the rule --------------------------------------------------------------------------------------

@as_root
def test_owner_and_write_bits_of_the_path_and_every_directory_above(tmp_path: Path) -> None:
    from labctl.lab.trust import untrusted_reason

    os.chmod(tmp_path, 0o755)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    assert untrusted_reason(mine) is None
    assert untrusted_reason(mine, uid=1234) is None  # root's is fine for anyone
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    assert "it is owned by nobody (uid 65534), not by root (you)" in str(untrusted_reason(theirs))
    assert untrusted_reason(theirs, uid=NOBODY) is None  # their own
    inside = theirs / "linux"
    inside.mkdir()  # root's directory under another user's: they can rename it away and put theirs there
    assert f"{theirs} is owned by nobody" in str(untrusted_reason(inside))
    for mode, word in ((0o775, "group-writable"), (0o757, "other-writable"), (0o777, "group- and other-writable")):
        d = tmp_path / f"m{mode:o}"
        d.mkdir()
        os.chmod(d, mode)
        assert f"it is {word} (mode 0{mode:o})" in str(untrusted_reason(d))
        (d / "sub").mkdir(mode=0o755)
        assert f"{d} is {word}" in str(untrusted_reason(d / "sub"))


@as_root
def test_a_sticky_directory_above_is_fine_a_missing_path_in_it_is_not(tmp_path: Path) -> None:
    from labctl.lab.trust import untrusted_reason

    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (sticky / "mine").mkdir(mode=0o755)
    assert untrusted_reason(sticky / "mine") is None  # nobody else can rename or remove it
    assert "it is group- and other-writable (mode 1777)" in str(untrusted_reason(sticky))
    why = str(untrusted_reason(sticky / "later" / "linux"))
    assert "does not exist" in why and f"{sticky} (mode 1777) lets other users create it" in why
    os.chmod(tmp_path, 0o755)
    assert untrusted_reason(tmp_path / "later" / "linux") is None  # nobody else can create it


@as_root
def test_a_symbolic_link_and_the_overrides(tmp_path: Path) -> None:
    from labctl.lab.trust import untrusted_reason

    os.chmod(tmp_path, 0o755)
    theirs = tmp_path / "theirs"
    (theirs / "linux").mkdir(parents=True)
    os.chown(theirs, NOBODY, NOBODY)
    (tmp_path / "link").symlink_to(theirs)
    assert "is a symbolic link" in str(untrusted_reason(tmp_path / "link"))
    assert untrusted_reason(theirs / "linux", trusted=[theirs]) is None  # the directory and what is under it
    assert untrusted_reason(theirs / "linux", trusted=[tmp_path / "link"]) is None  # given by a link to it
    assert untrusted_reason(theirs, trusted=[theirs / "linux"]) is not None  # not what is above it


@as_root
def test_trust_dir_and_the_environment_let_the_lab_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    os.chmod(tmp_path, 0o755)
    tree = fake_tree(tmp_path)
    os.chown(tree, NOBODY, NOBODY)
    lab = _lab(tmp_path, "{tree: linux}")
    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(LabFileError):
        load_lab(lab)
    assert load_lab(lab, [str(tree)]).guests["a"].kernel.tree == tree  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    assert load_lab(lab, ["linux"]).guests["a"].kernel is not None  # relative to the current directory
    monkeypatch.setenv(TRUST_ENV, f"relative/ignored:{tmp_path}")
    assert load_lab(lab).guests["a"].kernel is not None


# -- the command line ------------------------------------------------------------------------------

def _labctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != TRUST_ENV}
    env["LABCTL_STATE_DIR"] = str(cwd / "state")
    env["LABCTL_CACHE_DIR"] = str(cwd / "cache")
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "labctl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_validate_and_up_refuse_it_with_the_line_and_the_owner(tmp_path: Path, other_user: tuple[str, int]) -> None:
    name, uid = other_user
    os.chmod(tmp_path, 0o755)
    tree, marker = _hostile_tree(tmp_path, uid)
    _lab(tmp_path, "{tree: linux}")
    for args in (["validate", "lab.yaml"], ["up", "lab.yaml", "--accel", "tcg"], ["run", "lab.yaml"]):
        r = _labctl(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "lab.yaml:5: guests.a.kernel.tree:" in r.stderr and f"owned by {name} (uid {uid})" in r.stderr
    assert not marker.exists() and not (tmp_path / "state").exists() and not (tmp_path / "cache").exists()
    ok = _labctl("validate", "lab.yaml", "--trust-dir", str(tree), cwd=tmp_path)
    assert ok.returncode == 0 and "is valid" in ok.stdout, ok.stderr


# -- loose modules: a kernel's modules, never any directory ----------------------------------------

def test_loose_modules_must_look_like_a_kernels_modules(tmp_path: Path, cache: Path) -> None:
    """Even a directory of your own (or root's, /root or /etc) never goes onto the guests' disk
    unless it is a kernel's modules: lib/modules/RELEASE/ below it, or modules.dep/modules.order."""
    from labctl.lab.kernels import FILES, KernelSpec

    image = tmp_path / "vmlinux"
    image.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57 + b"Linux version 6.1.0-labctl-t\0")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "id_rsa").write_text("PRIVATE")
    spec = KernelSpec(FILES, image=image, modules=secrets)
    assert "holds neither lib/modules/RELEASE/ nor modules.dep" in str(prep.check(spec))
    with pytest.raises(Exception, match="no release directory"):
        prep.prepare(spec, prep.Options(initramfs_modules=()))
    assert not list(cache.rglob("id_rsa"))
    # a root file system has lib/modules/, but not this kernel's release: nothing else is taken
    for other in ("5.10.0-other", "6.1.0-other"):
        (secrets / "lib" / "modules" / other).mkdir(parents=True)
    assert prep.check(spec) is None
    with pytest.raises(Exception, match="have no lib/modules/6.1.0-labctl-t/"):
        prep.prepare(spec, prep.Options(initramfs_modules=()))
    (secrets / "lib" / "modules" / "6.1.0-labctl-t").mkdir()
    (secrets / "lib" / "modules" / "6.1.0-labctl-t" / "modules.order").write_text("")
    assert prep.check(KernelSpec(FILES, image=image,
                                 modules=secrets / "lib" / "modules" / "6.1.0-labctl-t")) is None
