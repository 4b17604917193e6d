"""Admission: the parts of SGLang the plugin relies on, checked by structure, not by version.

Each contract names one thing the plugin calls, hooks or reads (a function's parameters, a
tag's value, a class attribute, a line of behaviour in a function's source). A contract may be
met in more than one way: its `variants` are the other ways, each with the SGLang release it was
seen in (`seen_in`) and a `variant` name the hooks branch on. `check()` resolves every contract,
picks per contract the first variant the running build meets, and reports every contract that
no variant meets (with what each variant expected); the plugin refuses to start on any problem.
`digest()` hashes what was checked (signatures and sources) and the variant in use of each
contract, so an artifact captured against one SGLang build is known to need a new capture on
another. No model architecture and no version string is looked at: `seen_in` is documentation.
"""

from __future__ import annotations

import hashlib
import inspect
import pkgutil
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

import attrs

from coldsnap._errors import PluginError
from coldsnap._wire import CUDA_GRAPH, KV_CACHE, MEMORY_TAGS, WEIGHTS

SG = "sglang.srt"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "coldsnap"


class ContractError(PluginError, RuntimeError):
    """The installed SGLang does not offer a contract the plugin relies on."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        self.contracts = tuple(sorted({c for c, _ in problems}))
        lines = [f"SGLang contract '{c}' not met: {m}" for c, m in problems]
        super().__init__("coldsnap plugin refuses to start:\n" + "\n".join(lines))


@attrs.frozen
class Contract:
    """One checked fact. `group` is the contract family named in errors and docs."""

    group: str
    target: str  # dotted path resolved with pkgutil.resolve_name
    params: tuple[str, ...] = ()  # leading parameter names, in order
    is_async: bool | None = None
    kind: str = "callable"  # callable | value | attribute | source | class
    expected: Any = None  # value: the expected value; attribute: the attribute name;
    # source: snippets that must all appear in the target's source
    runtime_on_cpu: bool = True  # exercised at run time by the CPU tests (docs/plugin.md)
    absent: tuple[str, ...] = ()  # source: snippets that must not appear
    seen_in: str = "0.5.23"  # the SGLang release this variant was seen in (documentation only)
    variant: str = "default"  # the name hooks branch on when a contract has variants
    variants: tuple[Contract, ...] = ()  # other ways to meet this contract (first match wins)
    # (contract key, variant) pairs that must also be in use for this variant to be met
    requires: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """The contract's identity: its first variant's target."""
        return self.target

    def alternatives(self) -> tuple[Contract, ...]:
        return (self, *self.variants)


def _c(group: str, target: str, *params: str, **kw: Any) -> Contract:
    return Contract(group=group, target=target, params=tuple(params), **kw)


def _v(seen_in: str, variant: str, target: str, *params: str, **kw: Any) -> Contract:
    """Another way to meet a contract (the group is filled in from the contract)."""
    return Contract(
        group="", target=target, params=tuple(params), seen_in=seen_in, variant=variant, **kw
    )


def _with_variants(c: Contract, *variants: Contract) -> Contract:
    return attrs.evolve(
        c,
        variants=tuple(
            attrs.evolve(v, group=c.group, runtime_on_cpu=c.runtime_on_cpu) for v in variants
        ),
    )


_WU = f"{SG}.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
_RWU = f"{SG}.model_executor.model_runner_components.weight_updater.WeightUpdater"
_MR = f"{SG}.model_executor.model_runner.ModelRunner"
_TSA = f"{SG}.utils.torch_memory_saver_adapter.TorchMemorySaverAdapter"
_PCG = f"{SG}.model_executor.runner.prefill_cuda_graph_runner"

CONTRACTS: tuple[Contract, ...] = (
    # plugin discovery and hooks
    _c(
        "entry-point group",
        f"{SG}.plugins.GENERAL_PLUGINS_GROUP",
        kind="value",
        expected=ENTRY_POINT_GROUP,
    ),
    _c(
        "entry-point group",
        f"{SG}.plugins.load_plugins",
        kind="source",
        expected=("GENERAL_PLUGINS_GROUP", "HookRegistry.apply_hooks()"),
    ),
    _c(
        "hook registry",
        f"{SG}.plugins.hook_registry.HookRegistry.register",
        "cls",
        "target",
        "hook",
        "hook_type",
    ),
    _c("hook registry", f"{SG}.plugins.hook_registry.HookRegistry.apply_hooks"),
    _c(
        "hook registry",
        f"{SG}.plugins.hook_registry.HookType.AROUND",
        kind="attribute",
        expected="value",
    ),
    _c(
        "hook registry",
        f"{SG}.plugins.hook_registry.HookType.AFTER",
        kind="attribute",
        expected="value",
    ),
    _c(
        "hook registry",
        f"{SG}.plugins.hook_registry._wrap_fn",
        kind="source",
        expected=(
            "hook(original_fn, *args, **kwargs)",
            "modified = hook(result, *args, **kwargs)",
            "wrapper.__wrapped__ = original_fn",
        ),
    ),
    # memory saver
    _c("memory saver", f"{_TSA}.create", "enable"),
    _c("memory saver", f"{_TSA}.region", "self", "tag", "enable_cpu_backup"),
    _c("memory saver", f"{_TSA}.pause", "self", "tag"),
    _c("memory saver", f"{_TSA}.resume", "self", "tag"),
    _c("memory saver", f"{_TSA}.cuda_graph", "self", runtime_on_cpu=False),
    _c("memory saver", f"{_TSA}.configure_subprocess", "self", runtime_on_cpu=False),
    _c("memory saver", f"{_TSA}.enabled", kind="class", runtime_on_cpu=False),
    _c("memory saver", f"{SG}.constants.GPU_MEMORY_TYPE_WEIGHTS", kind="value", expected=WEIGHTS),
    _c(
        "memory saver",
        f"{SG}.constants.GPU_MEMORY_TYPE_KV_CACHE",
        kind="value",
        expected=KV_CACHE,
    ),
    _c(
        "memory saver",
        f"{SG}.constants.GPU_MEMORY_TYPE_CUDA_GRAPH",
        kind="value",
        expected=CUDA_GRAPH,
    ),
    _c(
        "memory saver",
        f"{SG}.constants.GPU_MEMORY_ALL_TYPES",
        kind="value",
        expected=list(MEMORY_TAGS),
    ),
    # loaders
    _with_variants(
        _c(
            "loader",
            f"{_MR}.load_model",
            "self",
            kind="source",
            expected=(
                "load_model_with_memory_saver(",
                "self.model = loaded.model",
                "self.startup_weight_load",
            ),
            variant="deferred-commit",
        ),
        # No overlapped start-up load: the weights are final when load_model returns.
        _v(
            "0.5.17",
            "load-commits",
            f"{_MR}.load_model",
            "self",
            kind="source",
            expected=("load_model_with_memory_saver(", "self.model = loaded.model"),
            absent=("startup_weight_load",),
        ),
    ),
    _with_variants(
        _c(
            "loader",
            f"{_MR}.__init__",
            "self",
            "model_config",
            "mem_fraction_static",
            "gpu_id",
            "nccl_port",
            "server_args",
            "is_draft_worker",
        ),
        # The parallel state is passed in (`ps`) before the port.
        _v(
            "0.5.17",
            "parallel-state-arg",
            f"{_MR}.__init__",
            "self",
            "model_config",
            "mem_fraction_static",
            "gpu_id",
            "ps",
            "nccl_port",
            "server_args",
            "is_draft_worker",
        ),
    ),
    _with_variants(
        _c(
            "loader",
            f"{_MR}.finalize_startup_weight_load",
            "self",
            runtime_on_cpu=False,
            variant="deferred-commit",
        ),
        # No deferred commit to hook: load_model registers (the load_model contract's variant
        # "load-commits" says the weights are final there).
        _v(
            "0.5.17",
            "none",
            f"{_MR}.finalize_startup_weight_load",
            kind="absent",
            requires=((f"{_MR}.load_model", "load-commits"),),
        ),
    ),
    _c(
        "loader",
        f"{SG}.model_executor.model_runner_components.load_model_utils.load_model_with_memory_saver",
        kind="source",
        expected=("memory_saver_adapter.region(", "GPU_MEMORY_TYPE_WEIGHTS", "loader.load_model("),
    ),
    _c("loader", f"{SG}.model_loader.loader.DefaultModelLoader.load_model", "self"),
    _c(
        "loader",
        f"{SG}.model_loader.loader.DummyModelLoader.load_model",
        "self",
    ),
    _c("loader", f"{SG}.configs.load_config.LoadFormat", kind="class"),
    # weight updater (scheduler side, every TP rank)
    _c(
        "weight updater",
        f"{_WU}.release_memory_occupation",
        "self",
        "recv_req",
        kind="source",
        expected=(
            "self.memory_saver_adapter.pause(GPU_MEMORY_TYPE_WEIGHTS)",
            "_export_static_state",
            "torch.distributed.barrier(self.tp_cpu_group)",
        ),
    ),
    _c(
        "weight updater",
        f"{_WU}.resume_memory_occupation",
        "self",
        "recv_req",
        kind="source",
        expected=(
            "self.memory_saver_adapter.resume(GPU_MEMORY_TYPE_WEIGHTS)",
            "_import_static_state",
            "self.offload_tags.remove(tag)",
        ),
    ),
    _with_variants(
        _c("weight updater", f"{_WU}._select_runners", "self", "selector", variant="selector"),
        # No runner selector: weight ops go to tp_worker's model_runner and the draft worker's.
        _v(
            "0.5.17",
            "tp-and-draft-worker",
            f"{_WU}.update_weights_from_disk",
            "self",
            "recv_req",
            kind="source",
            expected=(
                "self.tp_worker.update_weights_from_disk(",
                "self.draft_worker.update_weights_from_disk(",
            ),
        ),
    ),
    _c(
        "weight updater",
        f"{_WU}.__dataclass_fields__",
        kind="value_contains",
        expected=("tp_worker", "draft_worker", "memory_saver_adapter", "offload_tags"),
    ),
    _c(
        "weight updater",
        f"{_RWU}.update_weights_from_disk",
        "self",
        "model_path",
        "load_format",
        "weight_name_filter",
        "recapture_cuda_graph",
    ),
    _c(
        "weight updater",
        f"{_RWU}.__dataclass_fields__",
        kind="value_contains",
        expected=("get_model", "get_model_runner", "tp_rank"),
    ),
    _c(
        "weight updater",
        f"{SG}.managers.io_struct.ResumeMemoryOccupationReqInput.__struct_fields__",
        kind="value_contains",
        expected=("tags",),
    ),
    _c(
        "weight updater",
        f"{SG}.managers.io_struct.ReleaseMemoryOccupationReqInput.__struct_fields__",
        kind="value_contains",
        expected=("tags",),
    ),
    _c("weight updater", f"{SG}.managers.io_struct.ResumeMemoryOccupationReqOutput", kind="class"),
    # speculative workers: draft runners are ModelRunners flagged is_draft_worker
    _with_variants(
        _c(
            "speculative worker",
            f"{SG}.speculative.base_spec_worker.BaseSpecWorker.weight_update_runners",
            "self",
            runtime_on_cpu=False,
            variant="runner-list",
        ),
        # The draft runners are the draft worker's `draft_runners`.
        _v(
            "0.5.17",
            "draft-runners",
            f"{SG}.speculative.base_spec_worker.BaseSpecWorker.update_weights_from_disk",
            "self",
            "recv_req",
            kind="source",
            expected=("for runner in self.draft_worker.draft_runners",),
        ),
    ),
    _with_variants(
        _c(
            "speculative worker",
            f"{SG}.managers.tp_worker.TpModelWorker.weight_update_runners",
            "self",
            variant="runner-list",
        ),
        # The target worker's runner is its `model_runner` property.
        _v(
            "0.5.17",
            "model-runner",
            f"{SG}.managers.tp_worker.TpModelWorker.model_runner",
            kind="class",
        ),
    ),
    # tokenizer manager (main process): health gate
    _c(
        "tokenizer manager",
        f"{SG}.managers.tokenizer_control_mixin.TokenizerControlMixin.release_memory_occupation",
        "self",
        "obj",
        "request",
        is_async=True,
    ),
    _c(
        "tokenizer manager",
        f"{SG}.managers.tokenizer_control_mixin.TokenizerControlMixin.resume_memory_occupation",
        "self",
        "obj",
        "request",
        is_async=True,
    ),
    _with_variants(
        _c(
            "tokenizer manager",
            f"{SG}.managers.tokenizer_manager.TokenizerManager._set_engine_state_field",
            "self",
            "name",
            "value",
            variant="state-field",
        ),
        # server_status is a plain instance attribute: the gate guards it with a property.
        _v(
            "0.5.17",
            "plain-attribute",
            f"{SG}.managers.tokenizer_manager.TokenizerManager.init_running_status",
            "self",
            kind="source",
            expected=("self.server_status = ServerStatus.Starting",),
        ),
    ),
    _with_variants(
        _c(
            "tokenizer manager",
            f"{SG}.managers.tokenizer_manager.TokenizerManager.is_healthy",
            "self",
            kind="source",
            expected=("self.server_status == ServerStatus.Up",),
            variant="is-healthy",
        ),
        # No is_healthy: the health endpoint itself answers 503 while Starting.
        _v(
            "0.5.17",
            "health-endpoint",
            f"{SG}.entrypoints.http_server.health_generate",
            "request",
            kind="source",
            expected=(
                "tokenizer_manager.server_status == ServerStatus.Starting",
                "return Response(status_code=503)",
            ),
        ),
    ),
    _c(
        "tokenizer manager",
        f"{SG}.managers.tokenizer_manager.ServerStatus.Starting",
        kind="attribute",
        expected="value",
    ),
    _c(
        "tokenizer manager",
        f"{SG}.entrypoints.http_server.health_generate",
        kind="source",
        expected=("server_status == ServerStatus.Starting",),
    ),
    # API key (HTTP process): the key check asks this function about every request, handing it
    # the key to compare with (coldsnap.plugin._auth answers with the key file's)
    _c(
        "api key",
        f"{SG}.utils.auth.decide_request_auth",
        "method",
        "path",
        "authorization_header",
        "api_key",
        "admin_api_key",
        "auth_level",
    ),
    _c(
        "api key",
        f"{SG}.utils.auth.add_api_key_middleware",
        kind="source",
        expected=("decision = decide_request_auth(", "api_key=self.api_key,"),
    ),
    # graphs: shape calibration and async decode capture
    _c("cuda graphs", f"{_MR}.init_cuda_graphs", "self", "capture_decode_cuda_graph"),
    _c("cuda graphs", f"{_MR}.init_decode_cuda_graph", "self"),
    _c(
        "cuda graphs",
        f"{SG}.model_executor.runner.base_cuda_graph_runner.get_batch_sizes_to_capture",
        "model_runner",
        "captured_req_width",
        runtime_on_cpu=False,
    ),
    _c(
        "cuda graphs",
        f"{SG}.model_executor.cuda_graph_config.check_cuda_graph_backend",
        "phase",
        "backend",
        runtime_on_cpu=False,
    ),
    _c(
        "cuda graphs",
        f"{SG}.model_executor.cpu_graph_runner.get_batch_sizes_to_capture",
        "model_runner",
        runtime_on_cpu=False,
    ),
    _with_variants(
        _c(
            "cuda graphs",
            f"{_PCG}.get_prefill_num_tokens_to_capture",
            "capture_tokens",
            runtime_on_cpu=False,
            variant="aligned-tokens",
        ),
        # The prefill runner captures the server arguments' token counts, sorted.
        _v(
            "0.5.17",
            "sorted-tokens",
            f"{_PCG}.PrefillCudaGraphRunner.__init__",
            "self",
            kind="source",
            expected=(
                "prefill_config = model_runner.server_args.cuda_graph_config.prefill",
                "self.capture_num_tokens = sorted(capture_tokens)",
            ),
        ),
    ),
    _c("cuda graphs", f"{SG}.runtime_context.get_flags"),
    _c("cuda graphs", f"{SG}.runtime_context.get_exec", runtime_on_cpu=False),
    _c(
        "cuda graphs",
        f"{SG}.managers.scheduler.Scheduler.init_running_status",
        "self",
        kind="source",
        expected=("self.forward_ct = 0",),
    ),
    _c("cuda graphs", f"{SG}.managers.scheduler.Scheduler.on_idle", "self"),
    _c("cuda graphs", f"{SG}.managers.scheduler.Scheduler.is_fully_idle", "self"),
    # distributed
    _c("distributed", f"{SG}.distributed.parallel_state.get_tp_group"),
    _c("distributed", f"{SG}.runtime_context.get_parallel"),
    _c(
        "distributed",
        f"{SG}.distributed.parallel_state.GroupCoordinator.__init__",
        "self",
        kind="source",
        expected=("self.cpu_group", "self.device_group"),
    ),
)

GROUPS = tuple(dict.fromkeys(c.group for c in CONTRACTS))


def _resolve(target: str) -> Any:
    """Resolves a dotted path; class attributes are read raw (staticmethods unwrapped)."""
    module_path, _, attr = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(module_path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise LookupError(f"{module_path} cannot be imported or resolved ({exc})") from None
    if isinstance(owner, type) and attr in getattr(owner, "__dict__", {}):
        raw = owner.__dict__[attr]
        if isinstance(raw, staticmethod | classmethod):
            return raw.__func__
        return raw
    try:
        return getattr(owner, attr)
    except AttributeError:
        raise LookupError(f"{target} does not exist") from None


def _unwrap(obj: Any) -> Any:
    """Our own hooks wrap targets (functools.wraps + __wrapped__); check the original."""
    return inspect.unwrap(obj) if callable(obj) else obj


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return repr(obj)


def _check_one(c: Contract) -> tuple[str | None, str]:
    """(problem or None, the text that goes into the digest)."""
    try:
        obj = _resolve(c.target)
    except LookupError as exc:
        if c.kind == "absent":
            return None, "absent"
        return str(exc), ""
    if c.kind == "absent":
        return f"{c.target} exists (this variant expects it absent)", ""
    obj = _unwrap(obj)
    if c.kind == "value":
        if obj != c.expected:
            return f"{c.target} is {obj!r}, expected {c.expected!r}", repr(obj)
        return None, repr(obj)
    if c.kind == "value_contains":
        missing = [x for x in c.expected if x not in obj]
        if missing:
            return f"{c.target} lacks {', '.join(missing)}", repr(sorted(obj))
        return None, repr(sorted(obj))
    if c.kind == "attribute":
        if not hasattr(obj, c.expected):
            return f"{c.target} has no attribute {c.expected!r}", ""
        return None, repr(getattr(obj, c.expected))
    if c.kind == "class":
        if isinstance(obj, property) and obj.fget is not None:
            return None, _source(obj.fget)
        if not isinstance(obj, type):
            return f"{c.target} is neither a class nor a property", type(obj).__name__
        return None, _source(obj)
    if not callable(obj):
        return f"{c.target} is not callable", repr(obj)
    text = f"{c.target}{inspect.signature(obj)}\n{_source(obj)}"
    if c.params:
        have = _params(obj)
        if have[: len(c.params)] != list(c.params):
            return (
                f"{c.target} takes ({', '.join(have)}), expected leading parameters "
                f"({', '.join(c.params)})"
            ), text
    if c.is_async is not None and inspect.iscoroutinefunction(obj) != c.is_async:
        return f"{c.target} is {'not ' if c.is_async else ''}a coroutine function", text
    if c.kind == "source":
        src = _source(obj)
        missing = [s for s in c.expected if s not in src]
        if missing:
            return f"{c.target} no longer contains {', '.join(repr(m) for m in missing)}", text
        present = [s for s in c.absent if s in src]
        if present:
            return f"{c.target} contains {', '.join(repr(m) for m in present)}", text
    return None, text


@attrs.frozen
class Report:
    """What `check()` found: unmet contracts, the digest, and the variant in use of each met
    contract (by contract key)."""

    problems: tuple[tuple[str, str], ...]
    digest: str
    in_use: dict[str, Contract]

    def variants(self) -> dict[str, str]:
        """contract key -> "<seen_in>:<variant>" of the variant in use."""
        return {k: f"{c.seen_in}:{c.variant}" for k, c in self.in_use.items()}


# The variants in use of the SGLang build this process last checked against CONTRACTS.
_CHECKED: dict[str, Contract] | None = None


def _requirement_problem(alt: Contract, in_use: dict[str, Contract]) -> str | None:
    """A variant that only holds together with another contract's variant (checked earlier in
    the table) is unmet when that one is not in use."""
    for key, variant in alt.requires:
        have = in_use.get(key)
        if have is None or have.variant != variant:
            found = "no variant" if have is None else f"variant {have.variant!r}"
            return f"{alt.target}: needs {key} met by variant {variant!r}, found {found}"
    return None


def _label(c: Contract) -> str:
    return f"variant {c.variant!r} (seen in {c.seen_in})"


def report(contracts: Iterable[Contract] = CONTRACTS) -> Report:
    """Checks every contract, picking per contract the first variant the running build meets."""
    global _CHECKED
    contracts = tuple(contracts)
    problems: list[tuple[str, str]] = []
    in_use: dict[str, Contract] = {}
    h = hashlib.sha256()
    for c in contracts:
        misses: list[tuple[Contract, str]] = []
        for alt in c.alternatives():
            problem, text = _check_one(alt)
            if problem is None:
                problem = _requirement_problem(alt, in_use)
            if problem is None:
                in_use[c.key] = alt
                h.update(
                    f"{c.group}\0{c.key}\0{alt.seen_in}:{alt.variant}\0{alt.target}\0{text}\0".encode()
                )
                break
            misses.append((alt, problem))
        else:
            h.update(f"{c.group}\0{c.key}\0unmet\0".encode())
            if len(misses) == 1:
                problems.append((c.group, misses[0][1]))
            else:
                problems.append(
                    (
                        c.group,
                        f"{c.key}: no variant met: "
                        + "; ".join(f"{_label(alt)}: {m}" for alt, m in misses),
                    )
                )
    ep_problem = _entry_point_problem()
    if ep_problem:
        problems.append(("entry-point group", ep_problem))
    if contracts is CONTRACTS:
        _CHECKED = dict(in_use)
    return Report(tuple(problems), "sha256:" + h.hexdigest(), in_use)


def check(contracts: Iterable[Contract] = CONTRACTS) -> tuple[list[tuple[str, str]], str]:
    """Checks every contract; returns (problems as (group, message), source-contract digest)."""
    found = report(contracts)
    return list(found.problems), found.digest


def variant_in_use(key: str) -> str:
    """The name of the variant of contract `key` (its first target) the running build meets;
    checks the installed SGLang first if this process has not. Raises ContractError when no
    variant of it is met."""
    if _CHECKED is None:
        report()
    assert _CHECKED is not None
    if key not in _CHECKED:
        found = report()
        if key not in found.in_use:
            raise ContractError([(g, m) for g, m in found.problems if key in m] or [(key, "unmet")])
        return found.in_use[key].variant
    return _CHECKED[key].variant


def _entry_point_problem() -> str | None:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT_NAME]
    if not found:
        return (
            f"no entry point {ENTRY_POINT_NAME!r} in group {ENTRY_POINT_GROUP!r} "
            "(is coldsnap installed?)"
        )
    if found[0].value != "coldsnap.plugin:register":
        return f"entry point {ENTRY_POINT_NAME!r} points at {found[0].value!r}"
    return None


def admit(contracts: Iterable[Contract] = CONTRACTS) -> str:
    """Raises ContractError naming every unmet contract; returns the digest."""
    problems, digest = check(contracts)
    if problems:
        raise ContractError(problems)
    return digest


def digest() -> str:
    """The contract digest of the installed SGLang (it names the variant in use of each
    contract)."""
    return check()[1]


def variants_checked() -> dict[str, str] | None:
    """contract key -> "<seen_in>:<variant>" of the build this process last checked, or None."""
    if _CHECKED is None:
        return None
    return {k: f"{c.seen_in}:{c.variant}" for k, c in _CHECKED.items()}


def contract_files(contracts: Iterable[Contract] = CONTRACTS) -> list[str]:
    """The source files the contracts are read from: for every variant whose target resolves,
    the files of the packages and module its dotted path is looked up through, and of the
    module its object is defined in (a re-export, an inherited method). What the engine adapter
    hashes at capture, so that a restore checks the installed build by those files instead of
    importing SGLang. Resolves only what a check here imported already; run it after
    `check()`."""
    import sys

    files: set[str] = set()
    for c in contracts:
        for alt in c.alternatives():
            module_path = alt.target.rpartition(".")[0]
            try:
                owner = pkgutil.resolve_name(module_path)
                obj = _unwrap(_resolve(alt.target))
            except (ImportError, AttributeError, ValueError, LookupError):
                continue  # an absent variant: nothing of it is read
            parts = alt.target.split(".")
            chain = [sys.modules.get(".".join(parts[:n])) for n in range(1, len(parts))]
            for thing in (
                *(m for m in chain if m is not None),
                owner,
                obj,
                getattr(obj, "fget", None),
            ):
                module_of = thing if inspect.ismodule(thing) else None
                name = module_of.__name__ if module_of else getattr(thing, "__module__", None)
                module = sys.modules.get(name) if isinstance(name, str) else None
                path = getattr(module, "__file__", None)
                if path:
                    files.add(path)
    return sorted(files)


def plugin_files() -> list[str]:
    """The plugin's own source files, which `plugin_digest()` hashes."""
    from pathlib import Path

    return [str(p) for p in sorted(Path(__file__).resolve().parent.glob("*.py"))]


def plugin_digest() -> str:
    """sha256 over this plugin's own source files (name and bytes) and the contract variants in
    use of the SGLang build this process checked (`digest()`, `check()` or `admit()` ran here:
    the engine adapter's build takes both in one go, coldsnap.engines.sglang), for the artifact
    identity. A process that never checked an SGLang build gets the digest of the files alone."""
    from pathlib import Path

    h = hashlib.sha256()
    for path in map(Path, plugin_files()):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    in_use = variants_checked()
    if in_use is not None:
        h.update(b"variants\0")
        for key in sorted(in_use):
            h.update(f"{key}\0{in_use[key]}\0".encode())
    return "sha256:" + h.hexdigest()


def describe() -> list[dict[str, Any]]:
    """One row per contract and variant, for docs/plugin.md."""
    return [
        {
            "group": c.group,
            "target": alt.target,
            "kind": alt.kind,
            "runtime_on_cpu": c.runtime_on_cpu,
            "seen_in": alt.seen_in,
            "variant": alt.variant,
        }
        for c in CONTRACTS
        for alt in c.alternatives()
    ]
