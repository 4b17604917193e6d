"""SGLang as a coldsnap engine: its policy, its launcher, the machine-side steps
(`SGLangEngine`), the support of hosts without CUDA (`cpu`), and `register(registry)`, the
entry point of `coldsnap.registrations` that registers engine "sglang".

The steps meet coldsnap's plugin inside SGLang only through SGLang's HTTP endpoints and the
files of coldsnap._wire.
"""

from __future__ import annotations

from typing import Any

from coldsnap.machine import Registry

from . import cpu
from ._launcher import RUNTIME_ROOT, SGLangLauncher, coldsnap_env, export_dir, free_port
from ._policy import SGLANG_POLICY
from ._steps import Identity, SGLangEngine, installed_sglang


def build(request: Any) -> SGLangEngine:
    """The SGLang adapter for `request` on this host. With CUDA the engine captures CUDA graphs.
    Without CUDA it serves on SGLang's CPU platform (`cpu.CPU_ARGS`, `cpu.cpu_env`), and the CPU
    support is activated in this process too: `build()` imports SGLang for the contract digest.
    """
    import torch

    if torch.cuda.is_available():
        return SGLangEngine(SGLangLauncher(), graphs=True)
    cpu.activate()
    launcher = SGLangLauncher((*cpu.CPU_ARGS, *cpu.CPU_MEMORY_ARGS), cpu.cpu_env({}))
    return SGLangEngine(launcher)


def register(registry: Registry) -> None:
    """Entry point of `coldsnap.registrations`."""
    registry.register_engine(
        "sglang",
        build=build,
        doc="SGLang with coldsnap's plugin (CUDA graphs on CUDA hosts; CPU platform elsewhere)",
    )


__all__ = [
    "RUNTIME_ROOT",
    "SGLANG_POLICY",
    "Identity",
    "SGLangEngine",
    "SGLangLauncher",
    "build",
    "coldsnap_env",
    "cpu",
    "export_dir",
    "free_port",
    "installed_sglang",
    "register",
]
