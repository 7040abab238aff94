#!/usr/bin/env bash
# libvirt for labctl's libvirt backend on a Debian 12 host, as root.
# Idempotent: installs what is missing, lets QEMU run as libvirt's
# unprivileged user (undoing an older labctl's "QEMU as root"), gives group
# kvm access to /dev/kvm, starts libvirtd if it is not running (there may be
# no systemd), checks qemu:///system answers, and installs the libvirt
# Python binding into ${PYTHON:-python3}.
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
    [[ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" == *"ok installed"* ]] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] \
        || apt-get update -qq
    # No init system may be running: keep the postinst scripts from starting services.
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Start a daemon detached from whatever runs this script: a session of its own
# (setsid --fork), stdin/stdout/stderr on /dev/null, and none of the
# descriptors this script inherited left open in it (a CI runner's pipes and
# locks, a test suite's sockets), so that it never holds them after we exit.
detached() {
    (
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
        done
        exec setsid --fork "$@" </dev/null >/dev/null 2>&1
    )
}

restart_libvirtd() {
    local pid
    pid=$(cat /run/libvirtd.pid 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "restarting libvirtd for the new configuration"
        kill "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
}

# QEMU runs as libvirt's own unprivileged user (libvirt-qemu on Debian), not
# root: labctl gives each guest volumes in libvirt's "labctl" pool and 0700
# directories in /var/lib/libvirt/labctl-run made for that user, so QEMU
# needs nothing of root's. An earlier version of this script made QEMU root
# (the guests' files were in root's 0700 run directories); take that out.
CONF=/etc/libvirt/qemu.conf
MARK="# labctl: QEMU as root"
restart=no
if grep -qF "$MARK" "$CONF"; then
    say "configuring $CONF: QEMU no longer runs as root (removing labctl's old setting)"
    # Exactly the block an older version appended: the blank line before the
    # marker, the marker, and its user/group = "+0" lines; nothing else.
    awk -v mark="$MARK" '
        skip > 0 && ($0 == "user = \"+0\"" || $0 == "group = \"+0\"") { skip--; next }
        { skip = 0 }
        index($0, mark) == 1 { skip = 2; held = 0; next }
        held { print ""; held = 0 }
        $0 == "" { held = 1; next }
        { print }
        END { if (held) print "" }
    ' "$CONF" > "$CONF.labctl-new"
    cat "$CONF.labctl-new" > "$CONF"  # keeps the file's owner and mode
    rm -f "$CONF.labctl-new"
    restart=yes
fi
if grep -Eq '^[[:space:]]*user[[:space:]]*=[[:space:]]*"(\+0|root)"' "$CONF"; then
    echo "note: $CONF still sets user = root (not labctl's setting): QEMU runs as root;" \
         "'labctl doctor' says why that is weaker" >&2
fi

# /dev/kvm: group kvm read-write, as udev's default rule makes it on a normal
# Debian host (there is no udev here, so it is crw------- root). libvirt-qemu
# is in group kvm, so QEMU as that user can use KVM, and root and libvirt-qemu
# see the same access. That matters beyond speed: libvirtd caches each QEMU
# binary's probed capabilities and checks on every domain start that "KVM
# usable" (/dev/kvm accessible to QEMU's user) still matches the probe; when
# it flips, libvirtd re-probes every QEMU binary (~1 min, or a hang). Equal
# access for every user libvirt may probe as keeps that verdict stable (the
# change itself makes libvirtd re-probe once, at its next use). The device
# node is made again at boot, so this runs every time.
if [ -c /dev/kvm ] && getent group kvm >/dev/null; then
    if [ "$(stat -c '%G %a' /dev/kvm)" != "kvm 660" ]; then
        say "giving group kvm read-write access to /dev/kvm (as udev does)"
        chgrp kvm /dev/kvm
        chmod 0660 /dev/kvm
    fi
fi
if [ "$restart" = yes ]; then
    restart_libvirtd
fi

if ! virsh -c "$URI" version >/dev/null 2>&1; then
    if ! pgrep -x libvirtd >/dev/null; then
        say "starting libvirtd"
        # virtlogd is needed for QEMU's log files when it is not socket activated.
        pgrep -x virtlogd >/dev/null || detached virtlogd -d
        detached libvirtd -d
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
label=$(virsh -c "$URI" capabilities | sed -n "s|.*<baselabel type='qemu'>\(.*\)</baselabel>.*|\1|p")
label=${label%%$'\n'*}  # the first; no `| head` (under pipefail its early exit can fail the pipeline)
uid=${label%%:*}; uid=${uid#+}
say "QEMU runs as: $(getent passwd "$uid" | cut -d: -f1 || true) ($label)"
