#!/usr/bin/env bash
# The TP2 qualification in one device call on nvidia-h200-x2 (repo root; .whl and .criu-bundle
# carried): install the wheels, record the machine, run variant A (NCCL's default transports,
# two restores), then variant B chosen from A's outcome (A passed or failed before the dump:
# nop2p, the socket transport; A's dump found /dev/nvidia* files still open: A again with NVML
# shut down for the dump). Logs and JSON go to OUT (at most 7 files).
#   bench/gpu/tp2-device.sh OUT
set -uo pipefail
out=$1; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLDSNAP_CRIU=$PWD/.criu-bundle/criu
{
  date -u; uname -r; nproc; free -g | head -2
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv
  nvidia-smi topo -m
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|transformers|cuda-bindings|nvidia-nccl-cu13|torch.memory.saver) '
  .criu-bundle/criu --version | head -1; .criu-bundle/criu check 2>&1 | tail -1
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
dev=${TP2_DEVICE:-cuda}  # cpu: a rehearsal of this script on the CPU machines
# shellcheck disable=SC2206
common=(--out "$out" --device "$dev" --barrier-timeout 30 --http-timeout 45 --start-timeout 60 ${TP2_EXTRA:-})
timeout "${A_TIMEOUT:-80}" python3 bench/gpu/tp2.py "${common[@]}" --variant default --restores 2 \
  > /dev/null 2>&1
echo "A rc=$?"
b=$(python3 - "$out/tp2-default-$dev.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception:
    r = {}
fds = (r.get("capture") or {}).get("device_fds_before_dump") or {}
if not r.get("ok") and any(fds.values()):
    print("--variant default --nvml-shutdown --restores 1")
else:
    print("--variant nop2p --restores 1")
PY
)
echo "B: $b"
# shellcheck disable=SC2086
timeout "${B_TIMEOUT:-65}" python3 bench/gpu/tp2.py "${common[@]}" $b > /dev/null 2>&1
echo "B rc=$?"
for f in "$out"/tp2-*.log; do
  echo "== $f"; grep -vE 'CHECK PASS' "$f" | cut -c1-600 | tail -25
done
for f in "$out"/tree-*.log; do
  echo "== $f"; grep -E 'NCCL INFO (Channel 00|Connected|comm 0x.*Init COMPLETE)|Error|error|Traceback' "$f" | cut -c1-300 | head -12
done
