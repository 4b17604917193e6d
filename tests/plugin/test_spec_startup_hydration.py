"""An engine built at restore from a payload (n580 native) with a speculative draft: SGLang
0.5.17 loads the target, then the draft (its own ModelRunner, `is_draft_worker`, with the
target's `--load-format dummy`), and the plugin's after-load hook hydrates each from its own
pack. The status record must keep what each role's hydration did, not only the last one's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import coldsnap.plugin._scheduler as sched
from coldsnap.plugin import Settings, StatusFile, StorageRegistry, _payload


def runner(model: torch.nn.Module, *, draft: bool) -> SimpleNamespace:
    """A ModelRunner as 0.5.17 builds it for STANDALONE: the draft's `draft_model_idx` is None
    and no overlapped start-up load is pending (`startup_weight_load` absent)."""
    return SimpleNamespace(model=model, is_draft_worker=draft, draft_model_idx=None)


def test_each_roles_startup_hydration_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sched, "_tp_rank", lambda group=None: 0)
    torch.manual_seed(0)
    target, draft = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    payload = tmp_path / "payload"
    _payload.export(target, _payload.pack_dir(payload, 0, "target"))
    _payload.export(draft, _payload.pack_dir(payload, 0, "draft"))
    want = {
        role: {n: p.detach().clone() for n, p in m.named_parameters()}
        for role, m in (("target", target), ("draft", draft))
    }
    with torch.no_grad():  # what a dummy load leaves: other values, same layout
        for p in [*target.parameters(), *draft.parameters()]:
            p.zero_()

    settings = Settings(
        mode="restore", runtime_dir=tmp_path, startup_source="payload", artifact_dir=payload
    )
    h = sched.SchedulerHooks(settings, StatusFile(tmp_path, "scheduler-tp0", {}), StorageRegistry())
    h.after_load_model(None, runner(target, draft=False))
    h.after_load_model(None, runner(draft, draft=True))

    hydration = h.status.record["startup_hydration"]
    assert set(hydration) == {"target", "draft"}
    assert hydration["target"]["nbytes"] > hydration["draft"]["nbytes"] > 0
    assert set(h.status.record["registered"]) == {"target", "draft"}
    for role, model in (("target", target), ("draft", draft)):
        assert all(torch.equal(p, want[role][n]) for n, p in model.named_parameters())
