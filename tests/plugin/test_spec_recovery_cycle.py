"""A release and a recovery resume of an engine serving a speculative draft, through the
scheduler hooks, on fakes shaped like SGLang 0.5.17 (no `_select_runners`: the target is
`tp_worker.model_runner`, the draft runners are the speculative worker's
`draft_worker.draft_runners`; each runner reloads through its own `weight_updater`). SGLang's
own release stashes the target's buffers only, so the draft's (its rotary cache) come back
through the plugin's residual; and each model reloads from its own checkpoint."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch
from safetensors.torch import load_file, save_file

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import CHECKPOINT_SOURCE, ResumePlan, write_plan
from coldsnap.plugin import Settings, StatusFile, StorageRegistry

FLOATS = 4096


class Model(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.rand(FLOATS, generator=gen), requires_grad=False)
        cache = torch.rand(FLOATS, generator=gen)
        self.register_buffer("cos_sin_cache", cache, persistent=False)


class Request(msgspec.Struct):
    """SGLang's release or resume request as the hooks handle it."""

    tags: list[str]
    rid: str


class Reload:
    """A runner's weight updater: loads its checkpoint in place, records the path and what
    its post-load processing found in the buffer."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.paths: list[str] = []
        self.buffer_seen: torch.Tensor | None = None

    def update_weights_from_disk(self, path: str, load_format: str) -> tuple[bool, str]:
        self.paths.append(path)
        with torch.no_grad():
            self.model.weight.copy_(load_file(str(Path(path) / "model.safetensors"))["weight"])
        self.buffer_seen = self.model.cos_sin_cache.clone()
        return True, "Succeeded to update model weights."


class Manager:
    """SGLang 0.5.17's SchedulerWeightUpdaterManager, as far as the hooks use it."""

    def __init__(self, target: Any, draft: Any) -> None:
        self.tp_worker = SimpleNamespace(model_runner=target)
        spec_worker = SimpleNamespace(draft_worker=SimpleNamespace(draft_runners=[draft]))
        self.draft_worker = spec_worker
        self.tp_cpu_group = None
        self.offload_tags: set[str] = set()
        self.calls: list[tuple[str, list[str]]] = []

    def release(self, mgr: Manager, req: Request) -> str:
        self.offload_tags |= set(req.tags)
        self.calls.append(("release", list(req.tags)))
        return "released"

    def resume(self, mgr: Manager, req: Request) -> None:
        self.offload_tags -= set(req.tags)
        self.calls.append(("resume", list(req.tags)))


def runner(model: Model, checkpoint: Path, *, draft: bool) -> SimpleNamespace:
    return SimpleNamespace(
        model=model,
        is_draft_worker=draft,
        draft_model_idx=None,
        model_config=SimpleNamespace(model_path=str(checkpoint)),
        weight_updater=Reload(model),
    )


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sched, "variant_in_use", lambda key: "tp-and-draft-worker")
    monkeypatch.setattr(sched, "_tp_group", lambda: None)
    monkeypatch.setattr(sched, "_tp_rank", lambda group=None: 0)
    monkeypatch.setattr(sched._nccl, "prepare", lambda group: None)
    monkeypatch.setattr(sched._nccl, "restore", lambda group: None)
    monkeypatch.setattr(sched, "_resume_output", lambda: "resume-output")


def test_target_and_draft_release_and_recover_each_from_its_own_path(
    tmp_path: Path, single_rank: None
) -> None:
    models, runners, want = {}, {}, {}
    for role, seed in (("target", 0), ("draft", 1)):
        model = Model(seed)
        ckpt = tmp_path / role
        ckpt.mkdir()
        save_file({"weight": model.weight.detach().clone()}, str(ckpt / "model.safetensors"))
        models[role] = model
        runners[role] = runner(model, ckpt, draft=role == "draft")
        want[role] = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
        want[role]["cos_sin_cache"] = model.cos_sin_cache.clone()
    registry = StorageRegistry()
    for role, model in models.items():
        registry.register(role, model)
    mgr = Manager(runners["target"], runners["draft"])
    settings = Settings(mode="capture", runtime_dir=tmp_path, keep_residual=True)
    status = StatusFile(tmp_path, "scheduler-tp0", {"role": "scheduler", "mode": "capture"})
    hooks = sched.SchedulerHooks(settings, status, registry)

    hooks.around_release(mgr.release, mgr, Request(tags=["kv_cache", "weights"], rid="rel"))
    assert status.record["outcome"] == "ok", status.record["error"]
    assert set(status.record["residual"]) == {"target", "draft"}
    with torch.no_grad():  # what the release leaves: the weights region reads zero
        for model in models.values():
            model.weight.zero_()
            model.cos_sin_cache.zero_()

    write_plan(
        tmp_path,
        ResumePlan(
            source=CHECKPOINT_SOURCE,
            checkpoint=str(tmp_path / "target"),
            draft_checkpoint=str(tmp_path / "draft"),
        ),
    )
    out = hooks.around_resume(mgr.resume, mgr, Request(tags=["weights", "kv_cache"], rid="res"))
    assert out == "resume-output"
    assert (status.record["outcome"], status.record["error"]) == ("ok", None)
    assert mgr.calls[1:] == [("resume", ["weights"]), ("resume", ["kv_cache"])]
    assert status.record["resume"]["loaded"] == {
        "target": str(tmp_path / "target"),
        "draft": str(tmp_path / "draft"),
    }
    for role, model in models.items():
        reload = runners[role].weight_updater
        assert reload.paths == [str(tmp_path / role)]
        assert reload.buffer_seen is not None
        assert torch.equal(reload.buffer_seen, want[role]["cos_sin_cache"])  # before reload
        assert torch.equal(model.weight, want[role]["weight"])
        assert torch.equal(model.cos_sin_cache, want[role]["cos_sin_cache"])
