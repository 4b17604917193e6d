#!/usr/bin/env bash
# Copy the installed CRIU (scripts/setup-criu.sh), its CUDA plugin and every shared library they
# need except libc and the dynamic loader into DEST, so it runs on a machine with another image
# (the GPU machine: no CRIU there, no network). DEST/criu is the entry point: a wrapper that
# points the loader at DEST/lib and CRIU at DEST/plugins. Libraries are taken from this machine,
# so DEST only runs where the glibc is at least this one's (Debian 12: 2.36).
# Usage: scripts/bundle-criu.sh DEST        (DEST is replaced; e.g. .criu-bundle, git-ignored)
set -euo pipefail
[ $# = 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
dest=$1
criu_bin=${COLDSNAP_CRIU_BIN:-/usr/local/sbin/criu}
plugin=${COLDSNAP_CRIU_PLUGIN:-/usr/lib/criu/cuda_plugin.so}
[ -x "$criu_bin" ] || { echo "bundle-criu: $criu_bin missing: run scripts/setup-criu.sh" >&2; exit 1; }

libs_of() { # the resolved paths of the shared libraries an ELF file needs, minus libc and the loader
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' \
    | grep -Ev '/(libc|ld-linux[^/]*|libm|libdl|libpthread|librt)\.so' || true
}

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/plugins"
install -m 0755 "$criu_bin" "$dest/bin/criu"
files=("$criu_bin")
if [ -f "$plugin" ]; then
  install -m 0755 "$plugin" "$dest/plugins/"
  files+=("$plugin")
else
  echo "bundle-criu: no CUDA plugin at $plugin; bundling CRIU alone" >&2
fi
for f in "${files[@]}"; do
  for lib in $(libs_of "$f"); do
    cp -L "$lib" "$dest/lib/"
  done
done

cat > "$dest/criu" <<'EOF'
#!/bin/sh
# CRIU carried with its own libraries (made by coldsnap's scripts/bundle-criu.sh).
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CRIU_LIBS_DIR="${CRIU_LIBS_DIR:-$here/plugins}"
export LD_LIBRARY_PATH CRIU_LIBS_DIR
exec "$here/bin/criu" "$@"
EOF
chmod 0755 "$dest/criu"

(cd "$dest" && find bin lib plugins -type f | sort | xargs sha256sum > SHA256SUMS)
"$dest/criu" --version >/dev/null || { echo "bundle-criu: $dest/criu does not run" >&2; exit 1; }
echo "bundle-criu: $dest: CRIU $("$dest/criu" --version | awk '/^Version:/ { print $2 }')," \
  "$(ls "$dest/lib" | wc -l) libraries, $(du -sh "$dest" | cut -f1)"
