#!/usr/bin/env bash
# One device call of bench/gpu/arch_probe.py on the H200, against a frozen copy of the product.
#
# Carried (git-ignored, named in `carry`: ".carry"):
#   .carry/tree.tgz                   git archive of the commit under test (unpacked once to
#                                     /tmp/arch-tree: the shared working tree may change meanwhile)
#   .carry/gpu-env.sh                 shared/tools/gpu-env.sh (SGLang, wheels, CRIU, dist-info)
#   .carry/sglang-0.5.17-gpu.tar.xz   shared/tools/sglang-gpu-bundle.sh
#   .carry/criu-bundle.tar.xz         scripts/bundle-criu.sh, then tar -cJf (unpacks to criu-bundle/)
#   .carry/whl/*.whl                  torch_memory_saver 0.0.10, attrs, cattrs, tenacity, transitions
# The harness itself and its in-engine probe (bench/gpu/arch_probe_site, put first on every
# engine's path through PYTHONPATH) come from this working tree.
#
# Usage: bench/gpu/arch-probe-device.sh OUT [arch_probe.py arguments]
set -uo pipefail
out=${1:?usage: $0 OUT [arch_probe.py arguments]}; shift
t0=$(date +%s)
repo=$PWD
tree=/tmp/arch-tree
mkdir -p "$out"; out=$(cd "$out" && pwd)
if [ ! -d "$tree/coldsnap" ]; then
  mkdir -p "$tree" && tar -C "$tree" -xzf .carry/tree.tgz || exit 1
fi
{
  echo "image sitecustomize: $(python3 -c 'import sitecustomize; print(sitecustomize.__file__)' 2>&1 | tail -1)"
  # shellcheck source=/dev/null
  source .carry/gpu-env.sh .carry "$tree"
  export PYTHONPATH=$repo/bench/gpu/arch_probe_site:$PYTHONPATH
  export ARCH_PROBE_DIR=/tmp/arch-probe
  rm -rf "$ARCH_PROBE_DIR"; mkdir -p "$ARCH_PROBE_DIR" /run/coldsnap/engines
  date -u; uname -r; nproc
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -P -c 'import torch, transformers, sglang, coldsnap; print("torch", torch.__version__, "transformers", transformers.__version__, "sglang", sglang.__version__, "coldsnap from", coldsnap.__file__)'
  "$COLDSNAP_CRIU" --version | head -1
  echo "setup took $(( $(date +%s) - t0 )) s"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
# (the block above ran in this shell: its environment holds here)
# From the frozen tree: engines inherit this working directory, and `python -m` puts it first on
# their path, so the working tree's own coldsnap must not be here.
cd "$tree" || exit 1
python3 -P "$repo/bench/gpu/arch_probe.py" --out "$out" "$@" 2>&1 | tee "$out/run.log"
rc=${PIPESTATUS[0]}
echo "arch_probe.py exited $rc after $(( $(date +%s) - t0 )) s"
exit "$rc"
