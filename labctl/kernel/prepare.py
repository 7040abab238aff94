"""Preparing a kernel once, keyed by its content: Debian packages, a built tree, or loose files.

What depends on the kernel is made here and cached (:mod:`labctl.kernel.cached`):
the boot file, its modules as a read-only disk, the kernel's share of the
initramfs, debug info, config and System.map. The root file system is the
image's and is never rebuilt for a kernel. The key hashes what the kernel
is made of (the Debian packages' versions; a tree's vmlinux, .config and
modules; loose files' bytes) with the image recipe's module options, so
rebuilding a tree gives a new key and an unchanged tree finds its kernel
at once.

:func:`check` says why a kernel cannot be used (missing tree, a tree that
was not built, an unknown Debian ABI) before anything is prepared;
:func:`prepare` does the work, under a lock per key, in a temporary
directory renamed into place at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import labctl.kernel.modbuild as modbuild  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import __version__
from labctl.errors import ImageError, LabctlError
from labctl.events import NullReporter, Reporter
from labctl.image import apt_download, candidate, cpio_directory, cpio_file, sha256_file, versions, write_cpio
from labctl.kernel.cached import (
    BOOT,
    CONFIG,
    DEBUG_MODULES,
    MANIFEST,
    MODULES_IMG,
    SYSTEM_MAP,
    VMLINUX_DEBUG,
    Kernel,
    kernels_root,
)
from labctl.kernel.kconfig import extract_ikconfig
from labctl.kernel.modules import builtin_names, module_load_order, nic_driver_rules
from labctl.kernel.vmlinux import banner, boot_image, build_id, has_dwarf, is_elf
from labctl.lab import DEBIAN, TREE, KernelSpec
from labctl.paths import atomic_write, build_into, exclusive, resource_dir
from labctl.proc import run, run_pipeline, run_pipeline_output

PREPARE_VERSION = "2"  # bump when what is prepared changes for the same inputs
KERNEL_CPIO = "initramfs-modules.cpio"  # the kernel's share of the initramfs (its disk and NIC drivers)


@dataclass(frozen=True)
class Options:
    """How every kernel is prepared for an image (its recipe's ``[kernel]`` section, but ABI and flavour)."""

    initramfs_modules: tuple[str, ...]  # loaded by the initramfs, dependencies first (virtio, ext4, fw_cfg)
    exclude_modules: tuple[str, ...] = ()  # module directories left out of the modules disk
    debug_modules: tuple[str, ...] = ()  # module directories whose debug files are kept (Debian -dbg)
    extra_modules: tuple[str, ...] = ()  # guest/modules/<name> built against the kernel when possible

    def key_text(self) -> str:
        return json.dumps([self.initramfs_modules, self.exclude_modules, self.debug_modules,
                           self.extra_modules, _extra_sources(self.extra_modules)])


def _extra_sources(names: tuple[str, ...]) -> list[str]:
    """A digest of every out-of-tree module's source (a change rebuilds it)."""
    out = []
    for name in names:
        h = hashlib.sha256()
        for f in sorted((resource_dir("guest") / "modules" / name).glob("*")):
            if f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes())
        out.append(h.hexdigest())
    return out


def debian_packages(spec: KernelSpec) -> tuple[str, str]:
    """The kernel and debug packages of a Debian kernel: ``linux-image-6.1.0-56-amd64-unsigned`` and
    ``-dbg``, ``linux-image-6.12.117+deb12-amd64-unsigned`` and ``-dbg`` (its release as the name)."""
    return f"linux-image-{spec.release}-unsigned", f"linux-image-{spec.release}-dbg"


def debian_version(spec: KernelSpec) -> str | None:
    """The Debian version a Debian kernel is prepared from (its image, its ``-dbg``, its headers and
    source all at that one version): the newest the archive carries of its ABI's package, else that
    of a kernel prepared from it before (the archive dropped the ABI; the cache keeps the kernel),
    else None."""
    package, _dbg = debian_packages(spec)
    return candidate(package) or _prepared_version(package)


def _prepared_version(package: str) -> str | None:
    found: list[str] = []
    for manifest in kernels_root().glob(f"*/{MANIFEST}"):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            deb = json.loads(manifest.read_text()).get("debian") or {}
            if deb.get("package") == package and isinstance(deb.get("version"), str):
                found.append(deb["version"])
    return max(found) if found else None


def archive_releases(names: Iterable[str], line: str, flavour: str) -> list[str]:
    """The ABIs of kernel ``line`` (``6.12``) and ``flavour`` that ``names`` (the archive's package
    names) has both packages of (:func:`debian_packages`), oldest first: ``6.12.107+deb12``..."""
    pattern = re.compile(rf"linux-image-(?P<abi>{re.escape(line)}\.\d+(?:-\d+|\+deb\d+))-{re.escape(flavour)}"
                         r"-(?P<kind>unsigned|dbg)")
    kinds: dict[str, set[str]] = {}
    for name in names:
        if m := pattern.fullmatch(name.strip()):
            kinds.setdefault(m["abi"], set()).add(m["kind"])
    return sorted((abi for abi, k in kinds.items() if k == {"unsigned", "dbg"}), key=_version_key)


def _version_key(abi: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", abi))


def _archive_names(line: str) -> list[str]:
    """The package names apt knows that start with ``linux-image-LINE`` (from its lists, no network)."""
    out = run(["apt-cache", "pkgnames", "--", f"linux-image-{line}"], timeout=60, check=False).stdout
    return out.decode(errors="replace").split()


def _not_in_archive(spec: KernelSpec, package: str) -> str:
    """Why a Debian kernel cannot be had, with the releases of its line and flavour the archive has."""
    line, flavour = str(spec.series), str(spec.flavour)
    have = archive_releases(_archive_names(line), line, flavour)
    listed = (f"the archive has {line} {flavour} kernels {', '.join(have)}" if have
              else f"the archive has no {line} kernel of flavour {flavour}")
    return (f"Debian has no kernel {spec.release} ({package} is not in the archive); {listed} "
            "(run 'apt-get update' for newer ones)")


def _tree_kernel(tree: Path) -> Path | None:
    """A built tree's kernel: ``vmlinux`` (ELF, boots directly), else ``arch/x86/boot/bzImage``."""
    for candidate_path in (tree / "vmlinux", tree / "arch" / "x86" / "boot" / "bzImage"):
        if candidate_path.is_file():
            return candidate_path
    return None


def check(spec: KernelSpec) -> str | None:
    """Why ``spec`` cannot be prepared here (cheap checks only), or None."""
    if spec.kind == DEBIAN:
        package, _dbg = debian_packages(spec)
        version = debian_version(spec)
        if version is None:
            return _not_in_archive(spec, package)
        if candidate(package) is not None and version not in versions(_dbg):  # its debug info at its version
            return _not_in_archive(spec, _dbg)
        return None
    if spec.kind == TREE:
        tree = spec.tree
        assert tree is not None
        if not tree.is_dir():
            return f"no kernel tree at {tree}"
        if _tree_kernel(tree) is None:
            return f"{tree} was not built (no vmlinux or arch/x86/boot/bzImage): run make there first"
        if not (tree / ".config").is_file():
            return f"{tree} has no .config"
        if not (tree / "include" / "config" / "kernel.release").is_file():
            return f"{tree} has no include/config/kernel.release: run make there first"
        return None
    for what, path in (("image", spec.image), ("modules", spec.modules), ("debug", spec.debug),
                       ("config", spec.config)):
        if path is not None and not path.exists():
            return f"the kernel's {what} {path} does not exist"
    if spec.modules is not None and not _modules_layout(spec.modules):
        return (f"the kernel's modules {spec.modules} holds neither lib/modules/RELEASE/ nor modules.dep or "
                "modules.order: labctl copies a kernel's modules onto the guests' disk, nothing else")
    return None


def _is_release_dir(path: Path) -> bool:
    """A kernel's ``lib/modules/<release>`` itself: it has ``modules.dep`` or ``modules.order``."""
    return (path / "modules.dep").is_file() or (path / "modules.order").is_file()


def _modules_layout(path: Path) -> bool:
    """``modules:`` of loose files looks like a kernel's modules: ``lib/modules/<release>/`` below it,
    or a release directory itself (never any directory, whose files would go onto the guests' disk)."""
    under = path / "lib" / "modules"
    return path.is_dir() and ((under.is_dir() and any(d.is_dir() for d in under.iterdir()))
                              or _is_release_dir(path))


def config_text(spec: KernelSpec) -> str | None:
    """The kernel's configuration, read before anything is prepared (preflight): a Debian
    kernel's from its package (downloaded, kept), a tree's ``.config``, or the one embedded in
    loose files' image (``CONFIG_IKCONFIG``). None when it cannot be known.

    :raise ImageError: when a Debian package cannot be downloaded.
    """
    if spec.kind == DEBIAN:
        package, _dbg = debian_packages(spec)
        deb = apt_download(package, _version(spec))
        kept = deb.with_name(deb.name + ".config")  # extracted once: reading the .deb takes seconds
        if kept.is_file():
            return kept.read_text(errors="replace") or None
        out = run_pipeline_output([["dpkg-deb", "--fsys-tarfile", str(deb)],
                                   ["tar", "-xO", f"./boot/config-{spec.release}"]], timeout=300)
        if out:
            atomic_write(kept, out.decode(errors="replace"))
        return out.decode(errors="replace") or None
    if spec.kind == TREE:
        assert spec.tree is not None
        return (spec.tree / ".config").read_text(errors="replace")
    if spec.config is not None:
        return spec.config.read_text(errors="replace")
    assert spec.image is not None
    return extract_ikconfig(spec.image.read_bytes())


def _version(spec: KernelSpec) -> str:
    version = debian_version(spec)
    if version is None:
        raise ImageError(f"Debian has no kernel {spec.release} any more", hint="run 'apt-get update'")
    return version


def data_tar(deb: Path) -> list[list[str | os.PathLike[str]]]:
    """The commands that write a .deb's files as a tar to their standard output: ``dpkg-deb
    --fsys-tarfile``, or for an xz-compressed one (Debian's -dbg: 6.5 GB in 24 MiB blocks) ``ar p``
    into ``xz -T0``, which decompresses its blocks on every CPU (dpkg-deb 1.21 uses one)."""
    members = run(["ar", "t", deb], timeout=60, check=False).stdout.decode(errors="replace").split()
    if "data.tar.xz" in members:
        return [["ar", "p", deb, "data.tar.xz"], ["xz", "-T0", "-dc"]]
    return [["dpkg-deb", "--fsys-tarfile", deb]]


# -- content keys -----------------------------------------------------------------------------------

def content_key(spec: KernelSpec, opts: Options) -> str:
    """What the prepared kernel is made of, hashed (16 hex digits)."""
    h = hashlib.sha256(f"labctl-kernel {PREPARE_VERSION}\n{opts.key_text()}\n".encode())
    if spec.kind == DEBIAN:
        package, dbg = debian_packages(spec)
        version = debian_version(spec)
        h.update(f"debian {package}={version} {dbg}={version}".encode())  # -dbg at the image's own version
    elif spec.kind == TREE:
        assert spec.tree is not None
        kernel = _tree_kernel(spec.tree)
        assert kernel is not None
        h.update(f"tree {kernel.name} {sha256_file(kernel)} {sha256_file(spec.tree / '.config')}".encode())
        for ko in _tree_modules(spec.tree):
            h.update(f" {ko.relative_to(spec.tree)} {sha256_file(ko)}".encode())
    else:
        for path in (spec.image, spec.debug):
            h.update(f" {sha256_file(path) if path else '-'}".encode())
        if spec.debug is not None and spec.modules is not None:
            h.update(b" debug-modules")  # its modules with DWARF are its debug modules: not a kernel prepared before
        if spec.config is not None:
            h.update(f" config {sha256_file(spec.config)}".encode())
        if spec.modules is not None:
            for f in sorted(p for p in spec.modules.rglob("*") if p.is_file()):
                h.update(f" {f.relative_to(spec.modules)} {f.stat().st_size} {f.stat().st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _tree_modules(tree: Path) -> list[Path]:
    """The modules a tree built (``modules.order``), as files in the tree."""
    order = tree / "modules.order"
    if not order.is_file():
        return []
    out = []
    for line in order.read_text().split():
        rel = line.removeprefix("kernel/")
        ko = tree / (rel if rel.endswith(".ko") else rel.removesuffix(".o") + ".ko")
        if ko.is_file():
            out.append(ko)
    return out


# -- preparing ----------------------------------------------------------------------------------------

def _lock(key: str) -> contextlib.AbstractContextManager[None]:
    """One preparation of a kernel at a time (another labctl waits for it, then finds it done)."""
    return exclusive(kernels_root() / f".{key}.lock")


def prepare(spec: KernelSpec, opts: Options, reporter: Reporter | None = None) -> Kernel:
    """The prepared kernel of ``spec``: found in the cache, or made now.

    :raise ImageError: when a download, an extraction or the modules disk fails.
    """
    r = reporter or NullReporter()
    key = content_key(spec, opts)
    final = kernels_root() / key
    with _lock(key):
        if (final / MANIFEST).is_file():
            return Kernel.at(final)
        try:
            with build_into(final, 0o755) as work:
                _Preparer(spec, opts, work, r).run()
        except OSError as exc:
            raise ImageError(f"preparing kernel {spec.describe()} failed: {exc}") from exc
    return Kernel.at(final)


class _Preparer:
    """Makes one kernel directory (see :mod:`labctl.kernel.cached`) in ``work``."""

    def __init__(self, spec: KernelSpec, opts: Options, work: Path, reporter: Reporter) -> None:
        self.spec, self.opts, self.work, self.r = spec, opts, work, reporter
        self.stage = work / "stage"  # lib/modules/<release> is assembled here
        self.notes: list[str] = []
        self.manifest: dict[str, Any] = {"source": spec.to_dict()}

    def run(self) -> None:
        if self.spec.kind == DEBIAN:
            release = self._debian()
        elif self.spec.kind == TREE:
            release = self._tree()
        else:
            release = self._files()
        self.manifest["release"] = release
        mods = self.stage / "lib" / "modules" / release
        if mods.is_dir():
            with self.r.step("extra modules"):
                self._extra_modules(release, mods)
            with self.r.step("modules disk"):
                self._modules_disk(release, mods)
                self._kernel_cpio(mods)
        shutil.rmtree(self.stage, ignore_errors=True)
        self._write_manifest()

    # -- sources ----------------------------------------------------------------------------
    def _debian(self) -> str:
        spec = self.spec
        release = str(spec.release)
        package, dbg = debian_packages(spec)
        version = _version(spec)
        with ThreadPoolExecutor(max_workers=1) as pool:
            # the large -dbg downloads while the kernel is unpacked (the network's time, not the CPU's),
            # at the kernel's own version: the debug info of this very build, never the newest
            dbg_future = pool.submit(apt_download, dbg, version)
            with self.r.step(f"download {package} {version}"):
                deb = apt_download(package, version)
            with self.r.step("unpack the kernel"):
                unpacked = self.work / "deb"
                run(["dpkg-deb", "-x", deb, unpacked], timeout=600)
                self.manifest["boot"] = boot_image(unpacked / "boot" / f"vmlinuz-{release}", self.work / BOOT)
                shutil.copy(unpacked / "boot" / f"config-{release}", self.work / CONFIG)
                shutil.copy(unpacked / "boot" / f"System.map-{release}", self.work / SYSTEM_MAP)
                self._stage_modules(unpacked / "lib" / "modules" / release, release)
                shutil.rmtree(unpacked)
            self.manifest["debian"] = {"package": package, "version": version, "debug_package": dbg}
            with self.r.step(f"download {dbg} {version} (large)"):
                dbg_deb = dbg_future.result()
        self.manifest["debian"]["debug_version"] = version
        with self.r.step("extract vmlinux with debug info"):
            base = f"./usr/lib/debug/lib/modules/{release}"
            patterns = [f"./usr/lib/debug/boot/vmlinux-{release}", *(f"{base}/{d}/*" for d in self.opts.debug_modules)]
            out = self.work / "dbg"
            out.mkdir()
            run_pipeline([*data_tar(dbg_deb), ["tar", "-x", "-C", out, "--wildcards", *patterns]], timeout=1800)
            (out / patterns[0]).rename(self.work / VMLINUX_DEBUG)
            if (out / base).is_dir():
                (out / base).rename(self.work / DEBUG_MODULES)
            shutil.rmtree(out)
        return release

    def _tree(self) -> str:
        tree = self.spec.tree
        assert tree is not None
        release = (tree / "include" / "config" / "kernel.release").read_text().strip()
        kernel = _tree_kernel(tree)
        assert kernel is not None
        with self.r.step(f"kernel {release} from {tree}"):
            self.manifest["boot"] = boot_image(kernel, self.work / BOOT)
            if is_elf(kernel):  # the tree's vmlinux has whatever debug info the build gave it: one file serves both
                os.link(self.work / BOOT, self.work / VMLINUX_DEBUG)
            shutil.copy(tree / ".config", self.work / CONFIG)
            if (tree / "System.map").is_file():
                shutil.copy(tree / "System.map", self.work / SYSTEM_MAP)
            mods = self.stage / "lib" / "modules" / release
            for ko in _tree_modules(tree):
                rel = ko.relative_to(tree)
                for dest in (mods / "kernel" / rel, self.work / DEBUG_MODULES / rel):
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(ko, dest)
            if mods.is_dir():
                for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
                    if (tree / name).is_file():
                        shutil.copyfile(tree / name, mods / name)
        self.manifest["tree"] = str(tree)
        return release

    def _files(self) -> str:
        spec = self.spec
        assert spec.image is not None
        with self.r.step(f"kernel from {spec.image}"):
            self.manifest["boot"] = boot_image(spec.image, self.work / BOOT)
            config = config_text(spec)
            if config:
                (self.work / CONFIG).write_text(config)
            if spec.debug is not None:
                shutil.copyfile(spec.debug, self.work / VMLINUX_DEBUG)
            release = self._files_release()
            if spec.modules is not None:
                src = spec.modules / "lib" / "modules" / release
                if not src.is_dir():
                    if not _is_release_dir(spec.modules):  # copy a kernel's modules, never any directory
                        raise ImageError(f"the kernel's modules {spec.modules} have no lib/modules/{release}/ "
                                         "and are no release directory (no modules.dep or modules.order)")
                    src = spec.modules
                self._stage_modules(src, release)
                if spec.debug is not None:
                    self._debug_modules(release)
        return release

    def _debug_modules(self, release: str) -> None:
        """A loose kernel given with its debug file: its modules that carry DWARF (a tree's, as
        ``make modules_install`` leaves them; a packed tree kernel's) are its debug modules too
        (the staged copies, kept when the modules disk is made), for gdb, drgn and oops decoding."""
        staged = self.stage / "lib" / "modules" / release
        for ko in sorted(staged.rglob("*.ko")):
            if ko.is_file() and not ko.is_symlink() and has_dwarf(ko):
                dest = self.work / DEBUG_MODULES / ko.relative_to(staged)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.link(ko, dest)

    def _files_release(self) -> str:
        """A loose kernel's release: its modules directory's name, else its banner."""
        spec = self.spec
        if spec.modules is not None:
            under = spec.modules / "lib" / "modules"
            names = [d.name for d in under.iterdir() if d.is_dir()] if under.is_dir() else []
            if len(names) == 1:
                return names[0]
            if _is_release_dir(spec.modules):
                return spec.modules.name
        for path in (self.work / VMLINUX_DEBUG, self.work / BOOT):
            if path.is_file() and is_elf(path):
                text = banner(path)
                if text:
                    return text.split()[2]
        raise ImageError(f"cannot tell the release of kernel {spec.image}",
                         hint="give its modules (kernel: {image: ..., modules: DIR}) or a vmlinux (debug: ...)")

    def _stage_modules(self, src: Path, release: str) -> None:
        """Copy a kernel's ``lib/modules/<release>`` into the stage, minus the recipe's excluded directories."""
        dst = self.stage / "lib" / "modules" / release
        excluded = {str(src / d) for d in self.opts.exclude_modules}

        def ignore(dirname: str, names: list[str]) -> list[str]:
            return [n for n in names if os.path.join(dirname, n) in excluded or n in ("build", "source")]

        shutil.copytree(src, dst, ignore=ignore, symlinks=True)

    # -- what every kernel gets -------------------------------------------------------------
    def _extra_modules(self, release: str, mods: Path) -> None:
        """guest/modules/<name> built against the kernel (its tree, or Debian's headers when installed)."""
        build = self.spec.tree if self.spec.kind == TREE else Path(f"/usr/src/linux-headers-{release}")
        if not self.opts.extra_modules:
            return
        if build is None or not (build / "Makefile").is_file():
            self.notes.append(f"out-of-tree modules {', '.join(self.opts.extra_modules)} not built: "
                              f"no headers for {release} ({build})")
            return
        extra = mods / "extra"
        extra.mkdir(parents=True, exist_ok=True)
        for name in self.opts.extra_modules:
            src = modbuild.build_dir(build, name)
            try:
                # The copies are made under the lock too: another labctl preparing another kernel
                # of this tree rebuilds in the same directory (kbuild replaces the .ko).
                with exclusive(src.with_name(src.name + ".lock")):
                    self._build_extra(src, build, name)
                    self._copy_extra(src, extra)
            except LabctlError as exc:
                self.notes.append(f"out-of-tree module {name} did not build against {release}: {exc.message}")

    def _build_extra(self, src: Path, build: Path, name: str) -> None:
        if not src.is_dir():  # a new tree, or the module's source changed: a fresh build directory
            with build_into(src) as work:
                shutil.copytree(resource_dir("guest") / "modules" / name, work, dirs_exist_ok=True)
        # Not built when nothing the last build read changed; else incremental: kbuild
        # recompiles only what changed since the last kernel of this tree. Source paths
        # in the debug info read guest/modules/NAME/FILE.c, not the build dir.
        if not modbuild.unchanged(src, build):
            (src / modbuild.RECORD).unlink(missing_ok=True)
            run(["make", "-C", build, f"M={src}",
                 f"KCFLAGS=-fdebug-prefix-map={src}=guest/modules/{name}", "modules"], timeout=600)
            modbuild.record(src, build)

    def _copy_extra(self, src: Path, extra: Path) -> None:
        for ko in src.glob("*.ko"):
            shutil.copy(ko, extra / ko.name)
            dbg = self.work / DEBUG_MODULES / "extra"
            dbg.mkdir(parents=True, exist_ok=True)
            shutil.copy(ko, dbg / ko.name)  # built with -g: the oops decoder reads it
        for c in src.glob("*.c"):  # the source, for gdb's list and readers of decoded oopses
            if c.name.endswith(".mod.c"):  # kbuild's generated module info, not the module's source
                continue
            shutil.copy(c, extra / c.name)

    def _modules_disk(self, release: str, mods: Path) -> None:
        run(["depmod", "-b", self.stage, release], timeout=300)
        used_kib = int(run(["du", "-sk", "--apparent-size", self.stage], timeout=300).stdout.split()[0])
        size_mib = int(used_kib / 1024 * 1.3) + 16
        run(["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "labmods", "-E", "root_owner=0:0",
             "-d", self.stage / "lib" / "modules", self.work / MODULES_IMG, f"{size_mib}M"], timeout=600)

    def _kernel_cpio(self, mods: Path) -> None:
        """The kernel's share of the initramfs: its disk drivers in load order and its NIC drivers by alias."""
        dep = (mods / "modules.dep").read_text()
        builtin = builtin_names((mods / "modules.builtin").read_text()) if (mods / "modules.builtin").is_file() \
            else set()
        order = module_load_order(dep, list(self.opts.initramfs_modules), builtin)
        alias = (mods / "modules.alias").read_text() if (mods / "modules.alias").is_file() else ""
        nic_rules, nic_mods = nic_driver_rules(dep, alias)
        entries = [cpio_directory("modules")]
        for rel in dict.fromkeys([*order, *nic_mods]):
            entries.append(cpio_file(f"modules/{Path(rel).name}", (mods / rel).read_bytes()))
        entries.append(cpio_file("modules/order", "".join(f"{Path(r).name}\n" for r in order).encode()))
        entries.append(cpio_file("modules/nics", nic_rules.encode()))
        write_cpio(entries, self.work / KERNEL_CPIO)

    def _write_manifest(self) -> None:
        debug = self.work / VMLINUX_DEBUG
        ident = self.work / BOOT if is_elf(self.work / BOOT) else debug if debug.is_file() else None
        files = {name: {"size": (self.work / name).stat().st_size, "sha256": sha256_file(self.work / name)}
                 for name in (BOOT, VMLINUX_DEBUG, CONFIG, SYSTEM_MAP, MODULES_IMG) if (self.work / name).is_file()}
        self.manifest.update({
            "prepared_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "labctl_version": __version__,
            "banner": banner(ident) if ident else None,
            "build_id": build_id(ident) if ident else None,
            "files": files,
            "notes": self.notes,
        })
        atomic_write(self.work / MANIFEST, json.dumps(self.manifest, indent=2) + "\n")


def initrd(kernel: Kernel, image_cpio: Path, image_key: str) -> Path:
    """The initramfs of ``kernel`` for one root file system: the image's share (busybox, its
    init) and the kernel's (its disk and NIC drivers), two cpio archives one after the other,
    which the kernel unpacks in turn. Made on first use, then kept beside the kernel."""
    out = kernel.initrd(image_key)
    if not out.is_file():
        parts = [image_cpio.read_bytes()]
        if (kernel.dir / KERNEL_CPIO).is_file():
            parts.append((kernel.dir / KERNEL_CPIO).read_bytes())
        atomic_write(out, b"".join(parts))
    return out


def add_source(kernel: Kernel, reporter: Reporter | None = None) -> Path:
    """Unpack the source of a Debian kernel into ``<kernel>/source`` (for gdb's ``list``).

    Uses Debian's ``linux-source-X.Y`` at the kernel's version; idempotent.
    A tree's kernel needs none: its debug info names the tree's own files.

    :raise ImageError: when the kernel is not a Debian one or the package cannot be had.
    """
    r = reporter or NullReporter()
    dest = kernel.dir / "source"
    if dest.is_dir() and any(dest.iterdir()):
        r.note(f"kernel source already in {dest}")
        return dest
    debian = kernel.manifest.get("debian") or {}
    if not debian:
        raise ImageError(f"kernel {kernel.name} is not a Debian kernel: its source is where it was built")
    major_minor = ".".join(kernel.release.split(".")[:2])
    package = f"linux-source-{major_minor}"
    version = str(debian.get("version", ""))
    if not version:
        raise ImageError(f"kernel {kernel.name} does not record its Debian version: prepare it again "
                         "('labctl kernel prune', then use it)")
    with r.step(f"download {package} {version}"):
        deb = apt_download(package, version)  # the kernel's own source: line numbers must match its DWARF
    tmp = kernel.dir / f".source-{os.getpid()}"
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
    manifest = dict(kernel.manifest)
    manifest["kernel_source"] = {"package": package, "file": deb.name, "dir": "source"}
    atomic_write(kernel.dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return dest
