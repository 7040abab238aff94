#!/usr/bin/env bash
# A kernel the test suite builds from source: Debian's linux-source-SERIES (SERIES=6.1, the
# default, or SERIES=6.12), allnoconfig + kvm_guest.config + the fragment `labctl kernel config`
# prints for tests/labs/valid/tree-kernel.yaml + what its tests use, built once and cached in the
# suite's cache (tests/isolation.py: ~/.cache/labctl-test/test-kernel/<key>/ for 6.1,
# test-kernel-6.12/<key>/ for 6.12; the key hashes the source package's version, the fragment and
# the build's recipe). Prints the tree's path.
#
# A fresh machine pays each build once (see .build-seconds in the tree for how long it took);
# later runs find the tree.
# Run as root (installs the build's Debian packages). PYTHON=the python that
# has labctl (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PYTHON="${PYTHON:-.venv/bin/python}"
SERIES="${SERIES:-6.1}"
# The 6.12 tree is of the 6.12 Debian kernel the suite boots (tests/integration/test_kernel_612.py's
# K612): same code, same line numbers.
K612_UPSTREAM=6.12.117
case "$SERIES" in
    6.1) suffix= ;;
    6.12) suffix=-6.12 ;;
    *) echo "test-kernel.sh: SERIES is 6.1 or 6.12, not '$SERIES'" >&2; exit 2 ;;
esac
LAB=tests/labs/valid/tree-kernel.yaml
CACHE="${LABCTL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/labctl}/test-kernel$suffix"
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

PACKAGES=(build-essential flex bison bc libelf-dev libssl-dev xz-utils)
missing=()
for p in "${PACKAGES[@]}"; do
    [[ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" == *"ok installed"* ]] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

fragment=$("$PYTHON" -m labctl kernel config "$LAB")
# The source: linux-source-SERIES at the version of the Debian kernel the tests compare the tree's
# kernel with (6.1: the image's own kernel; 6.12: K612_UPSTREAM) while the archive carries it; else the
# newest it has (the archive moved on: the build must work from whatever it serves that day).
# Downloaded by exact version into labctl's cache, never installed over the host's own.
mapfile -t have < <("$PYTHON" -c 'import sys; from labctl.image import versions; print(*versions(sys.argv[1]), sep="\n")' \
    "linux-source-$SERIES")
[ ${#have[@]} -gt 0 ] || { echo "test-kernel.sh: the archive has no linux-source-$SERIES: run apt-get update" >&2; exit 3; }
version=${have[0]}
if [ "$SERIES" = 6.1 ]; then
    read -r _krel kver < <("$PYTHON" scripts/default-kernel.py)
    for v in "${have[@]}"; do [ "$v" = "$kver" ] && version=$v; done
else
    kver="$K612_UPSTREAM-*"
    for v in "${have[@]}"; do [[ "$v" == $K612_UPSTREAM-* ]] && version=$v; done
fi
[[ "$version" == $kver ]] || say "linux-source-$SERIES $kver (the tests' kernel) is gone from the archive: building $version"
# The key: what decides the tree (the source, the configuration, how it is built), not this
# script's other lines, so that a comment or the locking never costs a build.
BUILD="allnoconfig+kvm_guest+labctl+test-kernel.config; make vmlinux modules"
key=$( { echo "$version"; echo "$fragment"; cat scripts/test-kernel.config; echo "$BUILD"; } | sha256sum | cut -c1-16)
tree="$CACHE/$key/linux"
# One build at a time (pytest-xdist's workers, two runs): the others wait for it, then find it.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$tree/vmlinux" ] && [ -f "$tree/.built" ]; then
    echo "$tree"
    exit 0
fi

say "building the test kernel (linux-source-$SERIES $version, a few minutes on 2 cores) in $tree"
rm -rf "$CACHE/$key.tmp"
mkdir -p "$CACHE/$key.tmp"
deb=$("$PYTHON" -c 'import sys; from labctl.image import apt_download; print(apt_download(*sys.argv[1:]))' \
    "linux-source-$SERIES" "$version")
dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/src/linux-source-$SERIES.tar.xz" | tar -xJ -C "$CACHE/$key.tmp"
mv "$CACHE/$key.tmp/linux-source-$SERIES" "$CACHE/$key.tmp/linux"
cd "$CACHE/$key.tmp/linux"
printf '%s\n' "$fragment" > labctl.config
# Only what the suite boots on it, on top of allnoconfig: what `labctl kernel config` asks for
# the lab (labctl.config: the NIC drivers, the console, ACPI's power button, fw_cfg, the guest
# agent's virtio console, perf and ftrace, full DWARF for gdb, oops decoding and drgn) and what
# the tests of a tree's kernel use besides: kprobe events, crash-dump support (vmcoreinfo, for
# drgn), /proc/kcore, 9p shares and netem. The kernel's net selftests run on Debian's kernel
# (only their sources come from this tree). About 1,400 objects against defconfig's 2,200:
# 11 CPU-minutes, where the defconfig build with reduced DWARF took 18.
cp "$ROOT/scripts/test-kernel.config" test.config
make -s allnoconfig
scripts/kconfig/merge_config.sh -m .config kernel/configs/kvm_guest.config labctl.config test.config >/dev/null
make -s olddefconfig
# Plain gcc, no ccache: kbuild records the compiler command, and labctl bisect builds copies of
# this tree with plain make (another CC would recompile every object at its first step).
start=$(date +%s)
nice make -s -j"$(nproc)" vmlinux modules >/dev/null
echo "$(( $(date +%s) - start ))" > .build-seconds
touch .built
cd - >/dev/null
rm -rf "$CACHE/$key"
mv "$CACHE/$key.tmp" "$CACHE/$key"
# Older test kernels (another key) go: each tree is about 2 GB.
find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
say "test kernel built in $(cat "$tree/.build-seconds") s"
echo "$tree"
