"""SGLang as a coldsnap engine: its policy, its launcher, the machine-side steps
(`SGLangEngine`), the support of hosts without CUDA (`cpu`), and `register(registry)`, the
entry point of `coldsnap.registrations` that registers engine "sglang".

The steps meet coldsnap's plugin inside SGLang only through SGLang's HTTP endpoints and the
files of coldsnap._wire.
"""

from __future__ import annotations

import os
from typing import Any

from coldsnap.machine import Registry

from . import cpu
from ._build import installed_sglang
from ._cmdline import EngineArgsError, SGLangCommandLine, check_engine_args, parse_command_line
from ._launcher import (
    CUDA_TEMPLATE_PRELOAD,
    RUNTIME_ROOT,
    SGLangLauncher,
    TopologyArgsError,
    coldsnap_env,
    cpu_binding,
    export_dir,
    free_port,
    memory_saver_preload,
    tp_size,
)
from ._policy import SGLANG_POLICY
from ._specs import SLEEP, WAKE
from ._steps import (
    GRAPH_SAVER_ENV,
    Identity,
    SGLangEngine,
    scheduler_records,
)

CUDA_ARGS = ("--enable-memory-saver",)
"""On CUDA the weights, the KV cache (and, with GRAPH_SAVER_ENV, the graphs) live in the memory
saver's regions, so a release frees them; release_memory measures that it did."""
GRAPH_SAVER_ARGS = ("--cuda-graph-backend-prefill", "disabled")
"""SGLang refuses its default (breakable) prefill graph inside the memory saver."""


def build(request: Any) -> SGLangEngine:
    """The SGLang adapter for `request` on this host. With CUDA: SGLang with the memory saver
    (`CUDA_ARGS`); with SGLANG_MEMORY_SAVER_CUDA_GRAPH=1 in this environment also its CUDA
    graphs (then the graph steps run, and prefill graphs are off: `GRAPH_SAVER_ARGS`); without
    it graphs stay in the image and no graph step is in the spec. Without CUDA it serves on
    SGLang's CPU platform (`cpu.CPU_ARGS`, `cpu.cpu_env`), and the CPU support is activated in
    this process too: `build()` imports SGLang for the contract digest.
    """
    import torch

    if torch.cuda.is_available():
        graph_saver = os.environ.get(GRAPH_SAVER_ENV) == "1"
        args = (*CUDA_ARGS, *(GRAPH_SAVER_ARGS if graph_saver else ()))
        env = {GRAPH_SAVER_ENV: "1"} if graph_saver else {}
        launcher = SGLangLauncher(
            args,
            env,
            context_free_preload=CUDA_TEMPLATE_PRELOAD,
            template_env=memory_saver_preload(),
        )
        return SGLangEngine(launcher, cuda=True, graphs=graph_saver, rank_reports=True)
    cpu.activate()
    launcher = SGLangLauncher((*cpu.CPU_ARGS, *cpu.CPU_MEMORY_ARGS), cpu.cpu_env({}), cpu=True)
    return SGLangEngine(launcher, rank_reports=True)


def register(registry: Registry) -> None:
    """Entry point of `coldsnap.registrations`."""
    registry.register_engine(
        "sglang",
        build=build,
        sleep=SLEEP,
        wake=WAKE,
        cls=SGLangEngine,
        doc="SGLang with coldsnap's plugin (the memory saver on CUDA hosts; CPU platform "
        "elsewhere)",
    )


__all__ = [
    "CUDA_ARGS",
    "CUDA_TEMPLATE_PRELOAD",
    "GRAPH_SAVER_ARGS",
    "GRAPH_SAVER_ENV",
    "RUNTIME_ROOT",
    "SGLANG_POLICY",
    "EngineArgsError",
    "Identity",
    "SGLangCommandLine",
    "SGLangEngine",
    "SGLangLauncher",
    "TopologyArgsError",
    "build",
    "check_engine_args",
    "coldsnap_env",
    "cpu",
    "cpu_binding",
    "export_dir",
    "free_port",
    "installed_sglang",
    "parse_command_line",
    "register",
    "scheduler_records",
    "tp_size",
]
