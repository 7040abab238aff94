"""Build a guest image from its recipe: the root file system every kernel boots on.

Stages::

    mmdebstrap --> root file system + labctl's init --> rootfs.img
    busybox + labctl's early init                   --> initramfs.cpio (the image's share of every initramfs)

The kernel is not part of the image: each kernel (the recipe's default
Debian one, another Debian ABI, a user's tree) is prepared on its own by
:mod:`labctl.kernel.prepare`, so changing it never rebuilds this.

Everything is written to a temporary directory beside the final one and
renamed into place at the end, so a cached image is always complete.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path

import labctl.image.cpio as initramfs
from labctl import __version__
from labctl.errors import ImageError, LabctlError
from labctl.events import NullReporter, Reporter
from labctl.image.apt import sha256_file
from labctl.image.recipe import Recipe
from labctl.image.store import AGENT_BUILTINS, INITRAMFS_CPIO, MANIFEST, ROOTFS, Image, ImageStore
from labctl.paths import alone, atomic_write, resource_dir
from labctl.proc import pid_alive, run

# What the image itself needs on the kernel command line (labctl's boot
# policy, console and speed flags are added by labctl.up.bootargs).
BOOT_ARGS = ["root=/dev/vda", "rw", "rootfstype=ext4", "init=/sbin/labctl-init", "net.ifnames=0"]
# The host's bash-builtins headers: guest/builtins.c is built against them (Debian 12 on both sides).
BASH_HEADERS = Path("/usr/include/bash")


def build_agent_builtins(out: Path) -> bool:
    """guest/builtins.c built as the bash loadable ``out``; False (nothing built) without gcc or the
    host's bash-builtins headers.

    The image's agent (guest/init) sets the clock and renames the standby sshd's key file with it,
    in its own process: a guest restored under TCG pays 0.07-0.2 s for each program it runs first.
    Without it the agent runs date and mv.

    :raise ProcessError: when gcc fails.
    """
    gcc = shutil.which("gcc")
    if gcc is None or not (BASH_HEADERS / "builtins.h").is_file():
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    run([gcc, "-O2", "-Wall", "-fPIC", "-shared", "-DHAVE_CONFIG_H", f"-I{BASH_HEADERS}",
         f"-I{BASH_HEADERS}/include", f"-I{BASH_HEADERS}/builtins", "-o", out,
         resource_dir("guest") / "builtins.c"], timeout=300)
    return True


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """One build of a recipe at a time (two would fight over the same work directory).

    :raise ImageError: when another labctl is building it.
    """
    with alone(directory / ".build.lock", ImageError(f"another labctl is building an image in {directory}",
                                                     hint="wait for it to finish, then run the command again")):
        yield


def _mounted_under(path: Path) -> list[str]:
    """Mount points at or under ``path`` (a killed mmdebstrap can leave /proc, /dev... mounted)."""
    prefix = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return [prefix]  # cannot tell: treat it as mounted
    points = [ln.split()[4].replace("\\040", " ") for ln in lines if len(ln.split()) > 4]
    return [m for m in points if m == prefix or m.startswith(prefix + "/")]


def remove_stale_work(directory: Path) -> list[Path]:
    """Remove the work directories (``.build-KEY-PID``) of builds whose process is gone.

    A directory with anything still mounted under it is left alone (removing
    it could reach into the host's /dev or /proc). Returns what was removed.
    """
    removed = []
    for work in sorted(directory.glob(".build-*-*")):
        pid = work.name.rsplit("-", 1)[1]
        if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)) or _mounted_under(work):
            continue
        shutil.rmtree(work, ignore_errors=True)
        removed.append(work)
    return removed


class Builder:
    """Builds one recipe into the store. Use :meth:`build`."""

    def __init__(self, recipe: Recipe, store: ImageStore, reporter: Reporter | None = None) -> None:
        self.recipe = recipe
        self.store = store
        self.r = reporter or NullReporter()
        self.key = recipe.key()
        self.final = store.path_for(recipe.name, self.key)
        self.work = self.final.parent / f".build-{self.key}-{os.getpid()}"
        self.root = self.work / "root"
        self.versions: dict[str, str] = {}
        self.kernel_release = recipe.kernel_release  # the default kernel, as the archive has it when built

    def build(self, force: bool = False) -> Image:
        """Build (or find) the image. Idempotent: an up-to-date image is returned as is.

        :raise ImageError: when any stage fails; nothing partial is left behind.
        """
        existing = self.store.get(self.recipe.name, self.key)
        if existing and not force:
            self.r.note(f"image {self.recipe.name} ({self.key}) is up to date")
            return existing
        if os.geteuid() != 0:
            raise ImageError("building an image needs root (mmdebstrap, device nodes)",
                             hint="run 'labctl image build' as root once; labs then run as any user")
        with build_lock(self.final.parent):
            existing = self.store.get(self.recipe.name, self.key)  # built meanwhile by the lock's holder
            if existing and not force:
                return existing
            for stale in remove_stale_work(self.final.parent):
                self.r.note(f"removed {stale}, left by a build that was killed")
            return self._build_locked()

    def _build_locked(self) -> Image:
        self.kernel_release, followed = self.recipe.kernel_today()
        if followed:
            self.r.note(followed)
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        try:
            self._build_all()
            if self.final.exists():
                shutil.rmtree(self.final)
            self.work.rename(self.final)
        except LabctlError:
            raise
        except OSError as exc:
            raise ImageError(f"building image {self.recipe.name} failed: {exc}") from exc
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
        img = self.store.get(self.recipe.name, self.key)
        assert img is not None
        for old in self.store.prune(self.recipe.name, keep=2):
            self.r.note(f"removed an older build of {old.name} ({old.key})")
        return img

    def _build_all(self) -> None:
        with self.r.step("root file system (mmdebstrap)"):
            self._mmdebstrap()
        with self.r.step("guest init and initramfs"):
            self._customize()
            self._agent_builtins()
            self._initramfs()
        with self.r.step("root file system image"):
            self._rootfs_image()
        with self.r.step("manifest"):
            self._manifest()

    def _mmdebstrap(self) -> None:
        rc = self.recipe
        argv: list[str | Path] = [
            "mmdebstrap", "--quiet", "--mode=root", f"--variant={rc.variant}",
            f"--include={','.join(rc.packages)}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--dpkgopt=path-exclude=/usr/share/info/*",
            rc.suite, self.root, *rc.mirrors,
        ]
        run(argv, timeout=1800)

    def _customize(self) -> None:
        guest = resource_dir("guest")
        init = self.root / "sbin" / "labctl-init"
        shutil.copy(guest / "init", init)
        init.chmod(0o755)
        conf_d = self.root / "etc" / "ssh" / "sshd_config.d"
        conf_d.mkdir(parents=True, exist_ok=True)
        shutil.copy(guest / "sshd_config", conf_d / "labctl.conf")
        for key in (self.root / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()  # every lab brings its own host key
        (self.root / "root" / ".ssh").mkdir(mode=0o700, exist_ok=True)
        for cache in (self.root / "var" / "cache" / "apt").glob("*.bin"):
            cache.unlink()
        (self.root / "etc" / "labctl-image").write_text(f"{self.recipe.name} {self.key}\n")
        # The kernel's modules come on their own read-only disk, mounted here by the initramfs:
        # the root file system holds none, so any kernel boots on it.
        modules = self.root / "lib" / "modules"
        shutil.rmtree(modules, ignore_errors=True)
        modules.mkdir(parents=True)

    def _agent_builtins(self) -> None:
        if not build_agent_builtins(self.root / AGENT_BUILTINS.lstrip("/")):
            self.r.note("no gcc or bash-builtins headers on this host: the guest agent runs date and mv "
                        "(each warm start and reset about 0.15 s slower under TCG)")

    def _initramfs(self) -> None:
        """The image's share of every initramfs: static busybox and labctl's early init.

        Each kernel adds its own share (its disk and NIC drivers,
        :mod:`labctl.kernel.prepare`); the two archives are concatenated.
        """
        entries = [initramfs.directory(d) for d in ("bin", "dev", "proc", "sys", "newroot")]
        entries.append(initramfs.chardev("dev/console", 5, 1))
        entries.append(initramfs.file("bin/busybox", (self.root / "bin" / "busybox").read_bytes(), 0o755))
        entries.append(initramfs.file("init", (resource_dir("guest") / "initramfs-init").read_bytes(), 0o755))
        initramfs.write_cpio(entries, self.work / INITRAMFS_CPIO)

    def _rootfs_image(self) -> None:
        used_kib = int(run(["du", "-sk", "--apparent-size", self.root], timeout=300).stdout.split()[0])
        size_mib = int(used_kib / 1024 * 1.15) + self.recipe.free_mib
        self.versions.update(self._package_versions())
        run(["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "labroot",
             "-E", "root_owner=0:0", "-d", self.root, self.work / ROOTFS, f"{size_mib}M"],
            timeout=900)
        shutil.rmtree(self.root)

    def _package_versions(self) -> dict[str, str]:
        out = run(["dpkg-query", f"--admindir={self.root}/var/lib/dpkg", "-W",
                   "-f", "${Package}\t${Version}\n"], timeout=120).stdout.decode()
        return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)

    def _manifest(self) -> None:
        rc = self.recipe
        files = {name: {"size": (self.work / name).stat().st_size, "sha256": sha256_file(self.work / name)}
                 for name in (ROOTFS, INITRAMFS_CPIO)}
        manifest = {
            "name": rc.name,
            "key": self.key,
            "description": rc.description,
            "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "labctl_version": __version__,
            "host": platform.node(),
            "suite": rc.suite,
            "default_kernel": f"debian:{self.kernel_release}",
            "pinned_kernel": f"debian:{rc.kernel_release}",
            "boot_args": BOOT_ARGS,
            "files": files,
            "packages": dict(sorted(self.versions.items())),
        }
        atomic_write(self.work / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def build_image(recipe: Recipe, store: ImageStore | None = None,
                reporter: Reporter | None = None, force: bool = False) -> Image:
    """Build ``recipe`` into ``store`` (default: the user's cache) and return the image."""
    return Builder(recipe, store or ImageStore(), reporter).build(force=force)
