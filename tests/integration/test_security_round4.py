"""Issue 47 (round four) through the real CLI, root running labctl against a second, unprivileged
local user made for the module: that user's lab file naming root's 0600 bpftrace file, and that
user's pack whose index names a recipe directory of theirs as the image. Each is refused (exit 2,
no traceback) before anything starts: no guest, no Kbuild of theirs run."""

from __future__ import annotations

import os
import pwd
import random
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays another user: needs root (useradd)")


@pytest.fixture(scope="module")
def shared_tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="labctl-r4-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


@pytest.fixture(scope="module")
def evil(shared_tmp: Path) -> Iterator[pwd.struct_passwd]:
    name = f"labctl-r4-{random.randrange(10000, 99999)}"
    subprocess.run(["useradd", "-r", "-m", "-d", str(shared_tmp / "home"), "-s", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def _as(user: pwd.struct_passwd, path: Path, data: bytes) -> None:
    subprocess.run(["runuser", "-u", user.pw_name, "--", "sh", "-c", f"cat > {path}"], input=data, check=True, cwd="/")


def test_their_lab_file_gets_no_root_only_bpftrace_file(evil: pwd.struct_passwd, shared_tmp: Path, cli: Cli) -> None:
    secret = shared_tmp / "root.bt"
    secret.write_text('BEGIN { printf("root only\\n"); exit(); }\n')
    secret.chmod(0o600)
    lab = shared_tmp / "home" / "lab.yaml"
    _as(evil, lab, (f"name: r4bpf\nnetworks: {{}}\nguests:\n  a: {{}}\nsteps:\n  - name: s\n"
                    f"    run: [{{guest: a, command: 'true'}}]\n    trace:\n      a: {{bpftrace: {{file: {secret}}}}}\n")
        .encode())
    res = cli("up", str(lab), "--accel", "tcg", "--trust-dir", str(shared_tmp), timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"bpftrace file {secret} is not trusted: it belongs to root (uid 0), and the lab file to {evil.pw_name}" \
        in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "r4bpf" not in cli("status").stdout


def test_their_pack_runs_no_recipe_of_theirs(evil: pwd.struct_passwd, shared_tmp: Path, cli: Cli,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.lab import load_lab_text
    from labctl.pack import pack_lab
    from tests.unit.test_pack import LAB, fake_image, fake_tree_kernel
    from tests.unit.test_pack_security import _craft

    marker = shared_tmp / "ran-as"
    recipe = shared_tmp / "home" / "r"
    subprocess.run(["runuser", "-u", evil.pw_name, "--", "mkdir", "-p", str(recipe / "kbuild")], check=True, cwd="/")
    _as(evil, recipe / "recipe.toml", (f'name = "r"\nsuite = "bookworm"\nmirrors = []\n[kernel]\nabi = "6.1.0-56"\n'
                                       f'flavour = "amd64"\ninitramfs_modules = []\nextra_modules = ["{recipe}/kbuild"]\n'
                                       f'[rootfs]\npackages = []\n').encode())
    _as(evil, recipe / "kbuild" / "Kbuild", f"$(shell id > {marker})\nobj-m := x.o\n".encode())
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "cache"))
    good = tmp_path / "good.labpack"
    pack_lab(load_lab_text(LAB, str(tmp_path / "lab.yaml")), fake_image(tmp_path / "img"),
             {"a": fake_tree_kernel(tmp_path / "k" / "0123456789abcdef")}, good)
    bad = tmp_path / "bad.labpack"
    _craft(good, bad, lambda index, files: index["image"].update(name=str(recipe)))
    theirs = shared_tmp / "home" / "evil.labpack"
    _as(evil, theirs, bad.read_bytes())
    res = cli("up", "--dry-run", str(theirs), timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "image.name: not an image's name" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not marker.exists()
