"""Integration tests boot real guests: they need QEMU and the built image."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labctl.image.recipe import load_recipe
from labctl.image.store import Image, ImageStore
from labctl.kernel.store import Kernel


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def image() -> Image:
    """The default image; built by setup.sh (``labctl image build``) before the tests."""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.fail("qemu-system-x86_64 is missing: run setup.sh")
    img = ImageStore().get("debian-12", load_recipe("debian-12").key())
    if img is None:
        pytest.fail("the debian-12 image is not built: run 'labctl image build' (setup.sh does)")
    return img


@pytest.fixture(scope="session")
def kernel(image: Image) -> Kernel:
    """The image's default kernel, prepared by setup.sh (``labctl image build``)."""
    from labctl.kernel import lab as kernel_lab

    return kernel_lab.default_kernel(image, load_recipe(image.name))


@pytest.fixture(scope="session")
def tree_kernel() -> Path:
    """A kernel tree built from Debian's linux-source-6.1 with the fragment of
    tests/labs/valid/tree-kernel.yaml (scripts/test-kernel.sh): about 10 minutes
    the first time on a 2-core machine, then found in ~/.cache/labctl/test-kernel."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHON": sys.executable}
    res = subprocess.run(["bash", str(root / "scripts" / "test-kernel.sh")], cwd=root, env=env,
                         capture_output=True, text=True, timeout=3 * 3600)
    if res.returncode != 0:
        pytest.fail(f"scripts/test-kernel.sh failed ({res.returncode}):\n{res.stderr[-4000:]}")
    tree = Path(res.stdout.strip().splitlines()[-1])
    assert (tree / "vmlinux").is_file(), res.stdout
    return tree


def pids_matching(pattern: str) -> list[int]:
    """PIDs of processes whose command line matches ``pattern`` (pgrep -f)."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def qemu_pids_under(path: Path) -> list[int]:
    """PIDs of QEMU processes whose command line mentions ``path``."""
    return pids_matching(f"qemu-system.*{path}")


def wait_for(cond, timeout: float, what: str, interval: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


LIBVIRT_URI = os.environ.get("LABCTL_LIBVIRT_URI") or "qemu:///system"


def virsh(*args: str, uri: str = LIBVIRT_URI, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``virsh -c URI ARGS...``, output captured as text, never raising on failure."""
    return subprocess.run(["virsh", "-c", uri, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def require_libvirtd(uri: str = LIBVIRT_URI) -> None:
    """Skip the test unless libvirtd answers at ``uri`` (scripts/libvirt-setup.sh sets it up)."""
    if shutil.which("virsh") is None:
        pytest.skip("libvirt is not installed (virsh missing): run scripts/libvirt-setup.sh")
    version = virsh("version", uri=uri)
    if version.returncode != 0:
        pytest.skip(f"libvirtd is not reachable at {uri}: {version.stderr.strip()}")
