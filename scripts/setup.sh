#!/usr/bin/env bash
# Idempotent set-up: a venv under the repo with coldsnap and its pinned dependencies.
# Re-running does nothing when the inputs (pyproject, constraints, requirements) are unchanged.
# Usage: scripts/setup.sh [base|sglang|sglang-0517|cpu-torchvision|criu|registry|all]  (default: all)
# sglang-0517: SGLang 0.5.17 as an overlay directory ($VENV/sglang-0.5.17) for the CPU tests of
# the plugin across releases (coldsnap.testing.sglang_cpu, release="0.5.17").
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
PY=${PYTHON:-python3.11}
VENV=${COLDSNAP_VENV:-.venv}

stamp_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }

# pip compiles every installed module to bytecode one file after another (about 25,000 files
# here, a third of the set-up's time); it installs without that, and compile_bytecode compiles
# them afterwards on every core. The result is the same bytecode.
pip_install() { "$VENV/bin/python" -m pip install -q --no-compile "$@"; }

# $1: a directory of installed modules. A few files in the wheels are not Python 3.11 (torch's
# Python 3.12 test intrinsics) and cannot compile; pip's own compile step skips them silently
# too, so compileall's status (1 when any file failed) says nothing here and is not checked.
# Left out (NOT_IMPORTED): the wheels' own test suites, SGLang's diffusion runtime and
# transformers' per-model modules, about a third of the files, of which coldsnap, its tests and
# a CPU SGLang server import only the few models they run (Python compiles those at their first
# import, once). The bytecode of every other file is the same as before.
NOT_IMPORTED='/(tests?|multimodal_gen)/|/transformers/models/'
compile_bytecode() { "$VENV/bin/python" -m compileall -qq -j0 -x "$NOT_IMPORTED" "$1" || true; }

site_packages() {
  "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

setup_base() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV with $PY"
    "$PY" -m venv "$VENV"
  fi
  local stamp; stamp=$(stamp_of pyproject.toml constraints.txt)
  if [ "$(cat "$VENV/.coldsnap-base" 2>/dev/null)" != "$stamp" ]; then
    echo "setup: installing coldsnap and its dependencies"
    pip_install -c constraints.txt torch==2.13.0
    pip_install -c constraints.txt -e '.[dev]'
    compile_bytecode "$(site_packages)"
    echo "$stamp" > "$VENV/.coldsnap-base"
  fi
}

setup_sglang() {
  local stamp; stamp=$(stamp_of constraints.txt requirements/sglang-cpu.txt)
  if [ "$(cat "$VENV/.coldsnap-sglang" 2>/dev/null)" != "$stamp" ]; then
    echo "setup: installing SGLang for CPU (no CUDA-only dependencies)"
    pip_install -c constraints.txt -r requirements/sglang-cpu.txt
    pip_install -c constraints.txt --no-deps sglang==0.5.23
    compile_bytecode "$(site_packages)"
    echo "$stamp" > "$VENV/.coldsnap-sglang"
  fi
}

# PyPI's torchvision is built against CUDA torch; on the CPU torch pinned here `import
# torchvision` dies on `operator torchvision::nms does not exist`, and with it a plain
# `python -m sglang.launch_server` or `python -m sglang.bench_serving` in this venv (transformers
# imports torchvision). No CPU torchvision wheel is on PyPI, so a .pth file in the venv arms
# coldsnap's lazy declaration of those ops (engines/sglang/cpu/pythonpath/_coldsnap_cpu_support.py)
# in every interpreter of the venv: it imports nothing until torchvision is imported, and
# declares nothing on a GPU torch, whose torchvision brings its own ops. Rewritten on every run
# (the venv or the checkout may have moved).
setup_cpu_torchvision() {
  local site support pth
  site=$(site_packages)
  support="$(pwd)/coldsnap/engines/sglang/cpu/pythonpath/_coldsnap_cpu_support.py"
  pth="$site/coldsnap-cpu-torchvision.pth"
  local code="import importlib.util as u\\nn = '_coldsnap_cpu_support'\\nm = sys.modules.get(n)\\nif m is None:\\n    spec = u.spec_from_file_location(n, '$support')\\n    m = u.module_from_spec(spec)\\n    spec.loader.exec_module(m)\\n    sys.modules[n] = m\\nm.install()"
  printf '%s\n' "import sys; exec(\"$code\", {'sys': sys})" > "$pth.tmp"
  mv "$pth.tmp" "$pth"
}

setup_sglang_0517() {
  local dir="$VENV/sglang-0.5.17"
  local stamp; stamp=$(stamp_of requirements/sglang-0517-overlay.txt)
  if [ "$(cat "$dir/.coldsnap-overlay" 2>/dev/null)" != "$stamp" ]; then
    echo "setup: installing SGLang 0.5.17 as an overlay in $dir"
    rm -rf "$dir.tmp"
    pip_install --no-deps --target "$dir.tmp" -r requirements/sglang-0517-overlay.txt
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    compile_bytecode "$dir"  # after the move: bytecode records its source's path
    echo "$stamp" > "$dir/.coldsnap-overlay"
  fi
}

setup_criu() {
  if [ -x scripts/setup-criu.sh ]; then scripts/setup-criu.sh; fi
}

# The OCI registry the push/pull tests start on a free port (Debian's CNCF distribution
# registry); skipped when present, or without root (those tests then skip, saying why).
setup_registry() {
  command -v docker-registry >/dev/null || [ "$(id -u)" != 0 ] || { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry; } </dev/null
}

case "$what" in
  base) setup_base ;;
  sglang) setup_base; setup_sglang; setup_cpu_torchvision ;;
  sglang-0517) setup_base; setup_sglang; setup_cpu_torchvision; setup_sglang_0517 ;;
  cpu-torchvision) setup_cpu_torchvision ;;
  criu) setup_criu ;;
  registry) setup_registry ;;
  all) setup_base; setup_sglang; setup_cpu_torchvision; setup_sglang_0517; setup_criu; setup_registry ;;
  *) echo "setup: unknown target '$what' (base, sglang, sglang-0517, cpu-torchvision, criu, registry, all)" >&2
     exit 2 ;;
esac
