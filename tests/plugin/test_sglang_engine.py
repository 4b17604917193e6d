"""The in-process `sglang.Engine` with the plugin: it loads in this (main) process and in the
spawned scheduler, and release / native resume through the Engine API keeps its tokens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import PROMPTS, plugin_env, read_status

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.xdist_group("host")]


def test_in_process_engine_release_and_native_resume(
    sglang_cpu: None, models_root: Path, tmp_path: Path, clean_hook_registry: object
) -> None:
    from coldsnap._wire import ResumePlan, write_plan
    from coldsnap.tiny_models import build_model

    model = build_model(models_root / "llama-tiny", arch="llama", size="tiny", seed=0)
    env = plugin_env(
        tmp_path / "run",
        COLDSNAP_EXPORT_MODEL_PAYLOAD="1",
        COLDSNAP_ARTIFACT_DIR=str(tmp_path / "art"),
    )
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        import sglang

        engine = sglang.Engine(
            model_path=str(model.path),
            device="cpu",
            attention_backend="torch_native",
            cuda_graph_backend_decode="disabled",
            cuda_graph_backend_prefill="disabled",
            max_total_tokens=2048,
            mem_fraction_static=0.05,
        )
    try:
        params = {"temperature": 0.0, "max_new_tokens": 12}

        def tokens() -> list[list[int]]:
            return [
                engine.generate(prompt=p, sampling_params=params)["output_ids"] for p in PROMPTS
            ]

        cold = tokens()
        main = read_status(tmp_path / "run", "main")
        assert main["pid"] == os.getpid() and main["role"] == "main"
        assert read_status(tmp_path / "run", "scheduler-tp0")["hooks"]

        engine.release_memory_occupation()
        assert engine.tokenizer_manager.is_healthy() is False
        root = read_status(tmp_path / "run", "scheduler-tp0")["export"]["root"]
        write_plan(tmp_path / "run", ResumePlan(source="payload", payload_dir=root))
        engine.resume_memory_occupation()
        assert engine.tokenizer_manager.is_healthy() is True
        status = read_status(tmp_path / "run", "scheduler-tp0")
        assert status["resume"]["storages_unchanged"] is True, json.dumps(status)[:2000]
        assert tokens() == cold
    finally:
        engine.shutdown()
