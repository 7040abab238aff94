#!/usr/bin/env bash
# The kernel the test suite builds from source: Debian's linux-source-6.1,
# x86_64_defconfig + kvm_guest.config + the fragment `labctl kernel config`
# prints for tests/labs/valid/tree-kernel.yaml, built once and cached in
# ~/.cache/labctl/test-kernel/<key>/ (the key hashes the source package's
# version, the fragment and this script). Prints the tree's path.
#
# A fresh machine pays the build once (see .build-seconds in the tree for
# how long it took); later runs find the tree.
# Run as root (installs the build's Debian packages). PYTHON=the python that
# has labctl (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
LAB=tests/labs/valid/tree-kernel.yaml
CACHE="${LABCTL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/labctl}/test-kernel"
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

PACKAGES=(linux-source-6.1 build-essential flex bison bc libelf-dev libssl-dev xz-utils)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

fragment=$("$PYTHON" -m labctl kernel config "$LAB")
version=$(dpkg-query -W -f '${Version}' linux-source-6.1)
key=$( { echo "$version"; echo "$fragment"; cat "$0"; } | sha256sum | cut -c1-16)
tree="$CACHE/$key/linux"
if [ -f "$tree/vmlinux" ] && [ -f "$tree/.built" ]; then
    echo "$tree"
    exit 0
fi

say "building the test kernel (linux-source $version, about 10 minutes on 2 cores) in $tree"
rm -rf "$CACHE/$key.tmp"
mkdir -p "$CACHE/$key.tmp"
tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$CACHE/$key.tmp"
mv "$CACHE/$key.tmp"/linux-source-6.1 "$CACHE/$key.tmp/linux"
cd "$CACHE/$key.tmp/linux"
printf '%s\n' "$fragment" > labctl.config
# Reduced DWARF keeps file:line and function names (gdb bt, oops decoding) and
# builds faster; skb_latency's struct offsets would need the full types.
printf 'CONFIG_DEBUG_INFO_REDUCED=y\nCONFIG_LOCALVERSION="-labctl-test"\n' > test.config
# Smaller than defconfig: what a QEMU guest never has (graphics, sound, USB,
# wireless, disk controllers other than virtio, laptops' power management,
# most NIC vendors) is left out, which cuts the build by about a third.
for opt in DRM AGP FB SOUND USB_SUPPORT HID WLAN WIRELESS CFG80211 RFKILL PCCARD ATA MD SCSI \
           MACINTOSH_DRIVERS INPUT_MOUSE INPUT_JOYSTICK INPUT_TABLET INPUT_TOUCHSCREEN \
           HIBERNATION SUSPEND SECURITY_SELINUX NETLABEL AUDIT NFS_FS ISO9660_FS I2C HWMON WATCHDOG \
           ACPI_VIDEO BACKLIGHT_CLASS_DEVICE CPU_FREQ X86_INTEL_PSTATE MICROCODE EFI VIRTUALIZATION \
           NET_VENDOR_3COM NET_VENDOR_AMD NET_VENDOR_BROADCOM NET_VENDOR_DEC NET_VENDOR_DLINK \
           NET_VENDOR_MARVELL NET_VENDOR_MELLANOX NET_VENDOR_NVIDIA NET_VENDOR_ATHEROS NET_VENDOR_CHELSIO; do
    echo "# CONFIG_$opt is not set"
done > trim.config
make -s x86_64_defconfig
scripts/kconfig/merge_config.sh -m .config kernel/configs/kvm_guest.config trim.config labctl.config test.config >/dev/null
make -s olddefconfig
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
