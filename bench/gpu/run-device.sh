#!/usr/bin/env bash
# One device call: install the carried wheels, record the machine, run the GPU tests and the
# qualification. Usage (on the GPU machine, repo root, .whl and .criu-bundle carried):
#   bench/gpu/run-device.sh OUT [pytest|nopytest] QUALIFY-ARGS...
set -uo pipefail
out=$1; mode=$2; shift 2
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
  date -u; uname -r; nproc; free -g | head -2
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -c 'import torch, transformers, cuda.bindings, torch_memory_saver; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda-bindings", cuda.bindings.__version__)'
  df -h / /var/tmp /dev/shm; stat -f -c '%T' /var/tmp
  .criu-bundle/criu --version; .criu-bundle/criu check 2>&1 | tail -2
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
if [ "$mode" = pytest ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/backends/test_cuda_checkpoint.py tests/gpu ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$out/pytest.log" | tail -15
fi
timeout ${QUALIFY_TIMEOUT:-540} python3 bench/gpu/qualify.py --out "$out" "$@" > "$out/qualify.stdout" 2>&1
rc=$?
tail -c 5000 "$out/qualify.stdout"
if [ -n "${PYTEST_AFTER:-}" ]; then
  timeout "$PYTEST_AFTER" python3 -m pytest -q -p no:cacheprovider tests/gpu -k qualify 2>&1 | tee "$out/pytest-after.log" | tail -5
fi
cat /var/tmp/coldsnap-qualify/*/workload-*.log 2>/dev/null | grep -v '^$' | tail -c 200000 > "$out/workloads.log"
exit $rc
