"""With `keep_residual` (COLDSNAP_KEEP_RESIDUAL, on by default), a recovery resume puts back
what the checkpoint does not hold BEFORE SGLang's reload, whose post-load processing runs in
the same call right after loading: that processing sees those tensors as a cold start's does,
not as the release left them. The fake reload below stands for SGLang's: it writes what the
checkpoint names and then, as post-load processing would, reads a buffer it does not load."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch
from safetensors.torch import load_file, save_file

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import CHECKPOINT_SOURCE, ResumePlan
from coldsnap.plugin import Settings, StatusFile, StorageRegistry, _payload

PAGE_FLOATS = 4096  # whole pages, as a release returns them


class Model(torch.nn.Module):
    """A checkpointed weight and a non-persistent buffer (a rotary cache's kind)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(PAGE_FLOATS), requires_grad=False)
        self.register_buffer("cos_sin_cache", torch.rand(PAGE_FLOATS), persistent=False)


class ResumeRequest(msgspec.Struct):
    """SGLang's resume request as the hooks handle it (a msgspec struct with tags), without
    importing SGLang."""

    tags: list[str]
    rid: str


class Reload:
    """SGLang's update_weights_from_disk for one runner: loads the checkpoint's tensors in
    place, then post-processes, which here records the buffer as it finds it."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.seen_by_postprocess: torch.Tensor | None = None

    def update_weights_from_disk(self, path: str, load_format: str) -> tuple[bool, str]:
        loaded = load_file(str(Path(path) / "model.safetensors"))
        with torch.no_grad():
            self.model.weight.copy_(loaded["weight"])
        self.seen_by_postprocess = self.model.cos_sin_cache.clone()
        return True, "ok"


def test_recovery_restores_the_residual_before_sglangs_post_load_processing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Model()
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    save_file({"weight": model.weight.detach().clone()}, str(checkpoint / "model.safetensors"))
    weight, cache = model.weight.detach().clone(), model.cos_sin_cache.detach().clone()

    registry = StorageRegistry()
    registry.register("target", model)
    reload = Reload(model)
    runner = SimpleNamespace(
        is_draft_worker=False,
        model_config=SimpleNamespace(model_path=str(checkpoint)),
        weight_updater=reload,
    )
    mgr = SimpleNamespace(_select_runners=lambda selector: [("target", runner)])
    monkeypatch.setattr(sched, "variant_in_use", lambda key: "selector")
    settings = Settings(mode="capture", runtime_dir=tmp_path, keep_residual=True)
    hooks = sched.SchedulerHooks(settings, StatusFile(tmp_path, "scheduler-tp0", {}), registry)

    # The release: the residual is kept while the model is intact, then its pages read zero.
    hooks.residuals = {"target": _payload.keep_residual("target", model, str(checkpoint))}
    assert "cos_sin_cache" in hooks.residuals["target"].copies
    assert "weight" not in hooks.residuals["target"].copies  # the checkpoint holds it
    with torch.no_grad():
        model.weight.zero_()
        model.cos_sin_cache.zero_()

    resumed: list[list[str]] = []

    def sglang_resume(mgr: Any, req: Any) -> None:
        resumed.append(list(req.tags))

    plan = ResumePlan(source=CHECKPOINT_SOURCE, checkpoint=str(checkpoint))
    staged: dict[str, Any] = {"nccl": None}
    request = ResumeRequest(tags=["weights", "kv_cache"], rid="op1")
    detail = hooks._resume_with(
        plan, staged, sglang_resume, mgr, request, ["weights", "kv_cache"], (), {}
    )

    assert reload.seen_by_postprocess is not None
    assert torch.equal(reload.seen_by_postprocess, cache)  # in place before post-processing
    assert torch.equal(model.cos_sin_cache, cache) and torch.equal(model.weight, weight)
    assert resumed == [["weights"], ["kv_cache"]]  # the second phase after the reload
    assert detail["loaded"] == {"target": str(checkpoint)}
    assert detail["residual"]["target"]["tensors"] == 1
