#!/usr/bin/env bash
# libvirt for labctl's libvirt backend on a Debian 12 host, as root.
# Idempotent: installs what is missing, starts libvirtd if it is not
# running (there may be no systemd), checks qemu:///system answers, and
# installs the libvirt Python binding into ${PYTHON:-python3}.
set -euo pipefail

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
PY="${PYTHON:-python3}"
URI="${LABCTL_LIBVIRT_URI:-qemu:///system}"

if [ "$(id -u)" != 0 ]; then
    echo "libvirt-setup.sh installs Debian packages and starts libvirtd: run it as root" >&2
    exit 1
fi

# openssh-server: the multi-host test runs its own sshd on 127.0.0.1 as a
# second "host" (qemu+ssh://); no ssh service is started or enabled here.
PACKAGES=(libvirt-daemon-system libvirt-clients libvirt-dev pkg-config gcc openssh-server)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] \
        || apt-get update -qq
    # No init system may be running: keep the postinst scripts from starting services.
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# QEMU runs as root: the guests' files live in root's 0700 run directories,
# and libvirt's capability probes must see the same /dev/kvm access every
# time (root-only here): probing as libvirt-qemu flips "KVM usable" and makes
# libvirtd re-probe every QEMU binary on each domain start (~1 min, or a hang).
CONF=/etc/libvirt/qemu.conf
MARK="# labctl: QEMU as root"
if ! grep -qF "$MARK" "$CONF"; then
    say "configuring $CONF: QEMU runs as root"
    printf '\n%s (scripts/libvirt-setup.sh)\nuser = "+0"\ngroup = "+0"\n' "$MARK" >> "$CONF"
    pid=$(cat /run/libvirtd.pid 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "restarting libvirtd for the new configuration"
        kill "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
fi

if ! virsh -c "$URI" version >/dev/null 2>&1; then
    if ! pgrep -x libvirtd >/dev/null; then
        say "starting libvirtd"
        # virtlogd is needed for QEMU's log files when it is not socket activated.
        pgrep -x virtlogd >/dev/null || virtlogd -d
        libvirtd -d
    fi
    for _ in $(seq 1 50); do
        virsh -c "$URI" version >/dev/null 2>&1 && break
        sleep 0.2
    done
fi
if ! virsh -c "$URI" version >/dev/null 2>&1; then
    echo "libvirtd does not answer on $URI:" >&2
    virsh -c "$URI" version >&2 || true
    exit 1
fi

if ! "$PY" -c 'import libvirt' 2>/dev/null; then
    if [ "$(command -v "$PY")" = /usr/bin/python3 ]; then
        say "installing python3-libvirt"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-libvirt >/dev/null
    else
        say "installing libvirt-python into $PY (builds against libvirt-dev)"
        "$PY" -m pip install -q --disable-pip-version-check libvirt-python
    fi
fi
"$PY" -c 'import libvirt, libvirt_qemu' || { echo "the libvirt Python binding does not import in $PY" >&2; exit 1; }
say "libvirt ready: $(virsh -c "$URI" version | grep -i 'running hypervisor' || true)"
