#!/usr/bin/env bash
# One device call: real SGLang 0.5.17 through coldsnap's `Machine` on the H200
# (bench/gpu/sglang_machine.py). Run from the repository root of a copy of the working tree.
#
# Carried (git-ignored, named in `carry`: ".carry"):
#   .carry/sglang-0.5.17-gpu.tar.xz   shared/tools/sglang-gpu-bundle.sh
#   .carry/criu-bundle.tar.xz         scripts/bundle-criu.sh, then tar -cJf (unpacks to criu-bundle/)
#   .carry/whl/*.whl                  torch_memory_saver 0.0.10, attrs, cattrs, tenacity, transitions
# The working tree itself (coldsnap, bench) is used as it is, first on PYTHONPATH; coldsnap is not
# pip-installed there, so a dist-info folder with its entry points (sglang.srt.plugins: the plugin;
# coldsnap.registrations: drivers, engine, providers, store) is generated from pyproject.toml.
#
# Usage: [SIZE=small|2g|8g] bench/gpu/sglang-machine-device.sh OUT [BUDGET_S] [-- extra args]
#        bench/gpu/sglang-machine-device.sh --dry OUT   (no GPU: dist-info, imports, requests)
# SIZE picks the random Llama (coldsnap.tiny_models), built once per machine at /tmp/model-SIZE.
# Set-up is skipped where an earlier call on the same (still warm) machine did it; the cold
# start's record is kept in /tmp/cold-SIZE.json for later calls (--cold-json).
# With an n580 variant, the template's imports are probed first for CUDA device files
# (an n580 template must be context-free; OUT/template-probe.txt).
set -uo pipefail
dry=0
if [ "${1:-}" = "--dry" ]; then dry=1; shift; fi
out=${1:?usage: $0 [--dry] OUT [BUDGET_S] [-- args]}; shift
budget=570
if [ $# -gt 0 ] && [ "$1" != "--" ]; then budget=$1; shift; fi
[ "${1:-}" = "--" ] && shift
t0=$(date +%s)
tree=$PWD
mkdir -p "$out"
py=${PYTHON:-python3}

# -- coldsnap's dist-info (entry points), from pyproject.toml ----------------------------------
dist=${COLDSNAP_DIST_DIR:-/tmp/coldsnap-dist}
rm -rf "$dist"; mkdir -p "$dist"
"$py" - "$tree/pyproject.toml" "$dist" <<'EOF' || exit 1
import sys, tomllib
from pathlib import Path
project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
groups = project.get("entry-points", {})
for group in ("sglang.srt.plugins", "coldsnap.registrations"):
    if not groups.get(group):
        sys.exit(f"pyproject.toml declares no entry points of {group}")
info = Path(sys.argv[2]) / f"coldsnap-{project['version']}.dist-info"
info.mkdir(parents=True)
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: coldsnap\nVersion: {project['version']}\n")
lines = []
for group, entries in groups.items():
    lines.append(f"[{group}]")
    lines += [f"{name} = {value}" for name, value in entries.items()]
    lines.append("")
(info / "entry_points.txt").write_text("\n".join(lines))
(info / "top_level.txt").write_text("coldsnap\n")
print("dist-info:", info)
EOF

if [ $dry = 1 ]; then
  export PYTHONPATH=$tree:$dist${PYTHONPATH:+:$PYTHONPATH}
  model=$(mktemp -d)  # requests need an existing model directory; nothing is loaded
  exec "$py" bench/gpu/sglang_machine.py --out "$out" --model "$model" --root "$out/root" \
    --dry "$@"
fi

# -- unpack SGLang, wheels, CRIU (once per machine) ---------------------------------------------
if [ ! -f /tmp/sgl/.coldsnap-unpacked ]; then
  rm -rf /tmp/sgl /tmp/site; mkdir -p /tmp/sgl /tmp/site
  tar -C /tmp/sgl -xJf .carry/sglang-0.5.17-gpu.tar.xz &
  untar=$!
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .carry/whl/*.whl || exit 1
  tar -C /tmp -xJf .carry/criu-bundle.tar.xz || exit 1
  wait $untar || exit 1
  touch /tmp/sgl/.coldsnap-unpacked
fi
size=${SIZE:-small}
model=/tmp/model-$size
export PYTHONPATH=$tree:$dist:/tmp/sgl:/tmp/site
export PATH=/tmp/sgl/bin:$PATH PYTHONUNBUFFERED=1
export COLDSNAP_CRIU=/tmp/criu-bundle/criu
# The memory saver's preload hook needs torch's CUDA 13 runtime on the loader's path.
cu13=$("$py" -P -c 'import nvidia, pathlib; print(":".join(str(p) for p in (pathlib.Path(d) / "cu13" / "lib" for d in nvidia.__path__) if p.exists()))' 2>/dev/null)
export LD_LIBRARY_PATH=${cu13}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /run/coldsnap/engines

{
  date -u; uname -r; nproc; free -g | head -2
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  "$py" -P -c 'import torch, transformers, triton, sglang, torch_memory_saver, importlib.metadata as m; print("torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__, "sglang", sglang.__version__, "tms", m.version("torch_memory_saver")); print("sglang.srt.plugins", [f"{e.name}={e.value}" for e in m.entry_points(group="sglang.srt.plugins")]); print("coldsnap.registrations", sorted(e.name for e in m.entry_points(group="coldsnap.registrations")))'
  "$COLDSNAP_CRIU" --version; "$COLDSNAP_CRIU" check 2>&1 | tail -1
  git -C "$tree" rev-parse HEAD 2>/dev/null; git -C "$tree" status --short 2>/dev/null | head -40
  "$py" -c "import time; t = time.perf_counter(); from coldsnap.tiny_models import build_model; print(build_model('$model', 'llama', '$size', 0)); print(f'model build: {time.perf_counter() - t:.1f} s')"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
[ -f "$model/config.json" ] || { echo "no model built" >&2; exit 1; }
case " $* " in *n580*)
  # An n580 template imports these (SGLangLauncher.template_preload, forkserver_preload) and
  # must hold no CUDA device file afterwards.
  "$py" - > "$out/template-probe.txt" 2>&1 <<'EOF'
import importlib, os, time
from coldsnap.engines.sglang import SGLangLauncher
t = time.perf_counter()
for name in (*SGLangLauncher.template_preload, *(SGLangLauncher.forkserver_preload or ())):
    importlib.import_module(name)
maps = [l.split()[-1] for l in open("/proc/self/maps") if "/dev/nvidia" in l]
def _target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:  # the listing's own descriptor, closed by now
        return ""
fds = [_target(f) for f in os.listdir("/proc/self/fd")]
print(f"imports {time.perf_counter() - t:.1f} s; nvidia maps {sorted(set(maps))};",
      f"nvidia fds {[f for f in fds if 'nvidia' in f]}")
EOF
  cat "$out/template-probe.txt";;
esac
elapsed=$(( $(date +%s) - t0 ))
echo "setup took ${elapsed} s"
"$py" bench/gpu/sglang_machine.py --out "$out" --model "$model" --size "$size" \
  --cold-json "/tmp/cold-$size.json" --budget $(( budget - elapsed - 15 )) "$@" 2>&1 \
  | tee "$out/sglang_machine.log"
rc=${PIPESTATUS[0]}
echo "sglang_machine.py exited $rc after $(( $(date +%s) - t0 )) s"
exit "$rc"
