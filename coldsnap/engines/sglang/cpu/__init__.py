"""SGLang on a host without CUDA: its CPU platform, and what makes it importable there.

No CPU build of sgl-kernel is on PyPI and PyPI's torchvision does not load on CPU torch, so
`pythonpath/` holds a `sitecustomize` that declares torchvision's two ops before torchvision
loads, and an `sgl_kernel` stand-in whose kernels raise if they are ever called.

- `cpu_env()`: the environment of an SGLang process (the folder on PYTHONPATH, CPU platform).
- `activate()`: readies this process too (it imports SGLang for the contract digest, or runs
  `sglang.Engine` in process) and the children it starts.
- `CPU_ARGS`, `CPU_MEMORY_ARGS`: the server arguments of the CPU platform.

Refused on a GPU install (`GpuInstallError`): the stand-ins must never shadow real kernels.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from coldsnap._errors import RefusedError

PYTHONPATH_DIR = Path(__file__).resolve().parent / "pythonpath"

# Flags that make SGLang serve on CPU. CUDA graphs are disabled with the per-phase backend
# flags; `--disable-cuda-graph` is deprecated.
CPU_ARGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
)  # fmt: skip
# SGLang sizes the KV cache from a fraction of the device's memory; on CPU that device is the
# host's RAM, so the pool is bounded explicitly.
CPU_MEMORY_ARGS: tuple[str, ...] = ("--max-total-tokens", "2048", "--mem-fraction-static", "0.05")


class GpuInstallError(RefusedError, RuntimeError):
    """The CPU stand-ins were asked for on an install that has a GPU torch or a real sgl_kernel."""


def check_cpu_install() -> None:
    """Refuses to shadow a real GPU install: the stand-ins are for CPU hosts only."""
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        raise GpuInstallError(
            f"torch {torch.__version__} is a GPU build: the CPU stand-ins of "
            "coldsnap.engines.sglang.cpu must not be used with it"
        )
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is not None and spec.origin and Path(spec.origin).parent.parent != PYTHONPATH_DIR:
        raise GpuInstallError(f"a real sgl_kernel is installed ({spec.origin}); not shadowing it")


def cpu_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for an SGLang process on CPU: `base` (default: this process's) with the
    stand-ins first on PYTHONPATH and SGLang's CPU platform selected."""
    env = dict(os.environ if base is None else base)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PYTHONPATH_DIR) not in parts:
        parts.insert(0, str(PYTHONPATH_DIR))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    # Without it SGLang picks the CUDA code paths and the scheduler dies importing vllm ops.
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    return env


def activate() -> None:
    """Readies this process (SGLang imported here, in-process `sglang.Engine`, transformers)
    and its children; idempotent."""
    check_cpu_install()
    if str(PYTHONPATH_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHONPATH_DIR))
    os.environ.update(cpu_env())
    import _coldsnap_cpu_support  # type: ignore[import-not-found]

    if "torchvision" not in sys.modules:
        _coldsnap_cpu_support.declare_torchvision_ops()


__all__ = [
    "CPU_ARGS",
    "CPU_MEMORY_ARGS",
    "PYTHONPATH_DIR",
    "GpuInstallError",
    "activate",
    "check_cpu_install",
    "cpu_env",
]
