"""SGLang as a coldsnap engine: its policy, its launcher, the machine-side steps
(`SGLangEngine`), the support of hosts without CUDA (`cpu`), and `register(registry)`, the
entry point of `coldsnap.registrations` that registers engine "sglang".

The steps meet coldsnap's plugin inside SGLang only through SGLang's HTTP endpoints and the
files of coldsnap._wire.
"""

from __future__ import annotations

from typing import Any

from coldsnap._cuda import device_count
from coldsnap._torch import gpu_build
from coldsnap.machine import Registry

from . import cpu
from ._build import installed_sglang
from ._cmdline import EngineArgsError, SGLangCommandLine, check_engine_args, parse_command_line
from ._keys import give_key, given_key
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
from ._options import (
    GRAPH_SAVER_ENV,
    OPTIONS,
    EngineOptionsError,
    SGLangOptions,
    check_engine_options,
    parse_options,
)
from ._policy import SGLANG_POLICY
from ._specs import SLEEP, WAKE
from ._steps import (
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
    """The SGLang adapter for `request` on this host, with the request's engine options
    (`engine_options`; none for a request without them, such as the command line's reading of
    a launch line). With CUDA: SGLang with the memory saver (`CUDA_ARGS`); with the option
    `cuda_graphs_in_saver` also its CUDA graphs (then the graph steps run, and prefill graphs
    are off: `GRAPH_SAVER_ARGS`); without it graphs stay in the image and no graph step is in
    the spec. Without CUDA it serves on SGLang's CPU platform (`cpu.CPU_ARGS`, `cpu.cpu_env`),
    and the CPU support is activated in this process too: `build()` imports SGLang for the
    contract digest at capture; graphs in the memory saver are refused there
    (EngineOptionsError). Neither torch nor SGLang is imported on a host whose torch is a CPU
    build (`cuda_host`).
    """
    options = parse_options(getattr(request, "engine_options", None))
    if cuda_host():
        graph_saver = options.cuda_graphs_in_saver
        args = (*CUDA_ARGS, *(GRAPH_SAVER_ARGS if graph_saver else ()))
        launcher = SGLangLauncher(
            args,
            {GRAPH_SAVER_ENV: "1" if graph_saver else "0"},
            context_free_preload=CUDA_TEMPLATE_PRELOAD,
            template_env=memory_saver_preload(),
            options=options,
        )
        return SGLangEngine(launcher, cuda=True, graphs=graph_saver, rank_reports=True)
    if options.cuda_graphs_in_saver:
        raise EngineOptionsError(
            "engine_options.cuda_graphs_in_saver: needs CUDA (this host serves on SGLang's CPU "
            "platform, which captures no CUDA graphs)"
        )
    cpu.activate()
    launcher = SGLangLauncher(
        (*cpu.CPU_ARGS, *cpu.CPU_MEMORY_ARGS), cpu.cpu_env({}), cpu=True, options=options
    )
    return SGLangEngine(launcher, rank_reports=True)


def cuda_host() -> bool:
    """Whether SGLang serves on CUDA here: torch is a GPU build (read from its version file)
    and, asked only then, the CUDA driver lists a device (coldsnap._cuda: neither asks torch,
    whose import costs seconds on a GPU host)."""
    return gpu_build() is not None and device_count() > 0


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
    "OPTIONS",
    "RUNTIME_ROOT",
    "SGLANG_POLICY",
    "EngineArgsError",
    "EngineOptionsError",
    "Identity",
    "SGLangCommandLine",
    "SGLangEngine",
    "SGLangLauncher",
    "SGLangOptions",
    "TopologyArgsError",
    "build",
    "check_engine_args",
    "check_engine_options",
    "coldsnap_env",
    "cpu",
    "cpu_binding",
    "cuda_host",
    "export_dir",
    "free_port",
    "give_key",
    "given_key",
    "installed_sglang",
    "parse_command_line",
    "parse_options",
    "register",
    "scheduler_records",
    "tp_size",
]
