"""SGLang's command line for the drivers: `python -m sglang.launch_server` with coldsnap's
plugin enabled, and the modules an n580 template imports first.

Each engine gets a runtime directory at a host-level path (not under the operation's workdir)
because its path is frozen into the engine's environment and so into an n610 image: a restore
on another host recreates the same path and writes the resume plan there.
"""

from __future__ import annotations

import importlib.util
import os
import random
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from coldsnap._paths import ENGINES_ROOT
from coldsnap._torch import gpu_build
from coldsnap._wire import RECOVERY_LOAD_FORMATS, EngineSettings
from coldsnap.engines._args import parse as parse_args
from coldsnap.machine import LaunchCommand, WeightSource, WeightSourceError

from ._cmdline import TP_FLAGS, EngineArgsError, check_engine_args
from ._keys import engine_argv, launch_key
from ._options import GRAPH_SAVER_ENV, SGLangOptions

RUNTIME_ROOT = ENGINES_ROOT
CPU_BIND_VARIABLE = "SGLANG_CPU_OMP_THREADS_BIND"
# On CPU each rank's scheduler busy-polls a core while idle; with several ranks on a small host
# they starve the HTTP process (measured on 2 cores, TP2: first answer 14 s later than with it).
CPU_RANKS_ARGS: tuple[str, ...] = ("--sleep-on-idle",)
# SGLang (0.5.17 measured on the H200) creates a CUDA context while it is imported:
# sglang.srt.utils.common resolves the platform with torch.cuda.is_available() and imports
# sgl_kernel, which asks for the current device (docs/qualification.md). An n580 template
# must hold no device state, so on a CUDA host it imports only what never touches the device.
CUDA_TEMPLATE_PRELOAD: tuple[str, ...] = ("torch", "transformers")
MEMORY_SAVER_HOOK = "torch_memory_saver_hook_mode_preload"
PRELOAD_VARIABLE = "LD_PRELOAD"


def memory_saver_preload() -> dict[str, str]:
    """The environment that loads the memory saver's allocator hook into a process at exec.

    SGLang puts the hook on LD_PRELOAD only while it spawns its schedulers; a scheduler forked
    from an n580 template's forkserver is never exec'd, so the hook must already be loaded in
    the forkserver, which inherits the template's environment (measured on the H200: without
    it a release freed nothing)."""
    hook = _memory_saver_hook()
    current = [p for p in os.environ.get(PRELOAD_VARIABLE, "").split(":") if p and p != hook]
    return {PRELOAD_VARIABLE: ":".join([hook, *current])}


def _memory_saver_hook() -> str:
    """The memory saver's preload hook built for this torch's CUDA major, looked up as the
    memory saver looks it up (`<hook>_cu<major>.*.so` in its package folder, else the folder
    above) without importing its package: that imports torch, 3.4 s of a fresh `coldsnap
    restore` on the H200 (measured), which builds this environment for every request. Any other
    case (no single match, another accelerator) asks the memory saver itself, the slow way."""
    built = gpu_build()
    spec = importlib.util.find_spec("torch_memory_saver")
    if built and built.startswith("cuda ") and spec and spec.submodule_search_locations:
        major = built.split()[1].split(".")[0]
        folder = Path(next(iter(spec.submodule_search_locations)))
        pattern = f"{MEMORY_SAVER_HOOK}_cu{major}.*.so"
        found = sorted(folder.glob(pattern)) or sorted(folder.parent.glob(pattern))
        if len(found) == 1:
            return str(found[0])
    from torch_memory_saver.utils import get_binary_path_from_package

    return str(get_binary_path_from_package(MEMORY_SAVER_HOOK))


class TopologyArgsError(EngineArgsError):
    """The request's engine arguments set the tensor-parallel size themselves: it comes from
    the request's `tp`, which the capsule binds."""


def tp_size(request: Any) -> int:
    """The tensor-parallel size the engine is started with: the request's `tp` (a restore that
    names none starts the captured one: the driver hands the capsule's in)."""
    tp = getattr(request, "tp", None)
    return 1 if tp is None else int(tp)


def cpu_binding(tp: int, cpus: Sequence[int]) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `tp` ranks on a host without NUMA nodes to spare: the
    CPUs this process may use, split into `tp` contiguous groups (ranks share CPUs when there
    are fewer CPUs than ranks). SGLang otherwise wants one NUMA node per rank."""
    ordered = sorted(cpus)
    if not ordered:
        raise TopologyArgsError("no CPU is available to bind the engine's ranks to")
    groups = []
    for rank in range(tp):
        if len(ordered) >= tp:
            lo, hi = rank * len(ordered) // tp, (rank + 1) * len(ordered) // tp
            part = ordered[lo:hi]
        else:
            part = [ordered[rank % len(ordered)]]
        groups.append(",".join(map(str, part)))
    return "|".join(groups)


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORTS = range(20000, 32768)  # below Linux's default ephemeral range (32768-60999)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, outside the kernel's ephemeral
    range where it can: a port the kernel hands out for outgoing connections and other
    listeners (the engine's own process groups bind port 0 as it starts) can be taken before
    the engine binds it."""
    try:
        low, high = (int(x) for x in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    candidates = [p for p in _PORTS if not low <= p <= high]
    for port in random.sample(candidates, min(64, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # every candidate taken
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_dir(runtime_dir: Path) -> Path:
    """Where an engine started to export writes its weight payload when it is released."""
    return runtime_dir / "payload"


ALGORITHM_FLAG = "--speculative-algorithm"
OWN_DRAFT_ALGORITHMS = ("STANDALONE",)
"""Speculative algorithms whose worker loads a draft model of its own from
`--speculative-draft-model-path`, which SGLang never defaults (0.5.17's StandaloneWorkerV2).
EAGLE and the others may take the target's own checkpoint (multi-token-prediction layers) or
need none (NGRAM), so their draft is not required here."""


def speculative_algorithm(engine_args: Sequence[str]) -> str | None:
    """The speculative algorithm the engine arguments name (their last
    `--speculative-algorithm`), upper-cased as SGLang reads it; None without one."""
    given = parse_args(engine_args).get(ALGORITHM_FLAG)
    if not given or not given[-1]:
        return None
    return given[-1][0].upper()


LOAD_FORMAT_FLAG = "--load-format"
ALL_SETTINGS = tuple(attrs.fields_dict(EngineSettings))
"""Every field of EngineSettings: an engine's environment states each one, even at its
default, since the engine inherits the orchestrator's environment, which must not decide any
of them (a COLDSNAP_ARTIFACT_PREVERIFIED=1 left in a shell would skip a verification)."""


def engine_load_format(engine_args: Sequence[str]) -> str | None:
    """The load format the engine's own command line names (its last `--load-format`), or
    None."""
    given = parse_args(engine_args).get(LOAD_FORMAT_FLAG)
    if not given or not given[-1]:
        return None
    return given[-1][0]


def recovery_load_format(
    engine_args: Sequence[str], options: SGLangOptions, weights: WeightSource
) -> str:
    """The load format of a recovery reload: the engine option where it names one other than
    `auto`, else what the engine's command line loads with (its `--load-format`, where it names
    one a reload from a local checkpoint can read), else `auto`. An option and a command line
    that name different formats, and an engine that loads its checkpoint (a checkpoint source)
    in a format no reload can read, are refused naming the field: a recovery must read the
    checkpoint the way the captured engine first did."""
    named = engine_load_format(engine_args)
    chosen = options.recovery_load_format
    if chosen != "auto":
        if named is not None and named != chosen:
            raise EngineArgsError(
                f"engine_options.recovery_load_format: {chosen!r} differs from the engine "
                f"arguments' {LOAD_FORMAT_FLAG} {named} (a recovery reloads the checkpoint the "
                "way the engine loads it)"
            )
        return chosen
    if named is None:
        return "auto"
    if named in RECOVERY_LOAD_FORMATS:
        return named
    if not weights.payload:
        raise EngineArgsError(
            f"engine_args: {LOAD_FORMAT_FLAG} {named} cannot be reloaded from the pinned "
            f"checkpoint by a recovery (it reads: {', '.join(RECOVERY_LOAD_FORMATS)})"
        )
    return "auto"  # the engine starts from a payload: no recovery reload reads its checkpoint


def coldsnap_env(
    request: Any,
    weights: WeightSource,
    runtime_dir: Path,
    options: SGLangOptions | None = None,
) -> dict[str, str]:
    """The COLDSNAP_* variables of an engine (coldsnap._wire.EngineSettings): a capture from a
    payload source exports the payload on release, and every capture publishes its graph
    shapes; an engine constructed at restore (n580) starts from the payload (hydrated at load,
    verified already where the provider says so: COLDSNAP_ARTIFACT_PREVERIFIED) or the
    checkpoint. The request's `async_cuda_graphs` defers the decode graphs. The engine options
    (the request's, parsed by the adapter; none: their defaults) set the live backing, the
    process artifact root, the residual and the rank timeout; a recovery reloads with the load
    format the request's engine arguments load with (`recovery_load_format`). Every variable is
    written, each at its value or default (ALL_SETTINGS), with SGLang's graph variable: the
    engine inherits the orchestrator's environment, which must not decide them."""
    options = options or SGLangOptions()
    settings = options.settings(
        EngineSettings(
            runtime_dir=runtime_dir,
            async_cuda_graphs=bool(getattr(request, "async_cuda_graphs", False)),
        )
    )
    settings = attrs.evolve(
        settings,
        recovery_load_format=recovery_load_format(
            getattr(request, "engine_args", ()), options, weights
        ),
    )
    if request.operation == "capture":
        # the graph shapes warmed before the snapshot are published, and the capsule binds them
        settings = attrs.evolve(settings, mode="capture", shape_calibration="record")
        if weights.payload:
            settings = attrs.evolve(
                settings, export_model_payload=True, artifact_dir=export_dir(runtime_dir)
            )
    else:
        settings = attrs.evolve(settings, mode="restore", startup_source=weights.source)
        if weights.payload:
            if not weights.payload_dir:
                raise WeightSourceError(
                    "weight source field 'payload_dir': a restore from a payload names it"
                )
            settings = attrs.evolve(
                settings,
                artifact_dir=Path(weights.payload_dir),
                artifact_preverified=weights.preverified,
            )
    return settings.to_env(always=ALL_SETTINGS)


class SGLangLauncher:
    """`python -m MODULE --model-path ... --port ...` with a fresh runtime dir and port per engine
    (or the request's port); a restore from a payload source starts without loading
    (`--load-format dummy`) and hydrates from the payload the provider staged.

    `base_args` and `base_env` carry what this host needs (on a CPU host, coldsnap.engines.
    sglang.cpu's arguments and environment); `SGLANG_PLUGINS=coldsnap` is always set. A
    subclass may serve another module that speaks the same endpoints and plugin files (the
    tests' toy engine) by overriding `module` and the preloads.

    `context_free_preload` replaces both preloads where SGLang's own modules cannot be
    imported without a device context (CUDA_TEMPLATE_PRELOAD); `template_env` is what an n580
    template's environment adds to the engine's (the memory saver's hook on CUDA).

    The request's `tp` becomes `--tp-size` (never the engine arguments: TopologyArgsError);
    `cpu` says the engine runs on SGLang's CPU platform, whose ranks need a thread binding;
    `options` are the request's engine options, which every command writes (`coldsnap_env`),
    and GRAPH_SAVER_ENV is always written (0 unless `base_env` says 1: the adapter's build
    decides it from the option `cuda_graphs_in_saver`), never inherited."""

    module = "sglang.launch_server"
    # What an n580 template imports before it is dumped: the engine's heavy modules.
    template_preload: tuple[str, ...] = (
        "torch",
        "sglang.launch_server",
        "sglang.srt.entrypoints.http_server",
    )
    # What the template's forkserver imports, so the engine's children start warm.
    forkserver_preload: tuple[str, ...] | None = (
        "torch",
        "sglang.srt.managers.scheduler",
        "sglang.srt.managers.detokenizer_manager",
        # Imports every model module (about a second): do it once, in the template.
        "sglang.srt.models.registry",
    )

    # What a restored engine (n580 builds it again) adds: SGLang's server warmup sleeps a whole
    # second before its own request and /ready waits for it, while the restore's acceptance
    # request proves generation anyway (bench/bench_n580.py). Only SGLang's own server knows it.
    restore_args: tuple[str, ...] = ("--skip-server-warmup",)

    def __init__(
        self,
        base_args: tuple[str, ...] = (),
        base_env: Mapping[str, str] | None = None,
        *,
        cpu: bool = False,
        context_free_preload: tuple[str, ...] | None = None,
        template_env: Mapping[str, str] | None = None,
        options: SGLangOptions | None = None,
    ) -> None:
        self.options = options or SGLangOptions()
        self.base_args = tuple(base_args)
        self.template_env = dict(template_env or {})
        self.base_env = {**(base_env or {}), "SGLANG_PLUGINS": "coldsnap"}
        self.cpu = cpu
        if context_free_preload is not None:  # what a template may import on this host
            self.template_preload = context_free_preload
            self.forkserver_preload = context_free_preload

    def topology(self, tp: int) -> tuple[list[str], dict[str, str]]:
        """The arguments and environment of `tp` ranks on this host: `--tp-size` and, on CPU,
        a thread binding per rank and schedulers that sleep while idle."""
        if tp == 1:
            return [], {}
        args = ["--tp-size", str(tp)]
        if not self.cpu:
            return args, {}
        cpus = sorted(os.sched_getaffinity(0))
        extra = [a for a in CPU_RANKS_ARGS if a not in self.base_args]
        return [*args, *extra], {CPU_BIND_VARIABLE: cpu_binding(tp, cpus)}

    def command(
        self,
        request: Any,
        workdir: Path,
        *,
        weights: WeightSource,
        runtime_dir: Path | None = None,
    ) -> LaunchCommand:
        problems = check_engine_args(request.engine_args)
        if problems:
            text = "; ".join(f"{field}: {why}" for field, why in problems)
            tp = any(a.split("=")[0] in TP_FLAGS for a in request.engine_args)
            raise (TopologyArgsError if tp else EngineArgsError)(text)
        draft = getattr(request, "draft", None)
        algorithm = speculative_algorithm(request.engine_args)
        if draft is None and algorithm in OWN_DRAFT_ALGORITHMS:
            # admission lets a restore leave the draft out (an n610 image holds it), but an
            # engine started here loads it from its path
            raise EngineArgsError(
                f"draft: the engine arguments name {ALGORITHM_FLAG} {algorithm}, which serves a "
                "draft model of its own: name it in the field 'draft' (the engine is given its "
                "path; SGLang has no default for it)"
            )
        if runtime_dir is None:  # else the driver's, which it made (the Launcher protocol)
            runtime_dir = RUNTIME_ROOT / uuid.uuid4().hex
            runtime_dir.mkdir(parents=True, mode=0o700)
        port = getattr(request, "port", None) or free_port()
        host = getattr(request, "host", None) or "127.0.0.1"
        restoring = request.operation == "restore"
        tp_args, tp_env = self.topology(tp_size(request))
        # -P: the engine inherits the orchestrator's working directory, and `python -m` would
        # put it first on the import path: run from a checkout, the engine would import that
        # checkout's coldsnap plugin instead of the one installed beside the orchestrator.
        argv = [sys.executable, "-P", "-m", self.module, "--model-path", request.model.path,
                "--host", host, "--port", str(port), *self.base_args, *tp_args,
                *request.engine_args]  # fmt: skip
        if draft is not None:  # a payload restore's dummy load format applies to it too
            argv += ["--speculative-draft-model-path", draft.path]
        if restoring and weights.payload:
            argv += ["--load-format", "dummy"]
        if restoring and self.module == SGLangLauncher.module:
            argv += [a for a in self.restore_args if a not in argv]
        argv = engine_argv(argv, launch_key(request, runtime_dir))  # a keyed engine: its key
        env = {GRAPH_SAVER_ENV: "0", **self.base_env, **tp_env,
               **coldsnap_env(request, weights, runtime_dir, self.options)}  # fmt: skip
        dial = "127.0.0.1" if host in ("0.0.0.0", "localhost") else host  # a wildcard bind
        return LaunchCommand(argv=argv, env=env, url=f"http://{dial}:{port}")


__all__ = [
    "ALGORITHM_FLAG",
    "ALL_SETTINGS",
    "CPU_BIND_VARIABLE",
    "CPU_RANKS_ARGS",
    "CUDA_TEMPLATE_PRELOAD",
    "MEMORY_SAVER_HOOK",
    "OWN_DRAFT_ALGORITHMS",
    "PRELOAD_VARIABLE",
    "RUNTIME_ROOT",
    "TP_FLAGS",
    "SGLangLauncher",
    "TopologyArgsError",
    "coldsnap_env",
    "cpu_binding",
    "engine_load_format",
    "export_dir",
    "free_port",
    "memory_saver_preload",
    "recovery_load_format",
    "speculative_algorithm",
    "tp_size",
]
