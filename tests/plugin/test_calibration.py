"""Shape calibration on fakes (coldsnap.plugin._shapes): SGLang's own decode and prefill plan,
the shapes the graph runners really captured, and a failure that is a record, never a raise."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import coldsnap.plugin._scheduler as sched
from coldsnap.artifacts import Identity, ShapeCoverage, from_json, to_json
from coldsnap.plugin import Settings, StatusFile, StorageRegistry, _shapes

EAGER = object()
PLAN = {
    "decode": {"backend": "full", "shapes": [1, 2, 4, 8]},
    "prefill": {"backend": "breakable", "shapes": [256, 512]},
}


def runner(decode: Any = None, prefill: Any = EAGER, device: str = "cuda") -> Any:
    """A model runner after SGLang's graph capture: its decode and prefill graph runners."""
    return SimpleNamespace(
        device=device,
        is_draft_worker=False,
        eager_runner=EAGER,
        decode_cuda_graph_runner=decode,
        prefill_cuda_graph_runner=prefill,
    )


def warm(decode: list[int], prefill: list[int]) -> Any:
    return runner(
        SimpleNamespace(capture_bs=list(reversed(decode))),
        SimpleNamespace(capture_num_tokens=prefill) if prefill else EAGER,
    )


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    plan = json.loads(json.dumps(PLAN))
    monkeypatch.setattr(_shapes, "graph_plan", lambda r: json.loads(json.dumps(plan)))
    return plan


def test_warmed_shapes_are_read_from_the_graph_runners_not_the_plan() -> None:
    assert _shapes.warmed_shapes(warm([1, 2, 4], [512, 256])) == {
        "decode": [1, 2, 4],
        "prefill": [256, 512],
    }
    assert _shapes.warmed_shapes(runner()) == {"decode": [], "prefill": []}  # both eager


def test_a_graph_runner_that_names_no_shapes_cannot_be_calibrated() -> None:
    with pytest.raises(_shapes.ShapeCalibrationError, match=r"decode graph runner .* capture_bs"):
        _shapes.warmed_shapes(runner(decode=SimpleNamespace()))


def test_warmed_equal_to_the_plan_publishes_the_coverage(planned: dict[str, Any]) -> None:
    record = _shapes.calibrate(warm([1, 2, 4, 8], [256, 512]))
    assert record["outcome"] == "ok" and record["error"] is None
    assert record["phases"]["prefill"] == {
        "backend": "breakable",
        "planned": [256, 512],
        "warmed": [256, 512],
    }
    assert record["coverage"] == {
        "device": "cuda",
        "decode": {"backend": "full", "shapes": [1, 2, 4, 8]},
        "prefill": {"backend": "breakable", "shapes": [256, 512]},
    }


@pytest.mark.parametrize(
    ("decode", "prefill", "phase"),
    [([1, 2, 4], [256, 512], "decode"), ([1, 2, 4, 8], [], "prefill")],
)
def test_warming_less_than_the_plan_is_a_failed_record_not_a_raise(
    planned: dict[str, Any], decode: list[int], prefill: list[int], phase: str
) -> None:
    record = _shapes.calibrate(warm(decode, prefill))
    assert record["outcome"] == "failed" and "coverage" not in record
    assert record["error"].startswith(f"{phase} graph plan {PLAN[phase]['shapes']}")


# -- SGLang's own functions (patched where they need a published config or a GPU) -----------------


def _config(**prefill: Any) -> Any:
    phases = {"decode": SimpleNamespace(backend="full"), "prefill": SimpleNamespace(**prefill)}
    return SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(**phases)))


@pytest.fixture
def sglang(sglang_cpu: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    import sglang.srt.model_executor.cuda_graph_config as cfg
    import sglang.srt.model_executor.runner.base_cuda_graph_runner as base
    import sglang.srt.model_executor.runner.prefill_cuda_graph_runner as prefill
    import sglang.srt.runtime_context as ctx

    disabled: set[str] = set()
    monkeypatch.setattr(cfg, "check_cuda_graph_backend", lambda p, b: p in disabled)
    monkeypatch.setattr(base, "get_batch_sizes_to_capture", lambda r, w: ([8, 1, 4, 2], [1]))

    def aligned(capture_tokens: list[int]) -> list[int]:  # the contract's parameter name
        return sorted(set(capture_tokens))

    sched.variant_in_use(_shapes.PREFILL_TOKENS_CONTRACT)  # checked before it is patched
    monkeypatch.setattr(prefill, "get_prefill_num_tokens_to_capture", aligned)
    monkeypatch.setattr(ctx, "get_exec", lambda: _config(backend="breakable", bs=[512, 256]))
    return SimpleNamespace(disabled=disabled, base=base, ctx=ctx)


def test_the_plan_covers_decode_and_prefill_from_sglangs_functions(sglang: Any) -> None:
    assert _shapes.graph_plan(runner()) == PLAN
    sglang.disabled.add("prefill")
    assert _shapes.graph_plan(runner())["prefill"] == {"backend": "disabled", "shapes": []}


def test_on_cpu_without_torch_compile_nothing_is_planned(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = SimpleNamespace(capture=SimpleNamespace(enable_torch_compile=False))
    monkeypatch.setattr(sglang.ctx, "get_flags", lambda: flags)
    assert _shapes.graph_plan(runner(device="cpu")) == {
        "decode": {"backend": "disabled", "shapes": []},
        "prefill": {"backend": "disabled", "shapes": []},
    }


@pytest.mark.parametrize("plan", [[1, 2], ([0, 1], [1]), ([], []), (["1"], [])])
def test_an_unrecognised_decode_plan_fails_calibration(
    sglang: Any, monkeypatch: pytest.MonkeyPatch, plan: Any
) -> None:
    monkeypatch.setattr(sglang.base, "get_batch_sizes_to_capture", lambda r, w: plan)
    record = _shapes.calibrate(warm([1, 2], []))
    assert record["outcome"] == "failed" and "unrecognised decode" in record["error"]


def test_a_plan_sglang_cannot_give_fails_calibration_naming_the_cause(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unpublished() -> Any:
        raise ValueError("exec config is not published")

    monkeypatch.setattr(sglang.ctx, "get_exec", unpublished)
    record = _shapes.calibrate(warm([1, 2], []))
    assert record["outcome"] == "failed"
    assert record["error"] == (
        "SGLang's graph plan cannot be read: ValueError: exec config is not published"
    )


# -- the hook: published in the status record and shape-plan.json; never raised into SGLang --------


def hooks(tmp_path: Path, **settings: Any) -> sched.SchedulerHooks:
    s = Settings(mode="capture", runtime_dir=tmp_path, **settings)
    return sched.SchedulerHooks(s, StatusFile(tmp_path, "scheduler-tp0", {}), StorageRegistry())


def test_the_hook_publishes_the_calibration(tmp_path: Path, planned: dict[str, Any]) -> None:
    h = hooks(tmp_path, shape_calibration="record")
    r = warm([1, 2, 4, 8], [256, 512])
    h.around_init_cuda_graphs(lambda runner, capture_decode_cuda_graph: None, r)
    published = json.loads((tmp_path / "sglang" / "scheduler-tp0.json").read_text())
    assert published["shape_calibration"]["outcome"] == "ok"
    assert published["events"][-1]["event"] == "shape_calibrated"
    plan_file = json.loads((tmp_path / "shape-plan.json").read_text())
    assert (plan_file["kind"], plan_file["format"]) == ("coldsnap.sglang.shape-plan", 2)
    assert plan_file["coverage"] == published["shape_calibration"]["coverage"]


def test_a_failed_calibration_is_recorded_and_the_hook_returns(
    tmp_path: Path, planned: dict[str, Any]
) -> None:
    h = hooks(tmp_path, shape_calibration="record")
    result = h.around_init_cuda_graphs(lambda r, capture_decode_cuda_graph: "graphs", warm([1], []))
    assert result == "graphs"  # SGLang's start-up goes on; the orchestrator fails the capture
    record = h.status.record["shape_calibration"]
    assert record["outcome"] == "failed" and "differs from the warmed shapes [1]" in record["error"]
    assert h.status.record["events"][-1]["event"] == "shape_calibration_failed"


def test_the_async_decode_capture_is_calibrated_at_idle(
    tmp_path: Path, planned: dict[str, Any]
) -> None:
    h = hooks(tmp_path, shape_calibration="record", async_cuda_graphs=True)
    r = warm([], [256, 512])

    def capture() -> None:
        r.decode_cuda_graph_runner = SimpleNamespace(capture_bs=[1, 2, 4, 8])

    r.init_decode_cuda_graph = capture
    h.around_init_cuda_graphs(lambda runner, capture_decode_cuda_graph: None, r)
    assert "shape_calibration" not in h.status.record  # nothing warmed yet: served eagerly
    scheduler = SimpleNamespace(
        forward_ct=1, is_fully_idle=lambda: True, tp_worker=SimpleNamespace(model_runner=r)
    )
    h.after_on_idle(None, scheduler)
    assert h.status.record["shape_calibration"]["outcome"] == "ok"


# -- the coverage in the capsule's identity --------------------------------------------------------


def test_the_coverage_is_a_strict_identity_record() -> None:
    coverage = _shapes.coverage_of(
        {
            "device": "cuda",
            "phases": {
                p: {"backend": v["backend"], "planned": v["shapes"], "warmed": v["shapes"]}
                for p, v in PLAN.items()
            },
        }
    )
    shapes = from_json(coverage, ShapeCoverage)
    assert shapes.decode.shapes == (1, 2, 4, 8) and shapes.prefill.backend == "breakable"
    assert from_json(to_json(shapes), ShapeCoverage) == shapes
    with pytest.raises(Exception, match="shapes"):
        from_json({**coverage, "decode": {"backend": "full", "shapes": [0]}}, ShapeCoverage)
    assert "shapes" in {a.name for a in Identity.__attrs_attrs__}
