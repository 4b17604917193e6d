"""The CUDA release measurement with a speculative draft, on fakes shaped like SGLang 0.5.17's
STANDALONE worker: the scheduler's `draft_worker` is the speculative worker, whose
`draft_worker` (the draft worker) lists its `draft_runners`; each draft runner has a KV pool
of its own beside the target's and shares the target's `req_to_token`. A release of the KV
cache that leaves the draft's pool mapped must say so (the capture then refuses), since the
image would otherwise carry it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import coldsnap.plugin._scheduler as sched
from tests.plugin.test_cuda_release import GIB, FakeTensor, release, setup, written


@pytest.fixture(params=["tp-and-draft-worker", "selector"])
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sched, "variant_in_use", lambda key: request.param)
    return str(request.param)


def test_a_drafts_kv_pool_left_mapped_is_named_resident(tmp_path: Path, variant: str) -> None:
    cr, mgr, _ = setup(tmp_path)  # the release frees the target's regions only
    target = mgr.tp_worker.model_runner
    draft_kv = SimpleNamespace(
        k_buffer=[FakeTensor(0x40_0000_0000, GIB)], v_buffer=[FakeTensor(0x50_0000_0000, GIB)]
    )
    draft = SimpleNamespace(token_to_kv_pool=draft_kv, req_to_token_pool=target.req_to_token_pool)
    mgr.draft_worker = SimpleNamespace(draft_worker=SimpleNamespace(draft_runners=[draft]))
    if variant == "selector":  # 0.5.23 names the runners itself
        mgr._select_runners = lambda selector: [("target", target), ("draft", draft)]  # type: ignore[method-assign]
    for t in (*draft_kv.k_buffer, *draft_kv.v_buffer):
        mgr.mapped.add(t.storage.ptr)

    release(cr, mgr, ["kv_cache", "weights"])
    report = written(tmp_path)
    assert report["error"] is None
    assert report["resident"] == {"kv_cache": 2 * GIB}  # the draft's k and v, nothing else
    # req_to_token is shared: counted once
    assert report["regions"]["kv_cache"]["tensors"] == 5

    for t in (*draft_kv.k_buffer, *draft_kv.v_buffer):  # a saver that frees it too
        mgr.mapped.discard(t.storage.ptr)
    release(cr, mgr, ["kv_cache"])
    assert written(tmp_path)["resident"] == {}
