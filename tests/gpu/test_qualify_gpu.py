"""The n610 qualification as a test: the tiny workload captured without weights and KV cache
(torch_memory_saver release, CUDA lock + checkpoint, CRIU dump), restored (CRIU, CUDA restore
+ unlock, resume, hydrate) and checked: same greedy tokens, data_ptrs and graph replay logits.
Needs root, the CRIU bundle (scripts/bundle-criu.sh .criu-bundle) and torch_memory_saver."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.criu, pytest.mark.slow, pytest.mark.xdist_group("host")]
REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / ".criu-bundle" / "criu"


def test_tiny_workload_round_trip(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("CRIU needs root")
    if not BUNDLE.exists():
        pytest.skip(f"no CRIU bundle at {BUNDLE}")
    pytest.importorskip("torch_memory_saver")
    import qualify

    out = tmp_path / "out"
    status = qualify.main([
        "--out", str(out), "--workdir", str(tmp_path / "work"), "--sizes", "tiny",
        "--naive", "tiny", "--naive-restores", "1", "--criu", str(BUNDLE),
    ])  # fmt: skip
    results = json.loads((out / "qualify.json").read_text())
    failed = [c for c in results["checks"] if not c["ok"]]
    assert not failed, failed
    assert status == 0
    restores = results["sizes"]["tiny"]["restores"]
    assert [r["ok"] for r in restores] == [True, True]
    assert results["sizes"]["tiny"]["graph_captured"]
