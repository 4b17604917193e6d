"""SGLang on a host without CUDA: its CPU platform, and what makes it importable there.

No CPU build of sgl-kernel is on PyPI and PyPI's torchvision does not load on CPU torch, so
`pythonpath/` holds a `sitecustomize` that declares torchvision's two ops before torchvision
loads, and an `sgl_kernel` stand-in whose kernels raise if they are ever called.

- `cpu_env()`: the environment of an SGLang process (the folder on PYTHONPATH, CPU platform).
  With an overlay (`overlay=` or `COLDSNAP_SGLANG_OVERLAY` in the base environment: a directory
  holding another SGLang release installed with `pip install --target`, e.g. the 0.5.17 one
  `scripts/setup.sh sglang-0517` makes) the overlay follows the stand-ins on PYTHONPATH, ahead
  of the venv's own SGLang, so that process runs that release.
- `activate()`: readies this process too (it imports SGLang for the contract digest, or runs
  `sglang.Engine` in process) and the children it starts; it refuses an overlay once another
  SGLang is already imported here.
- `CPU_ARGS`, `CPU_MEMORY_ARGS`: the server arguments of the CPU platform.

Refused on a GPU install (`GpuInstallError`): the stand-ins must never shadow real kernels.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from coldsnap._errors import EnvironmentMissing, RefusedError
from coldsnap._torch import gpu_build

PYTHONPATH_DIR = Path(__file__).resolve().parent / "pythonpath"
STAND_INS = ("sgl_kernel/__init__.py", "_coldsnap_cpu_support.py")
"""The stand-ins' files SGLang's processes import from PYTHONPATH_DIR (its sitecustomize only
arms the second)."""
# A directory holding another SGLang release (pip install --target), put after the stand-ins.
OVERLAY_VARIABLE = "COLDSNAP_SGLANG_OVERLAY"

# Flags that make SGLang serve on CPU. CUDA graphs are disabled with the per-phase backend
# flags; `--disable-cuda-graph` is deprecated. An idle scheduler otherwise busy-polls a whole
# core (measured on 2 cores: 1.04 cores idle without `--sleep-on-idle`, 0.06 with it; time to
# the first answer unchanged, 17.7-19.7 s either way).
CPU_ARGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--sleep-on-idle",
)  # fmt: skip
# SGLang sizes the KV cache from a fraction of the device's memory; on CPU that device is the
# host's RAM, so the pool is bounded explicitly.
CPU_MEMORY_ARGS: tuple[str, ...] = ("--max-total-tokens", "2048", "--mem-fraction-static", "0.05")


class GpuInstallError(RefusedError, EnvironmentMissing, RuntimeError):
    """The CPU stand-ins were asked for on an install that has a GPU torch or a real sgl_kernel."""


def check_cpu_install() -> None:
    """Refuses to shadow a real GPU install: the stand-ins are for CPU hosts only. torch's
    build is read without importing torch; an `sgl_kernel` is looked for on the import path
    past every folder of stand-ins (this install's, or another copy of coldsnap's that a
    parent process exported on PYTHONPATH), so only a real kernel is refused."""
    built = gpu_build()
    if built is not None:
        raise GpuInstallError(
            f"torch is a GPU build ({built}): the CPU stand-ins of "
            "coldsnap.engines.sglang.cpu must not be used with it"
        )
    rest = [p for p in sys.path if not is_stand_in_folder(p)]
    spec = importlib.machinery.PathFinder.find_spec("sgl_kernel", rest)
    if spec is not None:
        raise GpuInstallError(f"a real sgl_kernel is installed ({spec.origin}); not shadowing it")


def is_stand_in_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether `folder` holds coldsnap's CPU stand-ins (this copy's `PYTHONPATH_DIR`, or the
    same folder of another copy of coldsnap): it holds every file of `STAND_INS`."""
    return all((Path(folder or ".") / name).is_file() for name in STAND_INS)


class OverlayError(RefusedError, ValueError):
    """The SGLang overlay directory is missing, holds no SGLang, or comes too late."""


def check_overlay(overlay: str | Path) -> Path:
    """The overlay directory, refused (naming the variable) unless it holds an SGLang."""
    path = Path(overlay).resolve()
    if not (path / "sglang" / "__init__.py").is_file():
        raise OverlayError(
            f"{OVERLAY_VARIABLE}={overlay}: no SGLang installed there "
            "(scripts/setup.sh sglang-0517 installs the 0.5.17 overlay)"
        )
    return path


def cpu_env(
    base: Mapping[str, str] | None = None, *, overlay: str | Path | None = None
) -> dict[str, str]:
    """The environment for an SGLang process on CPU: `base` (default: this process's) with the
    stand-ins first on PYTHONPATH, then the SGLang overlay if one is named (`overlay`, else
    `COLDSNAP_SGLANG_OVERLAY` in `base`), and SGLang's CPU platform selected."""
    env = dict(os.environ if base is None else base)
    if overlay is None:
        overlay = env.get(OVERLAY_VARIABLE) or None
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    parts = [p for p in parts if not is_stand_in_folder(p)]  # ours, or another copy's
    front = [str(PYTHONPATH_DIR)]
    if overlay is not None:
        path = check_overlay(overlay)
        parts = [p for p in parts if p != str(path)]
        front.append(str(path))
        env[OVERLAY_VARIABLE] = str(path)
    env["PYTHONPATH"] = os.pathsep.join(front + parts)
    # Without it SGLang picks the CUDA code paths and the scheduler dies importing vllm ops.
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    return env


def activate() -> None:
    """Readies this process (SGLang imported here, in-process `sglang.Engine`, transformers)
    and its children; idempotent, in this process and across processes: a child started with
    the environment it exports (this copy's stand-ins first on PYTHONPATH, or another copy's)
    readies itself the same way. Imports neither torch nor SGLang: the torchvision ops are
    declared when torchvision is first imported."""
    check_cpu_install()
    env = cpu_env()
    overlay = env.get(OVERLAY_VARIABLE)
    if overlay is not None and overlay not in sys.path:
        loaded = sys.modules.get("sglang")
        if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(overlay):
            raise OverlayError(
                f"{OVERLAY_VARIABLE}={overlay}: SGLang is already imported in this process "
                f"from {loaded.__file__}"
            )
        sys.path.insert(0, overlay)
    if str(PYTHONPATH_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHONPATH_DIR))
    os.environ.update(env)
    import _coldsnap_cpu_support  # type: ignore[import-not-found]

    _coldsnap_cpu_support.install()


__all__ = [
    "CPU_ARGS",
    "CPU_MEMORY_ARGS",
    "OVERLAY_VARIABLE",
    "PYTHONPATH_DIR",
    "STAND_INS",
    "GpuInstallError",
    "OverlayError",
    "activate",
    "check_cpu_install",
    "check_overlay",
    "cpu_env",
    "is_stand_in_folder",
]
