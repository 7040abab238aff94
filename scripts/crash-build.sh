#!/usr/bin/env bash
# A crash(8) that reads the vmcores of Linux 6.4 and later (Debian 12's 6.12 line among them), and
# prints its path. Debian 12's own crash (8.0.2, the archive's only version) predates 6.4's module
# layout: on a 6.12 vmcore it stops at "invalid structure member offset: module_core_size". When
# the host's crash is 8.0.3 or newer, that one is printed; otherwise crash is built once from the
# upstream tarball of Debian 13's (trixie's) crash source package, fetched from Debian's archive
# through apt (the signed Sources index gives its SHA-256, apt-helper checks it), into
# labctl's cache: CACHE/tools/crash-VERSION/crash (CACHE: $LABCTL_CACHE_DIR, else ~/.cache/labctl).
# Nothing is installed over the host's crash. A build takes about 5 CPU-minutes (crash embeds gdb
# 10.2); later calls find it.
#
# Run as root (installs the build's Debian packages; apt reads trixie's source index into a list
# directory of its own, never the host's). Exit status: 0 and the path on stdout; 3 when the
# archive has no crash source or the build fails (the reason on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${LABCTL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/labctl}/tools"
MIRROR="${LABCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=trixie
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { echo "crash-build.sh: $*" >&2; exit 3; }

# 8.0.3 is the first crash that knows 6.4's module memory layout.
if host=$(command -v crash) && v=$(crash --version 2>/dev/null | sed -n 's/^crash \([0-9][0-9.]*\).*/\1/p' | head -1) \
        && [ -n "$v" ] && [ "$(printf '%s\n' 8.0.3 "$v" | sort -V | head -1)" = 8.0.3 ]; then
    echo "$host"
    exit 0
fi

PACKAGES=(build-essential bison flex texinfo zlib1g-dev libncurses-dev)
missing=()
for p in "${PACKAGES[@]}"; do
    [[ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" == *"ok installed"* ]] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.crash.lock"
flock 9

# trixie's source index, in apt directories of this script's own (the host's sources are not read).
APT="$CACHE/.apt-$SUITE"
mkdir -p "$APT/parts" "$APT/lists/partial"
printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$MIRROR" "$SUITE" > "$APT/parts/$SUITE.sources"
opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$APT/parts" -o "Dir::State::Lists=$APT/lists"
      -o "Dir::Cache=$APT/cache" -o "Debug::NoLocking=1")
apt-get "${opts[@]}" update -qq 2>/dev/null || say "apt-get update of $SUITE's sources failed: using the index it has"
index=$(ls "$APT/lists/"*"_dists_${SUITE}_main_source_Sources"* 2>/dev/null | head -1) \
    || die "no source index of $SUITE (is $MIRROR reachable?)"
[ -n "$index" ] || die "no source index of $SUITE (is $MIRROR reachable?)"
stanza=$(/usr/lib/apt/apt-helper cat-file "$index" | awk '/^Package: crash$/,/^$/')
version=$(sed -n 's/^Version: //p' <<<"$stanza" | head -1)
dir=$(sed -n 's/^Directory: //p' <<<"$stanza" | head -1)
read -r sha _size orig < <(sed -n '/^Checksums-Sha256:/,/^[^ ]/p' <<<"$stanza" | grep -E ' crash_[^ ]+\.orig\.tar\.(gz|xz)$')
[ -n "$version" ] && [ -n "$dir" ] && [ -n "${orig:-}" ] || die "$SUITE has no crash source package"
upstream=${version%-*}
[[ "$upstream" =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "unexpected crash version '$version' in $SUITE's index"
[[ "$orig" =~ ^crash_[0-9.]+\.orig\.tar\.(gz|xz)$ ]] && [[ "$dir" =~ ^pool/main/c/crash$ ]] \
    || die "unexpected file '$dir/$orig' in $SUITE's index"

out="$CACHE/crash-$upstream"
if [ -x "$out/crash" ]; then
    echo "$out/crash"
    exit 0
fi

say "building crash $upstream (Debian $SUITE's source; about 5 CPU-minutes) into $out"
tmp="$CACHE/.crash-$upstream.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
/usr/lib/apt/apt-helper -q download-file "$MIRROR/$dir/$orig" "$tmp/$orig" "SHA256:$sha" >/dev/null \
    || die "could not download $orig from $MIRROR"
tar -xf "$tmp/$orig" -C "$tmp"
src=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'crash-*' | head -1)
[ -n "$src" ] || die "$orig holds no crash-* directory"
start=$(date +%s)
if ! (cd "$src" && nice make -j"$(nproc)" > "$tmp/build.log" 2>&1); then
    tail -20 "$tmp/build.log" >&2
    die "the build failed (log: $tmp/build.log)"
fi
"$src/crash" --version >/dev/null || die "the built crash does not run"
mkdir -p "$tmp/out"
install -m 0755 "$src/crash" "$tmp/out/crash"
echo "$(( $(date +%s) - start ))" > "$tmp/out/.build-seconds"
rm -rf "$out"
mv "$tmp/out" "$out"
rm -rf "$tmp"
say "crash $upstream built in $(cat "$out/.build-seconds") s"
echo "$out/crash"
