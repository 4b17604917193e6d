"""Shape calibration: SGLang's own graph plan for a runner (decode batch sizes and prefill token
counts), the shapes its graph runners really captured, and the coverage the plugin publishes.

The plan comes from SGLang's functions (contracts "cuda graphs"); the warmed shapes are read
from the graph runners SGLang built, never from the plan, so a capture that warmed less than
planned (a batch size clamped away, a phase SGLang chose to run eagerly) is seen. `calibrate`
never raises: an unrecognised plan or warmed != plan is a failed record that the orchestrator
turns into a failed step (the SGLang hook that runs it must not crash the scheduler).
"""

from __future__ import annotations

from typing import Any

from coldsnap._errors import PluginError

from ._contracts import variant_in_use

DECODE, PREFILL = "decode", "prefill"
PHASES = (DECODE, PREFILL)
PREFILL_TOKENS_CONTRACT = (
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.get_prefill_num_tokens_to_capture"
)
# What SGLang's calls may raise when the build or the runner is not what the plan expects.
_SGLANG_ERRORS = (ImportError, AttributeError, AssertionError, LookupError, TypeError, ValueError)


class ShapeCalibrationError(PluginError, RuntimeError):
    """The graph plan is unrecognised, or the warmed shapes differ from it."""


def graph_plan(runner: Any) -> dict[str, dict[str, Any]]:
    """phase -> {backend, shapes}: what SGLang plans to capture for this runner."""
    try:
        return {DECODE: _decode_plan(runner), PREFILL: _prefill_plan(runner)}
    except _SGLANG_ERRORS as exc:
        raise ShapeCalibrationError(
            f"SGLang's graph plan cannot be read: {type(exc).__name__}: {exc}"
        ) from None


def _decode_plan(runner: Any) -> dict[str, Any]:
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
    from sglang.srt.runtime_context import get_flags

    if runner.device == "cpu":
        if not get_flags().capture.enable_torch_compile:
            return {"backend": "disabled", "shapes": []}
        from sglang.srt.model_executor.cpu_graph_runner import get_batch_sizes_to_capture as cpu_bs

        return {"backend": "cpu_graph", "shapes": _sizes(cpu_bs(runner), "decode")}
    if check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED):
        return {"backend": "disabled", "shapes": []}
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
    from sglang.srt.runtime_context import get_exec

    spec = getattr(runner, "spec_algorithm", None)
    width = runner.decode_num_tokens_per_req() if spec is not None and spec.is_speculative() else 1
    planned = get_batch_sizes_to_capture(runner, width)
    if not (isinstance(planned, tuple) and len(planned) == 2):
        raise ShapeCalibrationError(f"unrecognised decode batch-size plan {planned!r}")
    backend = get_exec().graph.cuda_graph_config.decode.backend
    return {"backend": str(backend), "shapes": _sizes(planned[0], "decode")}


def _prefill_plan(runner: Any) -> dict[str, Any]:
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    if runner.device == "cpu" or check_cuda_graph_backend(Phase.PREFILL, Backend.DISABLED):
        return {"backend": "disabled", "shapes": []}  # SGLang graphs no prefill on CPU
    if variant_in_use(PREFILL_TOKENS_CONTRACT) == "sorted-tokens":
        # the runner reads the server arguments' config and captures its token counts, sorted
        config = runner.server_args.cuda_graph_config.prefill
        tokens = list(config.bs or [])
    else:  # aligned-tokens: the published config, each count aligned to the shard width
        from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
            get_prefill_num_tokens_to_capture,
        )
        from sglang.srt.runtime_context import get_exec

        config = get_exec().graph.cuda_graph_config.prefill
        tokens = get_prefill_num_tokens_to_capture(list(config.bs or []))
    return {"backend": str(config.backend), "shapes": _sizes(tokens, "prefill")}


def _sizes(values: Any, phase: str) -> list[int]:
    try:
        sizes = sorted(set(values))
    except TypeError:
        raise ShapeCalibrationError(f"unrecognised {phase} plan {values!r}") from None
    if not sizes or not all(type(v) is int and v > 0 for v in sizes):
        raise ShapeCalibrationError(f"unrecognised {phase} plan {values!r}")
    return sizes


def warmed_shapes(runner: Any) -> dict[str, list[int]]:
    """phase -> the shapes the runner's graph runners captured (none for an eager phase)."""
    eager = getattr(runner, "eager_runner", None)
    observed: dict[str, list[int]] = {}
    for phase, attr, shapes in (
        (DECODE, "decode_cuda_graph_runner", "capture_bs"),
        (PREFILL, "prefill_cuda_graph_runner", "capture_num_tokens"),
    ):
        graphs = getattr(runner, attr, None)
        if graphs is None or graphs is eager:
            observed[phase] = []
            continue
        captured = getattr(graphs, shapes, None)
        if captured is None:
            raise ShapeCalibrationError(
                f"the {phase} graph runner {type(graphs).__name__} names no {shapes}"
            )
        observed[phase] = sorted({int(b) for b in captured})
    return observed


def calibrate(runner: Any) -> dict[str, Any]:
    """The calibration record of `runner`: plan, warmed shapes, outcome (ok or failed, with the
    error) and, when ok, the coverage."""
    record: dict[str, Any] = {"device": str(getattr(runner, "device", "unknown"))}
    try:
        plan = graph_plan(runner)
        warmed = warmed_shapes(runner)
        record["phases"] = {
            p: {"backend": plan[p]["backend"], "planned": plan[p]["shapes"], "warmed": warmed[p]}
            for p in PHASES
        }
        for p in PHASES:
            if warmed[p] != plan[p]["shapes"]:
                raise ShapeCalibrationError(
                    f"{p} graph plan {plan[p]['shapes']} (backend {plan[p]['backend']}) differs "
                    f"from the warmed shapes {warmed[p]}"
                )
        record["coverage"] = coverage_of(record)
    except ShapeCalibrationError as exc:
        return {**record, "outcome": "failed", "error": str(exc)}
    return {**record, "outcome": "ok", "error": None}


def coverage_of(record: dict[str, Any]) -> dict[str, Any]:
    """What a capsule binds: the device and, per phase, the backend and the warmed shapes."""
    phases = record["phases"]
    return {
        "device": record["device"],
        **{p: {"backend": phases[p]["backend"], "shapes": phases[p]["warmed"]} for p in PHASES},
    }


__all__ = [
    "DECODE",
    "PHASES",
    "PREFILL",
    "PREFILL_TOKENS_CONTRACT",
    "ShapeCalibrationError",
    "calibrate",
    "coverage_of",
    "graph_plan",
    "warmed_shapes",
]
