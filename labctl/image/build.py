"""Build a guest image from its recipe.

Stages (the downloads and the rootfs run side by side)::

    kernel .deb  --> vmlinux (PVH ELF) + modules --+
    -dbg .deb    --> vmlinux.debug + module debug  +--> rootfs.img + initrd.img + manifest.json
    mmdebstrap   --> root file system -------------+

Everything is written to a temporary directory beside the final one and
renamed into place at the end, so a cached image is always complete.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path

from labctl import __version__
from labctl.errors import ImageError, LabctlError
from labctl.events import NullReporter, Reporter
from labctl.image import initramfs
from labctl.image.kernel import extract_vmlinux, module_load_order, nic_driver_rules
from labctl.image.recipe import Recipe
from labctl.image.store import (
    CONFIG,
    DEBUG_MODULES,
    INITRD,
    MANIFEST,
    ROOTFS,
    SYSTEM_MAP,
    VMLINUX,
    VMLINUX_DEBUG,
    Image,
    ImageStore,
)
from labctl.paths import atomic_write, cache_dir, resource_dir
from labctl.proc import pid_alive, run, run_pipeline

# What the image itself needs on the kernel command line (labctl's boot
# policy, console and speed flags are added by labctl.up.bootargs).
BOOT_ARGS = ["root=/dev/vda", "rw", "rootfstype=ext4", "init=/sbin/labctl-init", "net.ifnames=0"]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def apt_download(package: str, downloads: Path) -> Path:
    """The .deb of ``package`` (candidate version), downloaded once into ``downloads``.

    :raise ImageError: when apt cannot find or fetch it.
    """
    downloads.mkdir(parents=True, exist_ok=True)
    version = _apt_candidate(package)
    name = f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    target = downloads / name
    if target.is_file():
        return target
    tmp = downloads / f".tmp-{package}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", f"{package}={version}"],
            timeout=1800, cwd=tmp)
        debs = list(tmp.glob("*.deb"))
        if len(debs) != 1:
            raise ImageError(f"apt-get download {package} gave no .deb")
        debs[0].rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _apt_candidate(package: str) -> str:
    out = run(["apt-cache", "policy", package], timeout=60).stdout.decode()
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            cand = line.split(":", 1)[1].strip()
            if cand and cand != "(none)":
                return cand
    raise ImageError(f"apt knows no package '{package}'",
                     hint="run 'apt-get update' (the image pins this kernel ABI in its recipe)")


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """One build of a recipe at a time (two would fight over the same work directory).

    :raise ImageError: when another labctl is building it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".build.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ImageError(f"another labctl is building an image in {directory}",
                             hint="wait for it to finish, then run the command again") from exc
        yield
    finally:
        os.close(fd)


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
        self.downloads = cache_dir() / "downloads"
        self.versions: dict[str, str] = {}

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
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            kernel = pool.submit(self._kernel_side)
            with self.r.step("root file system (mmdebstrap)"):
                self._mmdebstrap()
            kernel.result()
        with self.r.step("kernel modules"):
            self._install_modules()
        with self.r.step("guest init and initramfs"):
            self._customize()
            self._initramfs()
        with self.r.step("root file system image"):
            self._rootfs_image()
        with self.r.step("manifest"):
            self._manifest()

    def _kernel_side(self) -> None:
        rc = self.recipe
        with self.r.step(f"download {rc.kernel_package}"):
            deb = apt_download(rc.kernel_package, self.downloads)
            self.versions[rc.kernel_package] = deb.name.split("_")[1]
        with self.r.step("unpack kernel"):
            kdir = self.work / "kernel"
            run(["dpkg-deb", "-x", deb, kdir], timeout=600)
            extract_vmlinux(kdir / "boot" / f"vmlinuz-{rc.kernel_release}", self.work / "vmlinux")
            for name in (SYSTEM_MAP, CONFIG):
                shutil.copy(kdir / "boot" / f"{name}-{rc.kernel_release}", self.work / name)
        with self.r.step(f"download {rc.debug_package} (large)"):
            dbg = apt_download(rc.debug_package, self.downloads)
            self.versions[rc.debug_package] = dbg.name.split("_")[1]
        with self.r.step("extract vmlinux with debug info"):
            self._extract_debug(dbg)

    def _extract_debug(self, deb: Path) -> None:
        """vmlinux with DWARF (+ module debug files) from the -dbg package.

        Extraction reads the whole 850 MB package (~1 min), so its result is
        kept beside the downloads, keyed by the package file, and hard-linked
        into each image that uses it.
        """
        rc = self.recipe
        kept = cache_dir() / "kernels" / deb.stem
        if not (kept / VMLINUX_DEBUG).is_file():
            tmp = kept.with_name(f".{deb.stem}-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                base = f"./usr/lib/debug/lib/modules/{rc.kernel_release}"
                patterns = [f"./usr/lib/debug/boot/vmlinux-{rc.kernel_release}"]
                patterns += [f"{base}/{d}/*" for d in rc.debug_modules]
                run_pipeline([["dpkg-deb", "--fsys-tarfile", deb],
                              ["tar", "-x", "-C", tmp, "--wildcards", *patterns]], timeout=1800)
                (tmp / patterns[0]).rename(tmp / VMLINUX_DEBUG)
                if (tmp / base).is_dir():
                    (tmp / base).rename(tmp / DEBUG_MODULES)
                shutil.rmtree(tmp / "usr", ignore_errors=True)
                shutil.rmtree(kept, ignore_errors=True)
                tmp.rename(kept)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        os.link(kept / VMLINUX_DEBUG, self.work / VMLINUX_DEBUG)
        if (kept / DEBUG_MODULES).is_dir():
            shutil.copytree(kept / DEBUG_MODULES, self.work / DEBUG_MODULES, copy_function=os.link)

    def _mmdebstrap(self) -> None:
        rc = self.recipe
        argv = [
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

    def _install_modules(self) -> None:
        rc = self.recipe
        src = self.work / "kernel" / "lib" / "modules" / rc.kernel_release
        dst = self.root / "lib" / "modules" / rc.kernel_release
        excluded = {str(src / d) for d in rc.exclude_modules}

        def ignore(dirname: str, names: list[str]) -> list[str]:
            return [n for n in names if os.path.join(dirname, n) in excluded]

        shutil.copytree(src, dst, ignore=ignore, symlinks=True)
        self._extra_modules(dst)
        run(["chroot", self.root, "/sbin/depmod", "-a", rc.kernel_release], timeout=300)
        shutil.rmtree(self.work / "kernel")

    def _extra_modules(self, moddir: Path) -> None:
        """Build guest/modules/<name> against the host's headers for this kernel, into extra/."""
        rc = self.recipe
        if not rc.extra_modules:
            return
        headers = Path(f"/usr/src/linux-headers-{rc.kernel_release}")
        if not (headers / "Makefile").is_file():
            raise ImageError(f"kernel headers for {rc.kernel_release} are missing (needed for "
                             f"{', '.join(rc.extra_modules)})",
                             hint=f"apt-get install linux-headers-{rc.kernel_release} (setup.sh does)")
        extra = moddir / "extra"
        extra.mkdir(exist_ok=True)
        for name in rc.extra_modules:
            src = self.work / "modsrc" / name
            shutil.copytree(resource_dir("guest") / "modules" / name, src)
            # Source paths in the debug info read guest/modules/NAME/FILE.c, not the build dir.
            run(["make", "-C", headers, f"M={src}", f"KCFLAGS=-fdebug-prefix-map={src}=guest/modules/{name}",
                 "modules"], timeout=600)
            for ko in src.glob("*.ko"):
                shutil.copy(ko, extra / ko.name)
                dbg = self.work / DEBUG_MODULES / "extra"
                dbg.mkdir(parents=True, exist_ok=True)
                shutil.copy(ko, dbg / ko.name)  # built with -g: the oops decoder reads it
            for c in src.glob("*.c"):  # the source, for gdb's list and readers of decoded oopses
                shutil.copy(c, extra / c.name)

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

    def _initramfs(self) -> None:
        rc = self.recipe
        mods = self.root / "lib" / "modules" / rc.kernel_release
        order = module_load_order((mods / "modules.dep").read_text(), list(rc.initramfs_modules))
        entries = [initramfs.directory(d) for d in ("bin", "dev", "modules", "proc", "sys", "newroot")]
        entries.append(initramfs.chardev("dev/console", 5, 1))
        entries.append(initramfs.file("bin/busybox", (self.root / "bin" / "busybox").read_bytes(), 0o755))
        entries.append(initramfs.file("init", (resource_dir("guest") / "initramfs-init").read_bytes(), 0o755))
        nic_rules, nic_mods = nic_driver_rules((mods / "modules.dep").read_text(),
                                               (mods / "modules.alias").read_text())
        for rel in dict.fromkeys([*order, *nic_mods]):
            entries.append(initramfs.file(f"modules/{Path(rel).name}", (mods / rel).read_bytes()))
        names = "".join(f"{Path(rel).name}\n" for rel in order)
        entries.append(initramfs.file("modules/order", names.encode()))
        entries.append(initramfs.file("modules/nics", nic_rules.encode()))
        initramfs.write_cpio(entries, self.work / "initrd.img")

    def _rootfs_image(self) -> None:
        used_kib = int(run(["du", "-sk", "--apparent-size", self.root], timeout=300).stdout.split()[0])
        size_mib = int(used_kib / 1024 * 1.15) + self.recipe.free_mib
        self.versions.update(self._package_versions())
        run(["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "labroot",
             "-E", "root_owner=0:0", "-d", self.root, self.work / "rootfs.img", f"{size_mib}M"],
            timeout=900)
        shutil.rmtree(self.root)

    def _package_versions(self) -> dict[str, str]:
        out = run(["dpkg-query", f"--admindir={self.root}/var/lib/dpkg", "-W",
                   "-f", "${Package}\t${Version}\n"], timeout=120).stdout.decode()
        return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)

    def _manifest(self) -> None:
        rc = self.recipe
        files = {}
        for name in (VMLINUX, INITRD, ROOTFS, VMLINUX_DEBUG, SYSTEM_MAP, CONFIG):
            p = self.work / name
            files[name] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
        manifest = {
            "name": rc.name,
            "key": self.key,
            "description": rc.description,
            "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "labctl_version": __version__,
            "host": platform.node(),
            "suite": rc.suite,
            "kernel": {"release": rc.kernel_release, "package": rc.kernel_package,
                       "version": self.versions.get(rc.kernel_package, ""),
                       "debug_package": rc.debug_package},
            "boot_args": BOOT_ARGS,
            "files": files,
            "packages": dict(sorted(self.versions.items())),
        }
        (self.work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def build_image(recipe: Recipe, store: ImageStore | None = None,
                reporter: Reporter | None = None, force: bool = False) -> Image:
    """Build ``recipe`` into ``store`` (default: the user's cache) and return the image."""
    return Builder(recipe, store or ImageStore(), reporter).build(force=force)


def add_source(image: Image, reporter: Reporter | None = None) -> Path:
    """Unpack the kernel source matching ``image`` into ``<image>/source`` (for gdb's list).

    Uses Debian's ``linux-source-X.Y`` at the image kernel's version; idempotent.

    :raise ImageError: when the package cannot be had.
    """
    r = reporter or NullReporter()
    dest = image.dir / "source"
    if dest.is_dir() and any(dest.iterdir()):
        r.note(f"kernel source already in {dest}")
        return dest
    release = image.kernel_release  # 6.1.0-56-amd64
    major_minor = ".".join(release.split(".")[:2])
    package = f"linux-source-{major_minor}"
    version = str(image.manifest.get("kernel", {}).get("version", ""))
    with r.step(f"download {package}"):
        deb = apt_download(package, cache_dir() / "downloads")
    if version and f"_{version}_" not in deb.name:
        raise ImageError(f"{deb.name} does not match the image kernel {version}",
                         hint="run 'apt-get update', or rebuild the image")
    tmp = image.dir / f".source-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with r.step("unpack kernel source"):
            run_pipeline([["dpkg-deb", "--fsys-tarfile", deb],
                          ["tar", "-x", "-C", tmp, "--wildcards", "./usr/src/linux-source-*.tar.xz"]], timeout=1800)
            (tarball,) = list((tmp / "usr" / "src").glob("linux-source-*.tar.xz"))
            out = tmp / "tree"
            out.mkdir()
            run(["tar", "-xJf", tarball, "-C", out], timeout=1800)
        out.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    manifest = dict(image.manifest)
    manifest["source"] = {"package": package, "file": deb.name, "dir": "source"}
    atomic_write(image.dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return dest
