#!/usr/bin/env bash
# Idempotent: make CRIU >= 4.2 with coldsnap's patches available as /usr/local/sbin/criu.
#
# Why a build: Debian 12's criu 3.17 fails at start on kernel >= 6.x ("Unexpected rt vDSO area
# bounds"), CRIU < 4.2 cannot dump TCP sockets on Linux >= 6.16, and no CRIU release keeps the
# AMX tile-data permission across a restore (scripts/criu-patches/). So we build CRIU 4.2.1 from
# the upstream tarball that Debian unstable ships, against bookworm's libraries, and patch it.
# This never falls back to another CRIU: it exits non-zero if the build cannot be done.
#
# Re-runs: nothing happens when the installed binary is 4.2+ and carries our patch marker; the
# unpacked, built tree is kept in $COLDSNAP_CRIU_CACHE (default /var/cache/coldsnap) so a
# re-install after a patch change or a deleted binary only rebuilds what changed.
# Needs root (apt-get, /usr/local). Non-interactive (CI runs it with no stdin).
# Env: COLDSNAP_CRIU_CACHE, COLDSNAP_CRIU_PREFIX (default /usr/local),
#      COLDSNAP_CRIU_TARBALL (use this criu_4.2.1.orig.tar.xz instead of downloading it).
set -euo pipefail

CRIU_VERSION=4.2.1
# The SHA256 of upstream's criu-4.2.1 tarball as Debian ships it (criu_4.2.1.orig.tar.xz).
# apt's signed index must agree with it; a mismatch stops the build.
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
# A string compiled into the binary by our AMX patch: its presence means "our build".
AMX_MARKER=coldsnap-amx-xtiledata-v1

here=$(cd "$(dirname "$0")" && pwd)
patch_dir=$here/criu-patches
cache=${COLDSNAP_CRIU_CACHE:-/var/cache/coldsnap}
prefix=${COLDSNAP_CRIU_PREFIX:-/usr/local}
tree=$cache/criu-$CRIU_VERSION
bin=$prefix/sbin/criu
plugin_dir=/usr/lib/criu  # CRIU's compiled-in plugin directory (CR_PLUGIN_DEFAULT)
t0=$(date +%s.%N)

log() { echo "setup-criu: $*"; }
die() { echo "setup-criu: ERROR: $*" >&2; exit 1; }
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

version_ok() { # $1: a criu binary; true when it reports >= 4.2
  local v
  v=$("$1" --version 2>/dev/null | awk '/^Version:/ { print $2 }') || return 1
  [ -n "$v" ] || return 1
  [ "$(printf '%s\n4.2\n' "$v" | sort -V | head -1)" = "4.2" ]
}

has_marker() { grep -aqF "$AMX_MARKER" "$1" 2>/dev/null; }

run_check() { # $1: a criu binary; prints its verdict, true when "criu check" passes
  local out
  if out=$("$1" check 2>&1); then
    log "criu check: $(echo "$out" | tail -1)"
    return 0
  fi
  echo "$out" | sed 's/^/setup-criu: criu check: /' >&2
  return 1
}

patch_stamp() { # identifies the patch set (and this script's build recipe) applied to a tree
  { echo "$CRIU_VERSION"; cat "$patch_dir"/*.patch 2>/dev/null; } | sha256sum | cut -c1-16
}

if [ "$(id -u)" != 0 ]; then
  # Not a fallback: no CRIU is used then, and the CRIU tests skip, saying they need root.
  log "not root: cannot build or install CRIU here; CRIU tests will be skipped"
  exit 0
fi

# 1. Already there?
plugin_ok() { [ ! -f "$tree/plugins/cuda/cuda_plugin.so" ] || [ -f "$plugin_dir/cuda_plugin.so" ]; }
if [ -x "$bin" ] && version_ok "$bin" && has_marker "$bin" && plugin_ok; then
  if run_check "$bin"; then
    log "CRIU $("$bin" --version | awk '/^Version:/ { print $2 }') with coldsnap patches at $bin: nothing to do"
    exit 0
  fi
  log "installed CRIU fails 'criu check'; rebuilding"
fi
other=$(command -v criu 2>/dev/null || true)
if [ -n "$other" ] && [ "$other" != "$bin" ]; then
  log "ignoring $other ($("$other" --version 2>/dev/null | head -1 || echo 'no version')): not our patched build"
fi

# 2. Build dependencies from bookworm. --no-upgrade: upgrading a library that a checkpointed
# process maps would make its image unrestorable ("bad build-ID").
export DEBIAN_FRONTEND=noninteractive
build_deps=(build-essential pkg-config xz-utils protobuf-compiler protobuf-c-compiler
  libprotobuf-dev libprotobuf-c-dev libnl-3-dev libnet1-dev libcap-dev libbsd-dev
  libnftables-dev uuid-dev patch)
missing=()
for p in "${build_deps[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
apt_updated=0
apt_update() { [ $apt_updated = 1 ] || { apt-get update -qq </dev/null; apt_updated=1; }; }

# 3. The source tarball (only the orig tarball: the mirror may answer 404 for .dsc files).
tarball=$cache/criu_$CRIU_VERSION.orig.tar.xz
mkdir -p "$cache"
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$CRIU_SHA256" ]; }
if [ -n "${COLDSNAP_CRIU_TARBALL:-}" ]; then
  sha_ok "$COLDSNAP_CRIU_TARBALL" || die "$COLDSNAP_CRIU_TARBALL: SHA256 is not $CRIU_SHA256"
  cp "$COLDSNAP_CRIU_TARBALL" "$tarball"
fi
if ! sha_ok "$tarball"; then
  src_list=/etc/apt/sources.list.d/coldsnap-criu-src.sources
  if [ ! -f "$src_list" ]; then
    log "adding a deb-src source for unstable ($src_list)"
    cat > "$src_list" <<'EOF'
# Added by coldsnap's scripts/setup-criu.sh: source packages only (no binaries from unstable).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: unstable
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  apt_update
  line=$(apt-get source --print-uris -qq criu/unstable 2>/dev/null </dev/null \
    | grep -F "criu_$CRIU_VERSION.orig.tar.xz" || true)
  [ -n "$line" ] || die "Debian unstable no longer offers criu_$CRIU_VERSION.orig.tar.xz
  (apt-get source --print-uris criu/unstable). Put the tarball somewhere and set COLDSNAP_CRIU_TARBALL."
  uri=$(echo "$line" | awk '{ print $1 }' | tr -d "'")
  sha=$(echo "$line" | grep -o 'SHA256:[0-9a-f]*' | cut -d: -f2)
  [ "$sha" = "$CRIU_SHA256" ] || die "apt says the tarball's SHA256 is '$sha', expected $CRIU_SHA256"
  log "downloading $uri"
  # apt downloads as the unprivileged _apt user when it can: give it a folder of its own.
  dl=$(mktemp -d "$cache/download.XXXXXX")
  if id _apt >/dev/null 2>&1; then chown _apt "$dl"; fi
  /usr/lib/apt/apt-helper download-file "$uri" "$dl/criu.tar.xz" "SHA256:$CRIU_SHA256" >/dev/null
  mv "$dl/criu.tar.xz" "$tarball"
  rm -rf "$dl"
fi

if [ ${#missing[@]} -gt 0 ]; then
  log "installing build dependencies: ${missing[*]}"
  apt_update
  apt-get install -y -qq --no-install-recommends --no-upgrade "${missing[@]}" </dev/null >/dev/null
fi

# 4. Unpack and patch (again whenever the patch set changed), then build.
stamp=$(patch_stamp)
if [ "$(cat "$tree/.coldsnap-stamp" 2>/dev/null)" != "$stamp" ]; then
  log "unpacking $tarball and applying $(ls "$patch_dir"/*.patch 2>/dev/null | wc -l) patch(es)"
  rm -rf "$tree" "$tree.tmp"
  mkdir -p "$tree.tmp"
  tar -xJf "$tarball" -C "$tree.tmp" --strip-components=1
  for p in "$patch_dir"/*.patch; do
    [ -e "$p" ] || continue
    patch -d "$tree.tmp" -p1 --forward --batch --silent < "$p" || die "patch $p does not apply"
  done
  echo "$stamp" > "$tree.tmp/.coldsnap-stamp"
  mv "$tree.tmp" "$tree"
fi
jobs=$(nproc 2>/dev/null || echo 2)
log "building CRIU $CRIU_VERSION in $tree (make -j$jobs)"
tb=$(date +%s.%N)
build_log=$cache/build.log
if ! make -C "$tree" -j"$jobs" NO_GNUTLS=1 criu > "$build_log" 2>&1; then
  tail -30 "$build_log" >&2
  die "make criu failed (whole log: $build_log)"
fi
log "make criu took $(awk -v a="$tb" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
has_marker "$tree/criu/criu" || die "built binary lacks the AMX patch marker $AMX_MARKER"

# The CUDA plugin: CRIU's bridge to NVIDIA's cuda-checkpoint tool. Built and installed where
# CRIU looks for plugins (its compiled-in default, /usr/lib/criu/); it disables itself where
# there is no GPU or no cuda-checkpoint tool, so it is harmless on CPU hosts.
plugin=""
if [ -d "$tree/plugins/cuda" ]; then
  if make -C "$tree" -j"$jobs" NO_GNUTLS=1 cuda_plugin >> "$build_log" 2>&1; then
    plugin=$tree/plugins/cuda/cuda_plugin.so
  else
    log "warning: the CUDA plugin did not build (log: $build_log); the CRIU binary is fine"
  fi
fi

# 5. Install (atomically: a rename, so a running criu is never half-overwritten).
install -d "$prefix/sbin"
install -m 0755 "$tree/criu/criu" "$bin.new"
mv -f "$bin.new" "$bin"
if [ -n "$plugin" ]; then
  install -d "$plugin_dir"
  install -m 0755 "$plugin" "$plugin_dir/cuda_plugin.so.new"
  mv -f "$plugin_dir/cuda_plugin.so.new" "$plugin_dir/cuda_plugin.so"
  log "installed $plugin_dir/cuda_plugin.so"
fi
version_ok "$bin" || die "$bin does not report version >= 4.2"
log "installed $bin ($("$bin" --version | awk '/^Version:/ { print $2 }')) in $(elapsed) s"
if ! run_check "$bin"; then
  die "CRIU is installed at $bin but 'criu check' fails on this machine (see above)"
fi
