"""Speculative decoding on fakes (no draft-model algorithm runs on CPU: the e2e module says
why): a request names its draft, the capsule binds it, the launcher hands it to the engine, a
recovery plan carries the draft's own pinned checkpoint, and the plugin exports, hydrates and
reloads the draft like the target. Also the request's async decode graphs (CUDA only)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import torch
from safetensors.torch import save_file

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import ResumePlan, read_plan
from coldsnap.artifacts import record_digest
from coldsnap.capsules import StoreArtifacts
from coldsnap.capsules._steps import _draft_differences
from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher
from coldsnap.engines.sglang import _steps as engine_steps
from coldsnap.machine import (
    REGISTRY,
    CaptureRequest,
    InstalledBuild,
    ModelRef,
    RequestError,
    RestoreRequest,
    WeightSource,
)
from coldsnap.machine import steps as s
from coldsnap.plugin import Settings, StatusFile, StorageRegistry
from coldsnap.providers._errors import CheckpointError
from coldsnap.providers._steps import RecoveryProvider


def checkpoint(path: Path, seed: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    save_file({"w": torch.randn(4, 4, generator=gen)}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    return path


@pytest.fixture
def models(tmp_path: Path) -> SimpleNamespace:
    target = ModelRef(id="org/target", revision="t1", path=str(checkpoint(tmp_path / "t", 0)))
    draft = ModelRef(id="org/draft", revision="d1", path=str(checkpoint(tmp_path / "d", 1)))
    return SimpleNamespace(target=target, draft=draft, root=tmp_path)


def capture(models: SimpleNamespace, **kw: Any) -> CaptureRequest:
    return CaptureRequest(
        driver="n610",
        provider="recovery",
        model=models.target,
        workdir=str(models.root / "cap"),
        store=str(models.root / "store"),
        **kw,
    )


def _checkpoint(models: SimpleNamespace) -> WeightSource:
    return WeightSource(source="checkpoint", checkpoint=models.target.path)


def _payload(models: SimpleNamespace) -> WeightSource:
    return WeightSource(source="payload", payload_dir=str(models.root / "payload"))


# -- the request -----------------------------------------------------------------------------------


def test_a_request_names_its_draft_strictly(models: SimpleNamespace) -> None:
    assert capture(models, draft=models.draft).draft == models.draft
    with pytest.raises(RequestError) as err:
        capture(models, draft=ModelRef(id="org/draft", revision="", path="relative"))
    fields = [f for f, _ in err.value.problems]
    assert "draft.revision" in fields and "draft.path" in fields
    with pytest.raises(RequestError, match=r"engine_args.*in the field 'draft'"):
        REGISTRY.check(capture(models, engine_args=("--speculative-draft-model-path=/m/d",)))
    restore = RestoreRequest(
        driver="n580",
        provider="recovery",
        artifact="tiny",
        workdir=str(models.root / "res"),
        store=str(models.root / "store"),
        model=models.target,
        draft=models.draft,
        async_cuda_graphs=True,
    )
    assert restore.draft == models.draft and restore.async_cuda_graphs
    # a driver that resumes the captured process keeps the capture's setting: the registry refuses
    with pytest.raises(RequestError, match="'async_cuda_graphs': driver 'n610' resumes"):
        REGISTRY.check(attrs.evolve(restore, driver="n610"))


def test_the_launcher_hands_the_engine_its_draft_and_the_requests_graph_settings(
    models: SimpleNamespace,
) -> None:
    launcher = SGLangLauncher()
    plain = launcher.command(capture(models), models.root, weights=_checkpoint(models))
    assert "--speculative-draft-model-path" not in plain.argv
    assert plain.env["COLDSNAP_ASYNC_CUDA_GRAPHS"] == "0"  # stated: never inherited
    assert plain.env["COLDSNAP_SHAPE_CALIBRATION"] == "record"  # every capture publishes shapes
    spec = launcher.command(
        capture(models, draft=models.draft, async_cuda_graphs=True, engine_args=("--x",)),
        models.root,
        weights=_checkpoint(models),
    )
    i = spec.argv.index("--speculative-draft-model-path")
    assert spec.argv[i + 1] == models.draft.path
    assert spec.env["COLDSNAP_ASYNC_CUDA_GRAPHS"] == "1"
    restore = SimpleNamespace(
        operation="restore", model=models.target, draft=models.draft, tp=None, engine_args=()
    )
    native = launcher.command(restore, models.root, weights=_payload(models))
    assert "--speculative-draft-model-path" in native.argv  # loads dummy weights like the target
    assert native.argv[native.argv.index("--load-format") + 1] == "dummy"
    assert native.env["COLDSNAP_SHAPE_CALIBRATION"] == "off"


# -- the capsule's identity and admission ----------------------------------------------------------


def engine() -> SGLangEngine:
    return SGLangEngine(
        SGLangLauncher(),
        identity=lambda: InstalledBuild(
            engine="sglang",
            version="0.5.23",
            contract="sha256:" + "0" * 64,
            plugin_digest="sha256:" + "0" * 64,
        ),
    )


def test_the_capsule_binds_the_draft_model(models: SimpleNamespace) -> None:
    store = StoreArtifacts(engine())
    plain = store._identity(SimpleNamespace(request=capture(models), facts={}), [])
    ctx = SimpleNamespace(request=capture(models, draft=models.draft), facts={})
    spec = store._identity(ctx, [])
    assert plain.draft is None and spec.draft is not None
    assert (spec.draft.model_id, spec.draft.revision) == ("org/draft", "d1")
    assert [f.name for f in spec.draft.checkpoint] == ["config.json", "model.safetensors"]
    assert spec.draft.dtype == "float32"
    assert spec.model == plain.model and record_digest(spec) != record_digest(plain)


def test_a_restore_naming_another_draft_is_refused_by_field(models: SimpleNamespace) -> None:
    captured = (
        StoreArtifacts(engine())
        ._identity(SimpleNamespace(request=capture(models, draft=models.draft), facts={}), [])
        .draft
    )
    assert _draft_differences(captured, None) == []  # n610 holds the captured draft
    assert _draft_differences(captured, models.draft) == []
    other = ModelRef(id="org/other", revision="d2", path=models.draft.path)
    assert [str(d) for d in _draft_differences(captured, other)] == [
        "draft.id: expected org/draft, found org/other",
        "draft.revision: expected d1, found d2",
    ]
    assert [str(d) for d in _draft_differences(None, models.draft)] == [
        "draft: expected none, found org/draft@d1"
    ]


# -- the recovery plan: the draft's own pinned checkpoint ------------------------------------------


def pins(path: str) -> dict[str, str]:
    from coldsnap.artifacts import checkpoint_digests

    return {f.name: f.sha256 for f in checkpoint_digests(path)}


def stage(request: Any, draft_pins: dict[str, str]) -> dict[str, Any]:
    facts = {
        s.CAPSULE_CHECKPOINT.name: pins(request.model.path),
        s.CAPSULE_DRAFT_CHECKPOINT.name: draft_pins,
    }
    return RecoveryProvider().stage(SimpleNamespace(request=request, facts=facts))


def restore(models: SimpleNamespace, draft: ModelRef | None) -> RestoreRequest:
    return RestoreRequest(
        driver="n610",
        provider="recovery",
        artifact="tiny",
        workdir=str(models.root / "res"),
        store=str(models.root / "store"),
        model=models.target,
        draft=draft,
    )


def test_recovery_stages_the_drafts_pinned_checkpoint_into_the_source(
    models: SimpleNamespace,
) -> None:
    made = stage(restore(models, models.draft), pins(models.draft.path))
    assert made[s.WEIGHT_SOURCE.name] == {
        "source": "checkpoint",
        "payload_dir": None,
        "preverified": False,
        "checkpoint": models.target.path,
        "draft_checkpoint": models.draft.path,
    }
    assert made[s.CHECKPOINT_FILES.name] == 4
    assert stage(restore(models, None), {})[s.WEIGHT_SOURCE.name]["draft_checkpoint"] is None


def test_recovery_refuses_a_missing_or_changed_draft(models: SimpleNamespace) -> None:
    draft_pins = pins(models.draft.path)
    with pytest.raises(CheckpointError, match="draft"):
        stage(restore(models, None), draft_pins)
    checkpoint(Path(models.draft.path), seed=7)  # other weights at the same path
    with pytest.raises(CheckpointError, match=r"draft\.path .*not the pinned checkpoint"):
        stage(restore(models, models.draft), draft_pins)


def test_the_resume_plan_carries_the_draft_checkpoint(
    models: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    runtime = models.root / "run"
    runtime.mkdir()
    calls: list[str] = []
    transport = httpx.MockTransport(
        lambda r: calls.append(r.url.path) or httpx.Response(200, json={"success": True})
    )
    adapter = SGLangEngine(SGLangLauncher(), transport=transport)
    source = stage(restore(models, models.draft), pins(models.draft.path))[s.WEIGHT_SOURCE.name]
    facts = {
        s.ENGINE_URL.name: "http://engine",
        s.RUNTIME_DIR.name: str(runtime),
        s.WEIGHT_SOURCE.name: source,
        s.ENGINE_PID.name: 1,
    }
    adapter.resume_weights(SimpleNamespace(facts=facts, request=restore(models, models.draft)))
    assert read_plan(runtime).draft_checkpoint == models.draft.path
    # The capture's compensation reloads the draft from its own path too.
    monkeypatch.setattr(engine_steps, "running", lambda pid: True)
    ctx = SimpleNamespace(facts=facts, request=capture(models, draft=models.draft))
    adapter.resume_memory(ctx)
    plan = read_plan(runtime)
    assert (plan.checkpoint, plan.draft_checkpoint) == (models.target.path, models.draft.path)


# -- the plugin: target and draft exported, staged and hydrated alike ------------------------------


def hooks(tmp_path: Path, registry: StorageRegistry, **settings: Any) -> sched.SchedulerHooks:
    s_ = Settings(mode="capture", runtime_dir=tmp_path, **settings)
    return sched.SchedulerHooks(s_, StatusFile(tmp_path, "scheduler-tp0", {}), registry)


def two_models() -> tuple[StorageRegistry, torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    target, draft = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    registry = StorageRegistry()
    registry.register("target", target)
    registry.register("draft", draft)
    return registry, target, draft


def test_native_exports_stages_and_hydrates_the_draft_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sched, "_tp_rank", lambda group=None: 0)
    registry, target, draft = two_models()
    art = tmp_path / "art"
    h = hooks(tmp_path, registry, export_model_payload=True, artifact_dir=art)
    exports = h._before_release(["weights"], None, "op1")
    assert exports is not None and {"target", "draft"} <= set(exports)
    root = Path(exports["root"])
    assert (root / "tp0" / "draft" / "index.json").is_file()
    want = {n: p.detach().clone() for n, p in draft.named_parameters()}
    with torch.no_grad():
        for p in [*target.parameters(), *draft.parameters()]:
            p.zero_()
    staged = h._stage(ResumePlan(source="payload", payload_dir=str(root)), 0)
    assert set(staged["sources"]) == {"target", "draft"}
    from coldsnap.plugin import _payload

    _payload.hydrate(draft, staged["sources"]["draft"])
    assert all(torch.equal(p, want[n]) for n, p in draft.named_parameters())


def test_recovery_refuses_a_plan_without_the_drafts_checkpoint(
    models: SimpleNamespace,
) -> None:
    registry, _, _ = two_models()
    h = hooks(models.root / "run", registry)
    plan = ResumePlan(source="checkpoint", checkpoint=models.target.path)
    with pytest.raises(RuntimeError, match="names no checkpoint for the draft model"):
        h._stage(plan, 0)
    plan = ResumePlan(
        source="checkpoint", checkpoint=models.target.path, draft_checkpoint=models.draft.path
    )
    assert h._stage(plan, 0)["sources"] == {}


def test_an_identity_with_a_draft_and_shapes_round_trips_and_diffs_by_field(
    models: SimpleNamespace,
) -> None:
    import attrs

    from coldsnap.artifacts import (
        Identity,
        PhaseCoverage,
        ShapeCoverage,
        diff_identities,
        from_json,
        to_json,
    )

    store = StoreArtifacts(engine())
    ctx = SimpleNamespace(request=capture(models, draft=models.draft), facts={})
    shapes = ShapeCoverage("cuda", PhaseCoverage("full", [4, 1]), PhaseCoverage("disabled", []))
    spec = attrs.evolve(store._identity(ctx, []), shapes=shapes)
    assert from_json(to_json(spec), Identity) == spec
    assert spec.shapes is not None and spec.shapes.decode.shapes == (1, 4)
    plain = store._identity(SimpleNamespace(request=capture(models), facts={}), [])
    fields = {d.field for d in diff_identities(spec, plain)}
    assert {"draft.model_id", "draft.revision", "shapes.decode.shapes"} <= fields
