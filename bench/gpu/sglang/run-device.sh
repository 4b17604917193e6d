#!/usr/bin/env bash
# One device call for the release-path experiments on real SGLang 0.5.17 (see release_path.py).
# Carried (git-ignored, named in `carry`): .carry/sglang-0.5.17-gpu.tar.xz (shared/tools/
# sglang-gpu-bundle.sh), .carry/criu-bundle.tar.xz (scripts/bundle-criu.sh, tar -cJf), .carry/whl
# (torch_memory_saver 0.0.10, cattrs 26.2.1, attrs 26.1.0) and .carry/head (git archive HEAD
# coldsnap scripts: coldsnap's backends at HEAD, away from edits in progress).
# Usage (repo root, on the GPU machine): bench/gpu/sglang/run-device.sh OUT PLAN.json [BUDGET_S]
set -uo pipefail
out=$1; plan=$2; budget=${3:-520}
t0=$(date +%s)
mkdir -p "$out" /tmp/sgl /tmp/site
tar -C /tmp/sgl -xJf .carry/sglang-0.5.17-gpu.tar.xz &
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .carry/whl/*.whl || exit 1
tar -C /tmp -xJf .carry/criu-bundle.tar.xz || exit 1
wait
export PYTHONPATH=$PWD/.carry/head:/tmp/sgl:/tmp/site:$PWD/bench/gpu/sglang/probe
export PATH=/tmp/sgl/bin:$PATH PYTHONUNBUFFERED=1
{
  date -u; uname -r; nproc; free -g | head -2
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -P -c 'import torch, transformers, triton, sglang, torch_memory_saver, cuda.bindings, importlib.metadata as m; print("torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__, "sglang", sglang.__version__, "tms", m.version("torch_memory_saver"), "cuda-bindings", cuda.bindings.__version__); print("plugins", [e.name for e in m.entry_points(group="sglang.srt.plugins")])'
  /tmp/criu-bundle/criu --version; /tmp/criu-bundle/criu check 2>&1 | tail -1
  python3 -P -c 'import importlib.util as u; s = u.spec_from_file_location("m", ".carry/head/coldsnap/testing/models.py"); import sys; m = u.module_from_spec(s); sys.modules["m"] = m; s.loader.exec_module(m); print(m.build_model("/tmp/model", "llama", "small", 0))'
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
[ -f /tmp/model/config.json ] || { echo "no model built" >&2; exit 1; }
elapsed=$(( $(date +%s) - t0 ))
echo "setup took ${elapsed} s"
python3 bench/gpu/sglang/release_path.py --out "$out" --model /tmp/model --plan "$plan" \
  --budget $(( budget - elapsed ))
