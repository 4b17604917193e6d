"""Makes SGLang importable on a CPU-only host, in this process and in every child it starts."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

PYTHONPATH_DIR = Path(__file__).resolve().parent / "pythonpath"


class GpuInstallError(RuntimeError):
    """The CPU stand-ins were asked for on an install that has a GPU torch or a real sgl_kernel."""


def check_cpu_install() -> None:
    """Refuses to shadow a real GPU install: the stand-ins are for CPU test hosts only."""
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        raise GpuInstallError(
            f"torch {torch.__version__} is a GPU build: the CPU stand-ins of "
            "coldsnap.testing.sglang_cpu must not be used with it"
        )
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is not None and spec.origin and Path(spec.origin).parent.parent != PYTHONPATH_DIR:
        raise GpuInstallError(f"a real sgl_kernel is installed ({spec.origin}); not shadowing it")


def cpu_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for an SGLang process on CPU: stand-ins on PYTHONPATH, CPU platform."""
    env = dict(os.environ if base is None else base)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PYTHONPATH_DIR) not in parts:
        parts.insert(0, str(PYTHONPATH_DIR))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    # Without it SGLang picks the CUDA code paths and the scheduler dies importing vllm ops.
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    return env


def activate() -> None:
    """Readies this process (for in-process `sglang.Engine` or transformers) and its children."""
    check_cpu_install()
    if str(PYTHONPATH_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHONPATH_DIR))
    os.environ.update(cpu_env())
    import _coldsnap_cpu_support  # type: ignore[import-not-found]

    if "torchvision" not in sys.modules:
        _coldsnap_cpu_support.declare_torchvision_ops()
