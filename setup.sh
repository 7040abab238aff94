#!/usr/bin/env bash
# labctl setup for a Debian 12 host, as root. Idempotent: run it again at will.
#   1. Debian packages (QEMU, mmdebstrap, ...)
#   2. labctl in a virtualenv at .venv, linked as /usr/local/bin/labctl
#   3. the default guest image (cached in ~/.cache/labctl; rebuilt only
#      when its recipe changes)
set -euo pipefail
cd "$(dirname "$0")"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "setup.sh installs Debian packages and builds the guest image: run it as root" >&2
    exit 1
fi

PACKAGES=(
    qemu-system-x86 qemu-utils          # the guests
    mmdebstrap e2fsprogs dpkg xz-utils   # the image build
    lz4 kmod                             # kernels: cloud kernels are lz4; depmod
    zstd                                 # labctl pack: packed files are zstd-compressed tars
    python3 python3-venv                 # labctl itself
    openssh-client                       # labctl ssh
    gdb binutils                         # labctl gdb, oops decoding
    crash                                # tests: Debian's crash opens labctl dump's vmcores
    make                                 # out-of-tree lab modules (guest/modules/; the kernel's headers: below)
    linux-perf                           # the host side of a step: a profile of each guest's QEMU
    chromium                             # tests: report.html in a headless browser
    tshark tcpdump                       # tests: reading the captures labctl writes
    gcc libc6-dev                        # the image: guest/builtins.c; tests: a program built on the host runs in a guest
    clang llvm libbpf-dev                # a lab's XDP and tc programs built from C in its directory (-target bpf)
    bash-builtins                        # the image: guest/builtins.c, the guest agent's clock and rename
    iproute2                             # ip netns, bridges and taps (multiqueue links, as root)
    git                                  # labctl bisect: worktrees of the user's kernel repository; up git+https://... (git daemon: the tests)
    bash-completion                      # labctl's completion in bash (labctl completion bash)
    ca-certificates
)
# labctl serve ships xterm.js, fetched from npm here (never by the browser); a Node.js of another
# origin (nodesource) brings its own npm, else Debian's.
command -v npm >/dev/null || PACKAGES+=(npm)
# CI: what scripts/test-kernel.sh and scripts/crash-build.sh build with, installed here, as they build in the
# background below
[ -z "${CI:-}" ] || PACKAGES+=(build-essential flex bison bc libelf-dev libssl-dev texinfo zlib1g-dev libncurses-dev)
missing=()
for p in "${PACKAGES[@]%%#*}"; do
    [[ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" == *"ok installed"* ]] || missing+=("$p")
done
# apt-get download needs fresh package lists for the pinned kernel packages.
say "apt-get update"
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    "$PY" -m venv .venv
fi
say "installing labctl into .venv"
# docs: MkDocs Material builds the documentation site (docs/, mkdocs.yml; .ci/run builds it).
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,docs]"
ln -sf "$PWD/.venv/bin/labctl" /usr/local/bin/labctl
# labctl's own bytecode, once: a shell with PYTHONDONTWRITEBYTECODE set would otherwise compile
# labctl anew at every command (0.2 s of CPU each; pip compiled the dependencies already).
.venv/bin/python -m compileall -q -j 0 labctl >/dev/null

# Shell completion: commands, options, the labs that are up and their guests (labctl completion).
.venv/bin/labctl completion bash > /usr/share/bash-completion/completions/labctl
mkdir -p /usr/local/share/zsh/site-functions
.venv/bin/labctl completion zsh > /usr/local/share/zsh/site-functions/_labctl
# The man page, generated from the parser (scripts/gen-docs.py; a unit test keeps it current).
install -D -m 0644 man/labctl.1 /usr/local/share/man/man1/labctl.1

# labctl serve's terminal widget: xterm.js and its fit addon, pinned, unpacked into the package.
XTERM=5.5.0 XTERM_FIT=0.10.0
VENDOR=labctl/web/static/vendor
if [ "$(cat "$VENDOR/VERSION" 2>/dev/null)" != "xterm $XTERM fit $XTERM_FIT" ]; then
    say "xterm.js $XTERM for labctl serve"
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "@xterm/xterm@$XTERM" "@xterm/addon-fit@$XTERM_FIT" >/dev/null)
    tar -xzf "$tmp/xterm-xterm-$XTERM.tgz" -C "$tmp" package/lib/xterm.js package/css/xterm.css package/LICENSE
    cp "$tmp/package/lib/xterm.js" "$tmp/package/css/xterm.css" "$VENDOR/"
    cp "$tmp/package/LICENSE" "$VENDOR/LICENSE.xterm"
    rm -rf "$tmp/package"
    tar -xzf "$tmp/xterm-addon-fit-$XTERM_FIT.tgz" -C "$tmp" package/lib/addon-fit.js
    cp "$tmp/package/lib/addon-fit.js" "$VENDOR/"
    rm -rf "$tmp"
    echo "xterm $XTERM fit $XTERM_FIT" > "$VENDOR/VERSION"
fi

# The default kernel's headers build guest/modules/ against it: at the kernel's exact version (the
# archive moves; the image's pinned ABI while the archive carries it, else the newest of its line:
# scripts/default-kernel.py asks labctl, which decides the same when it builds the image).
read -r KREL KVER < <(.venv/bin/python scripts/default-kernel.py)
if [ "$KVER" = "-" ]; then
    echo "setup.sh: Debian's archive has no kernel $KREL any more and none is cached: run apt-get update" >&2
    exit 3
fi
if [ "$(dpkg-query -W -f '${Version}' "linux-headers-$KREL" 2>/dev/null)" != "$KVER" ]; then
    # Read the table whole before matching: `apt-cache policy | grep -q` under pipefail fails when grep
    # exits at its first match and apt-cache dies of SIGPIPE (17 times in 20 on a fresh machine).
    policy=$(apt-cache policy -- "linux-headers-$KREL")
    if grep -qF " $KVER " <<<"$policy"; then
        say "installing linux-headers-$KREL $KVER"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "linux-headers-$KREL=$KVER" >/dev/null
    else
        echo "setup.sh: the archive no longer has linux-headers-$KREL $KVER: guest/modules/ are built only" \
             "for kernels prepared before" >&2
    fi
fi

# CI: the test suite's kernel trees (scripts/test-kernel.sh, 6.1 then 6.12: ~11 and ~14 CPU-minutes on a new
# machine) and a crash that reads 6.12 (scripts/crash-build.sh, ~5) build in the background while the image,
# libvirt and the lint are done; the suite's tree_kernel, tree_kernel_612 and crash_tool fixtures wait for
# them (the scripts' locks), and build one themselves should this build have failed.
if [ -n "${CI:-}" ]; then
    STORE="${LABCTL_TEST_CACHE:-$HOME/.cache/labctl-test}"
    mkdir -p "$STORE/test-kernel"
    say "the suite's test kernel builds in the background (log: $STORE/test-kernel/early.log)"
    LABCTL_CACHE_DIR="$STORE" PYTHON=.venv/bin/python setsid bash -c \
        'bash scripts/test-kernel.sh; SERIES=6.12 bash scripts/test-kernel.sh; bash scripts/crash-build.sh' \
        > "$STORE/test-kernel/early.log" 2>&1 < /dev/null &
fi

say "guest image"
.venv/bin/labctl image build

# The libvirt backend (libvirtd and libvirt-python), only when asked; CI asks.
if [ -n "${LABCTL_LIBVIRT:-}" ] || [ -n "${CI:-}" ]; then
    say "libvirt"
    PYTHON=.venv/bin/python bash scripts/libvirt-setup.sh
fi
