"""A CUDA capture refuses when the release frees nothing: real SGLang on a GPU, started without
the memory saver, captured through `Machine` (n610, recovery). release_memory must fail naming
the resident regions and their bytes, before any CUDA lock or dump, and the compensations must
leave nothing running. Skipped without a GPU (conftest), without SGLang, or without coldsnap's
plugin among SGLang's plugins (bench/gpu/sglang-machine-device.sh makes it discoverable)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]


def _needs() -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    plugins = {e.name for e in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    if "coldsnap" not in plugins:
        pytest.skip("coldsnap's plugin is not an sglang.srt.plugins entry point here")


def test_a_cuda_capture_refuses_when_release_frees_nothing(tmp_path: Path) -> None:
    _needs()
    import sglang_machine  # bench/gpu (conftest puts it on sys.path)

    from coldsnap import ModelRef
    from coldsnap.tiny_models import build_model

    info = build_model(tmp_path / "model", "llama", "tiny", 0)
    model = ModelRef(id="llama-tiny", revision="seed0", path=str(info.path))
    receipt = sglang_machine.refusal_capture(tmp_path / "run", model, sglang_machine.ENGINE_ARGS)
    assert not receipt.ok
    error = receipt.error or ""
    assert "release_memory" in error
    assert "still resident after the release" in error
    assert "weights" in error and "kv_cache" in error
    assert "--enable-memory-saver" in error
    steps = {r.name: r.status for r in receipt.steps}
    assert steps["release_memory"] == "failed"
    assert "cuda_lock" not in steps or steps["cuda_lock"] != "done"
    assert "process_dump" not in steps or steps["process_dump"] != "done"
