"""What a checkpoint does not hold comes back after a recovery.

A tiny Llama with tied embeddings: its checkpoint has no `lm_head.weight`, and SGLang's model
holds a rotary `cos_sin_cache` no checkpoint has. A release returns the pages of every
registered storage, so that cache reads zero afterwards except in the page it shares with
other data (the first ~120 positions): the long prompt below reaches far past it.

One plugin-enabled server started from nothing gives the reference answers; with
COLDSNAP_KEEP_RESIDUAL=0 a release and a recovery reload answer like it too, because SGLang's
release stashes the target's buffers itself (what is left to the residual: a draft model's
buffers, parameters no checkpoint holds). The same checkpoint in transformers shows that an
unrestored cache would change the long prompt's answer, so the comparisons can fail. Then n610
(with the disk backing, an engine option) captures and restores with the recovery provider and
answers like the cold start, token for token. (An n580 restore builds its engine with SGLang's
own loader, which makes every tensor: no residual is involved; test_sglang_e2e.py's n580
recovery covers it.)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from coldsnap import Machine
from coldsnap._wire import KV_CACHE, WEIGHTS, ResumePlan, status_path, write_plan
from coldsnap.engines import EngineClient
from coldsnap.engines.sglang import SGLANG_POLICY

from .conftest import (
    MAX_NEW_TOKENS,
    PROMPTS,
    capture_request,
    leftovers,
    model_ref,
    restore_request,
    stop_at_once,
    watch,
    why,
)

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]

# ~300 tokens: positions far past the part of the rotary cache a release leaves in place.
_WORDS = ("seven", "wizards", "quietly", "restore", "the", "weights", "of", "every", "jolly",
          "engine", "over", "mountains", "and", "rivers")  # fmt: skip
LONG_PROMPT = " ".join(f"{w} {i}" for i, w in enumerate(_WORDS * 8))
ALL_PROMPTS = (*PROMPTS, LONG_PROMPT)


def _answers(url: str) -> list[tuple[int, ...]]:
    with EngineClient(url, SGLANG_POLICY) as client:
        return [client.generate(p, max_new_tokens=MAX_NEW_TOKENS).token_ids for p in ALL_PROMPTS]


def _scheduler(runtime_dir: str | Path) -> dict[str, Any]:
    return json.loads(status_path(Path(runtime_dir), "scheduler-tp0").read_text())


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("residual")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tied(e2e_ready: None, root: Path) -> Path:
    from coldsnap.tiny_models import build_model

    return build_model(root / "tied-llama", arch="llama", size="tiny", seed=3, tied=True).path


@pytest.fixture(scope="module")
def cold(tied: Path, root: Path) -> dict[str, Any]:
    """The reference answers of a server started from nothing (the arguments and environment
    the drivers start SGLang with, plus the plugin), then what the same server answers after a
    release and a recovery reload with no residual kept."""
    from coldsnap.backends import launch
    from coldsnap.cli._demo import PlainServer, plain_command, wait_first_answer

    run = root / "cold-run"
    argv, env, url = plain_command(tied)
    env.update(
        SGLANG_PLUGINS="coldsnap",
        COLDSNAP_MODE="capture",
        COLDSNAP_RUNTIME_DIR=str(run),
        COLDSNAP_KEEP_RESIDUAL="0",
    )
    server = PlainServer(launch(argv, log_path=root / "cold.log", env=env), url, root / "cold.log")
    try:
        wait_first_answer(server)
        reference = _answers(server.url)
        with EngineClient(server.url, SGLANG_POLICY) as client:
            client.release([KV_CACHE, WEIGHTS])
            write_plan(run, ResumePlan(source="checkpoint", checkpoint=str(tied)))
            client.resume([WEIGHTS, KV_CACHE])
        without = _answers(server.url)
        record = _scheduler(run)
    finally:
        server.stop()
    return {"answers": reference, "without_residual": without, "record": record}


def test_the_checkpoint_really_omits_what_the_residual_restores(tied: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(tied / "model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    assert not any("rotary" in k for k in keys)


def test_sglang_itself_brings_back_the_targets_buffers(cold: dict[str, Any], tied: Path) -> None:
    """With no residual kept, the reload still answers like the cold start: SGLang's own release
    stashes the target model's buffers (`_export_static_state`, a checked contract) and puts
    them back at resume. If it stopped, this fails, and the residual is what restores them."""
    assert cold["record"]["resume"]["residual"] == "off"
    assert cold["record"]["resume"]["loaded"] == {"target": str(tied)}
    assert cold["without_residual"] == cold["answers"]


def test_an_unrestored_rotary_cache_would_change_the_long_answer(
    cold: dict[str, Any], tied: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes the comparisons here able to fail: the same checkpoint in transformers agrees
    with the cold server on the long prompt, and with cos/sin zero past position 120 (what a
    release leaves of the cache when nothing restores it) it answers otherwise."""
    from coldsnap.engines.sglang.cpu import activate

    activate()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama import modeling_llama

    tokenizer = AutoTokenizer.from_pretrained(tied)
    model = AutoModelForCausalLM.from_pretrained(tied, dtype=torch.bfloat16)
    ids = tokenizer(LONG_PROMPT, return_tensors="pt").input_ids
    assert ids.shape[1] > 200

    def greedy() -> tuple[int, ...]:
        out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        return tuple(out[0, ids.shape[1] :].tolist())

    assert greedy()[:4] == cold["answers"][-1][:4]  # the numerics differ; the answer does not
    rotary = modeling_llama.LlamaRotaryEmbedding.forward

    def zero_past_120(self: Any, x: Any, position_ids: Any) -> tuple[Any, Any]:
        cos, sin = rotary(self, x, position_ids)
        past = (position_ids >= 120).unsqueeze(-1)
        return cos.masked_fill(past, 0), sin.masked_fill(past, 0)

    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", zero_past_120)
    assert greedy()[:4] != cold["answers"][-1][:4]


def test_recovery_restores_answer_like_a_cold_start(
    tied: Path, root: Path, cold: dict[str, Any]
) -> None:
    driver = "n610"
    base = root / driver
    base.mkdir()
    model = model_ref(tied, "tiny-llama-tied")
    proc = base / "proc"
    # The engine's release also writes its weights there; the capsule binds the options, so the
    # restore names them too.
    options = {"live_backing": "disk", "process_artifact_root": str(proc)}
    try:
        capture = capture_request(base, model, driver, "recovery", driver, engine_options=options)
        receipt = Machine.for_request(capture).capture(capture)
        assert receipt.ok, why(receipt)
        dirs, pids = watch(receipt)
        restore = attrs.evolve(
            restore_request(base, model, driver, "recovery", driver, "res"),
            engine_options=options,
        )
        machine = Machine.for_request(restore)
        restored = machine.restore(restore)
        assert restored.ok, why(restored)
        more_dirs, more_pids = watch(restored)
        try:
            got = _answers(restored.facts["engine_url"])
            record = _scheduler(restored.facts["runtime_dir"])
        finally:  # its graceful stop is n610's, checked on the native capsules
            stop_at_once(machine, restored)
        assert got == cold["answers"]
        # Released at capture, reloaded from the checkpoint, the residual put back. The disk
        # backing writes what each release releases: the capture releases twice (its release,
        # then again after rehearsing the refill); the restore reloads and releases nothing.
        spilled = sorted(proc.glob("live/*/tp0/target/index.json"))
        assert len(spilled) == 2, f"not one spill per capture release: {spilled}"
        residual = record["resume"]["residual"]["target"]
        assert residual["error"] is None and residual["nbytes"] > 0
        assert any(n.endswith("rotary_emb.cos_sin_cache") for n in residual["names"])
        assert not any(n.startswith("lm_head") for n in residual["names"])  # the tie
        assert not leftovers(dirs | more_dirs, pids | more_pids)
    finally:
        shutil.rmtree(base, ignore_errors=True)
