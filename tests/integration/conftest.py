"""Integration tests boot real guests: they need QEMU and the built image."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.image.recipe import load_recipe
from labctl.image.store import Image, ImageStore
from labctl.kernel.cached import Kernel
from labctl.kernel.prepare import initrd as prepare_initrd

TREE_WAIT = 2400  # seconds a test that needs a kernel tree may wait for its build, beside its own timeout


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test here ``integration``; and for pytest-xdist (``--dist loadgroup``, as the
    project's pytest options ask), keep each file's tests on one worker (a module's shared lab
    boots once) unless the file names a group of its own (files that share session bundles)."""
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(Path(str(item.fspath)).name))
            # A test that needs a kernel tree may wait for its build first (a new machine: setup.sh builds
            # the 6.1 and then the 6.12 tree beside the tests, 20-35 min on a busy 2-core one): the wait is
            # not the test's own time (seen: test_driver_selftests' setup over 900 s at the 6.12 tree's lock).
            trees = {"tree_kernel", "tree_kernel_612"} & set(getattr(item, "fixturenames", ()))
            mark = item.get_closest_marker("timeout")
            if trees and (mark is None or (mark.args and mark.args[0] < TREE_WAIT)):
                item.add_marker(pytest.mark.timeout(TREE_WAIT + (mark.args[0] if mark and mark.args else 900)), append=False)


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
    from labctl.kernel.guest_kernels import default_kernel

    return default_kernel(image, load_recipe(image.name))


@pytest.fixture(scope="session")
def release(kernel: Kernel) -> str:
    """The image's default kernel's release (``6.1.0-56-amd64`` when written): the recipe's pinned
    ABI while Debian's archive carries it, else the newest of its line. Tests never name it: the
    archive moves."""
    return kernel.release


@pytest.fixture(scope="session")
def abi(release: str) -> str:
    """The default kernel's Debian ABI (``6.1.0-56``)."""
    return release.removesuffix("-amd64")


def another_abi(abi: str, flavour: str = "amd64") -> str:
    """An ABI of the same line the archive carries in ``flavour`` other than ``abi`` (the newest older
    one, else a newer one); the test is skipped, saying so, when the archive has none."""
    from labctl.image import apt

    line = abi.rsplit("-", 1)[0]
    others = [a for a in apt.abis(line, flavour) if a != abi]
    older = [a for a in others if int(a.rsplit("-", 1)[1]) < int(abi.rsplit("-", 1)[1])]
    if not others:
        pytest.skip(f"Debian's archive carries no {line} kernel in {flavour} besides {abi} today")
    return (older or others)[0]


def with_abi(text: str, abi: str) -> str:
    """A lab or expected output written for ABI 6.1.0-56, for the default kernel's ABI of today."""
    return text.replace("6.1.0-56", abi)


def _built_tree(series: str) -> Path:
    """The suite's kernel tree of ``series`` (scripts/test-kernel.sh), built in the suite's store,
    which outlives the run (tests/isolation.py)."""
    from tests import isolation

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHON": sys.executable, "LABCTL_CACHE_DIR": os.environ[isolation.SUITE_CACHE_ENV],
           "SERIES": series}
    res = subprocess.run(["bash", str(root / "scripts" / "test-kernel.sh")], cwd=root, env=env,
                         capture_output=True, text=True, timeout=3 * 3600, check=False)
    if res.returncode != 0:
        pytest.fail(f"SERIES={series} scripts/test-kernel.sh failed ({res.returncode}):\n{res.stderr[-4000:]}")
    tree = Path(res.stdout.strip().splitlines()[-1])
    assert (tree / "vmlinux").is_file(), res.stdout
    return tree


@pytest.fixture(scope="session")
def tree_kernel() -> Path:
    """A kernel tree built from Debian's linux-source-6.1 with the fragment of
    tests/labs/valid/tree-kernel.yaml (scripts/test-kernel.sh): a few minutes the first time
    on a 2-core machine, then found in the suite's store (~/.cache/labctl-test/test-kernel)."""
    return _built_tree("6.1")


@pytest.fixture(scope="session")
def tree_kernel_612() -> Path:
    """The same from Debian's linux-source-6.12 (6.12.117, the 6.12 kernel the suite boots, while the
    archive carries it): ~/.cache/labctl-test/test-kernel-6.12."""
    return _built_tree("6.12")


@pytest.fixture(scope="session")
def crash_tool() -> Path:
    """A crash(8) that reads 6.12's vmcores (scripts/crash-build.sh): the host's when it is 8.0.3 or
    newer, else one built once from Debian 13's source into the suite's store (~/.cache/labctl-test/tools)."""
    from tests import isolation

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LABCTL_CACHE_DIR": os.environ[isolation.SUITE_CACHE_ENV]}
    res = subprocess.run(["bash", str(root / "scripts" / "crash-build.sh")], cwd=root, env=env,
                         capture_output=True, text=True, timeout=3600, check=False)
    if res.returncode != 0:
        pytest.fail(f"scripts/crash-build.sh failed ({res.returncode}):\n{res.stderr[-4000:]}")
    tool = Path(res.stdout.strip().splitlines()[-1])
    assert os.access(tool, os.X_OK), res.stdout
    return tool


def pids_matching(pattern: str) -> list[int]:
    """PIDs of processes whose command line matches ``pattern`` (pgrep -f)."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def qemu_pids_under(path: Path) -> list[int]:
    """PIDs of QEMU processes whose command line mentions a file in ``path`` (not in a sibling
    that shares its prefix: st1 and st10)."""
    return pids_matching(f"qemu-system.*{path}/")


def wait_for(cond, timeout: float, what: str, interval: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


LIBVIRT_URI = os.environ.get("LABCTL_LIBVIRT_URI") or "qemu:///system"


def reset_while_pinging(cli: Any, lab: str, guest: str, pinger: str, target: str) -> dict[str, Any]:
    """Crash ``guest`` with sysrq, wait until status says so, and ``labctl reset`` it while
    ``pinger`` pings ``target`` (a neighbour on another link) 25 times; the reset's one guest
    entry (``--json``). The reset succeeds and not one ping is lost."""
    import json
    import threading

    cli("exec", lab, guest, "--", "echo c > /proc/sysrq-trigger")  # the session dies with the kernel

    def state() -> str:
        (data,) = json.loads(cli("status", lab, "--json", check=True).stdout)["labs"]
        return str({g["name"]: g["state"] for g in data["guests"]}[guest])

    wait_for(lambda: state() == "crashed", 60, f"guest {guest} to be seen crashed")
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(
        p=cli("exec", lab, pinger, "--", "ping", "-c", "25", "-i", "0.2", "-W", "2", target)))
    thread.start()
    time.sleep(1.0)
    reset = cli("reset", lab, guest, "--json")
    thread.join()
    assert reset.returncode == 0, reset.stdout + reset.stderr
    (back,) = json.loads(reset.stdout)["guests"]
    ping = result["p"]
    assert ping.returncode == 0 and " 0% packet loss" in ping.stdout, ping.stdout
    return dict(back)


def virsh(*args: str, uri: str = LIBVIRT_URI, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``virsh -c URI ARGS...``, output captured as text, never raising on failure."""
    return subprocess.run(["virsh", "-c", uri, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def pool_volumes_of(image: Image, kernel: Kernel) -> dict[str, tuple[Path, str]]:
    """The volumes a guest of ``image`` on ``kernel`` needs in libvirt's labctl pool, each
    named by the sha256 of its content (computed here, not taken from a manifest), and the
    cached file it must hold, with that sum: the root file system, the kernel, its initramfs for this
    image and, when the kernel has modules, its modules disk."""
    def sha(path: Path) -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    files = {f"{image.name}-rootfs.img": image.rootfs, "kernel-boot": kernel.boot,
             "kernel-initrd": prepare_initrd(kernel, image.initramfs_cpio, image.key)}
    if kernel.modules_img is not None:
        files["kernel-modules"] = kernel.modules_img
    sums = {label: (path, sha(path)) for label, path in files.items()}
    return {f"{label}-{digest[:16]}": (path, digest) for label, (path, digest) in sums.items()}


def require_libvirtd(uri: str = LIBVIRT_URI) -> None:
    """Skip the test unless libvirtd answers at ``uri`` (scripts/libvirt-setup.sh sets it up)."""
    if shutil.which("virsh") is None:
        pytest.skip("libvirt is not installed (virsh missing): run scripts/libvirt-setup.sh")
    version = virsh("version", uri=uri)
    if version.returncode != 0:
        pytest.skip(f"libvirtd is not reachable at {uri}: {version.stderr.strip()}")
    import importlib.util

    if importlib.util.find_spec("libvirt") is None:  # libvirtd set up for another checkout's .venv
        pytest.skip(f"libvirt-python is not installed in {sys.prefix}: run scripts/libvirt-setup.sh "
                    "(setup.sh does when CI or LABCTL_LIBVIRT is set)")


# --------------------------------------------------------------------------- real bundles, shared

def short_lab(lab: str, directory: Path, seconds: int, edit: Any = None) -> Path:
    """A copy of ``labs/LAB`` with every ``-t N`` transfer shortened to ``seconds`` (and ``edit(text)`` applied)."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = re.sub(r" -t \d+", f" -t {seconds}", (root / "labs" / lab).read_text())
    if edit is not None:
        text = edit(text)
    path = directory / lab
    path.write_text(text)
    return path


def run_bundle(cli: Any, lab: Path, out: Path) -> Path:
    """``labctl run LAB --accel tcg --json``, which must succeed; the bundle's directory."""
    import json

    res = cli("run", str(lab), "--out", str(out), "--accel", "tcg", "--json", timeout=1500)
    assert res.returncode == 0, res.stdout + res.stderr
    outcome = json.loads(res.stdout)
    assert outcome["status"] == "ok", outcome
    bundle = Path(outcome["bundle"])
    assert bundle.parent == out
    assert qemu_pids_under(cli.state_dir) == []  # run takes the lab down
    return bundle


@pytest.fixture(scope="session")
def session_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The ``cli`` fixture for bundles that several tests share (one state directory); its labs
    are taken down at the end of the run, whatever happened."""
    from tests import harness
    from tests.conftest import new_cli

    c = new_cli(tmp_path_factory, "sst")
    assert c.tracked is not None
    c.tracked.test = f"session_cli (first used by {harness.current_test()})"
    yield c
    harness.teardown(c.tracked)


@pytest.fixture(scope="session")
def nic_cost_run(session_cli: Any, image: Image, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """labs/nic-driver-cost.yaml with 3 s transfers: (lab file, bundle). Shared by every test that reads it."""
    d = tmp_path_factory.mktemp("ndc")
    lab = short_lab("nic-driver-cost.yaml", d, 3)
    return lab, run_bundle(session_cli, lab, d / "runs")


@pytest.fixture(scope="session")
def skb_latency_run(session_cli: Any, image: Image, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """labs/skb-latency.yaml, 2 s streams, rtl8139 and virtio-net-pci only: (lab file, bundle)."""
    d = tmp_path_factory.mktemp("skb")
    lab = short_lab("skb-latency.yaml", d, 2,
                    lambda text: text.replace("      - {label: e1000, nic: eth2, server: 10.42.0.2}\n", ""))
    return lab, run_bundle(session_cli, lab, d / "runs")
