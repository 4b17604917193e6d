#!/usr/bin/env bash
# One device call of the architecture matrix (bench/gpu/matrix.py) on the H200, against a frozen
# copy of the product: real SGLang 0.5.17, coldsnap's `Machine`, every architecture's model built
# on the device.
#
# Carried (git-ignored, named in `carry`: ".carry"):
#   .carry/tree.tgz                   `git archive` of the commit under test, bench/gpu/matrix.py
#                                     included (unpacked afresh to /tmp/matrix-tree: the shared
#                                     working tree may change meanwhile)
#   .carry/gpu-env.sh                 shared/tools/gpu-env.sh (SGLang, wheels, CRIU, dist-info)
#   .carry/sglang-0.5.17-gpu.tar.xz   shared/tools/sglang-gpu-bundle.sh
#   .carry/criu-bundle.tar.xz         scripts/bundle-criu.sh, then tar -cJf (unpacks to criu-bundle/)
#   .carry/whl/*.whl                  torch_memory_saver 0.0.10, attrs, cattrs, tenacity, transitions
# The harness runs from the frozen tree, as its working directory too: an engine that `Machine`
# starts inherits that directory, and the harness, its engines and `coldsnap restore` must all
# import the one coldsnap under test.
#
# Usage: bench/gpu/matrix-device.sh OUT [BUDGET_S] [-- matrix.py arguments]
#   e.g. bench/gpu/matrix-device.sh $OUT 570 -- --jobs 4 --variants n610-native
set -uo pipefail
out=${1:?usage: $0 OUT [BUDGET_S] [-- matrix.py arguments]}; shift
budget=570
if [ $# -gt 0 ] && [ "$1" != "--" ]; then budget=$1; shift; fi
[ "${1:-}" = "--" ] && shift
t0=$(date +%s)
tree=/tmp/matrix-tree
mkdir -p "$out"; out=$(cd "$out" && pwd)
rm -rf "$tree"; mkdir -p "$tree"
tar -C "$tree" -xzf .carry/tree.tgz || exit 1
[ -f "$tree/bench/gpu/matrix.py" ] || { echo ".carry/tree.tgz holds no bench/gpu/matrix.py" >&2; exit 1; }
{
  # shellcheck source=/dev/null
  source .carry/gpu-env.sh .carry "$tree"
  mkdir -p /run/coldsnap/engines
  date -u; uname -r; nproc; free -g | head -2; cat /proc/sys/kernel/pid_max
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -P -c 'import torch, transformers, sglang, coldsnap; print("torch", torch.__version__, "transformers", transformers.__version__, "sglang", sglang.__version__, "coldsnap from", coldsnap.__file__)'
  "$COLDSNAP_CRIU" --version | head -1
  echo "setup took $(( $(date +%s) - t0 )) s"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
# (the block above ran in this shell: its environment holds here)
cd "$tree" || exit 1
elapsed=$(( $(date +%s) - t0 ))
export MATRIX_COMMAND="bash bench/gpu/matrix-device.sh OUT $budget${*:+ -- $*}"
python3 -P bench/gpu/matrix.py --out "$out" --budget $(( budget - elapsed - 15 )) "$@" 2>&1 \
  | tee "$out/matrix.log"
rc=${PIPESTATUS[0]}
echo "matrix.py exited $rc after $(( $(date +%s) - t0 )) s"
exit "$rc"
