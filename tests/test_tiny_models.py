"""The random checkpoints of coldsnap.tiny_models, one per architecture of the qualification
matrix: each is what its architecture's checkpoints on the hub look like (the config's class and
traits, the tensors' names: transformers loads it with nothing missing or left over), and its
greedy answers depend on positions, so that a restore that brought back a wrong rotary cache
would answer differently. The first builds (Llama, Qwen3), which tests and the demo depend on,
keep their bytes. No server: transformers runs the models on CPU."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from coldsnap.tiny_models import ARCHS, ModelInfo, _hub_names, build_model

NEW_ARCHS = ("llama3", "qwen2", "mistral", "gemma2", "phi3", "qwen2moe")
PROMPTS = ([5, 77, 300, 12, 9, 450, 600, 31, 8, 200, 99, 17], list(range(100, 160, 2)))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    root = tmp_path_factory.mktemp("arch-models")
    return {arch: build_model(root / arch, arch, "tiny", 0) for arch in ARCHS}


def _config(info: ModelInfo) -> dict[str, Any]:
    return json.loads((info.path / "config.json").read_text())


def _keys(info: ModelInfo) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(info.path / "model.safetensors"), framework="pt") as handle:
        return set(handle.keys())


def _head_size(cfg: dict[str, Any]) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


# What each architecture must show: the class SGLang looks up, the head size that decides its
# rotary kernel on CUDA, the tie, and its own traits.
EXPECTED: dict[str, dict[str, Any]] = {
    "llama3": {"class": "LlamaForCausalLM", "head": 16, "tied": False},
    "qwen2": {"class": "Qwen2ForCausalLM", "head": 16, "tied": True},
    "mistral": {"class": "MistralForCausalLM", "head": 128, "tied": False},
    "gemma2": {"class": "Gemma2ForCausalLM", "head": 256, "tied": True},
    "phi3": {"class": "Phi3ForCausalLM", "head": 96, "tied": False},
    "qwen2moe": {"class": "Qwen2MoeForCausalLM", "head": 128, "tied": False},
}


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_each_architecture_has_its_class_head_size_and_tie(
    built: dict[str, ModelInfo], arch: str
) -> None:
    info, want = built[arch], EXPECTED[arch]
    cfg = _config(info)
    assert cfg["architectures"] == [want["class"]] == [info.architecture]
    assert _head_size(cfg) == want["head"]
    assert cfg["tie_word_embeddings"] is want["tied"] is info.tied
    assert ("lm_head.weight" in _keys(info)) is not want["tied"]
    assert cfg["vocab_size"] == info.vocab_size == 1000
    assert cfg["pad_token_id"] < cfg["vocab_size"]


def test_each_architecture_keeps_its_own_traits(built: dict[str, ModelInfo]) -> None:
    rope = (
        _config(built["llama3"]).get("rope_parameters") or _config(built["llama3"])["rope_scaling"]
    )
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    assert (
        rope["original_max_position_embeddings"]
        < _config(built["llama3"])["max_position_embeddings"]
    )
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.bias"} <= (
        _keys(built["qwen2"])
    )
    assert _config(built["mistral"])["sliding_window"] == 32
    gemma = _config(built["gemma2"])
    assert gemma["sliding_window"] == 32
    assert gemma["hidden_act"] == gemma["hidden_activation"] == "gelu_pytorch_tanh"
    moe = _config(built["qwen2moe"])
    assert (moe["num_experts"], moe["num_experts_per_tok"]) == (8, 2)
    assert moe["shared_expert_intermediate_size"] > 0


def test_experts_are_named_one_by_one_as_on_the_hub(built: dict[str, ModelInfo]) -> None:
    keys = _keys(built["qwen2moe"])
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in keys)
    for e in range(8):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.1.mlp.experts.{e}.{proj}.weight" in keys


def test_a_fused_expert_tensor_splits_with_the_gate_rows_first() -> None:
    """transformers computes `gate, up = (x @ gate_up_proj[e].T).chunk(2)`: the first half of
    an expert's rows is its gate projection."""
    import torch

    fused = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(2, 6, 4)  # 2 experts, I=3, H=4
    down = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    other = torch.ones(2)
    out = _hub_names({"m.experts.gate_up_proj": fused, "m.experts.down_proj": down, "m.x": other})
    assert set(out) == {
        *(
            f"m.experts.{e}.{p}.weight"
            for e in (0, 1)
            for p in ("gate_proj", "up_proj", "down_proj")
        ),
        "m.x",
    }
    assert torch.equal(out["m.experts.1.gate_proj.weight"], fused[1, :3])
    assert torch.equal(out["m.experts.1.up_proj.weight"], fused[1, 3:])
    assert torch.equal(out["m.experts.0.down_proj.weight"], down[0])
    assert out["m.x"] is other


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_transformers_loads_every_tensor_and_answers_depend_on_positions(
    built: dict[str, ModelInfo], arch: str
) -> None:
    """Loaded by transformers, nothing missing or left over (the checkpoint names what the hub's
    checkpoints name); greedy answers are varied, and moving the positions apart changes most
    next-token choices: attention, and so the rotary cache, decides the answers."""
    import torch
    from transformers import AutoModelForCausalLM

    model, loading = AutoModelForCausalLM.from_pretrained(
        str(built[arch].path), dtype=torch.float32, output_loading_info=True
    )
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    changed = total = 0
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=2)
            as_is = model(ids).logits[0].argmax(-1)
            spread = model(ids, position_ids=3 * torch.arange(len(prompt))[None]).logits[0]
        assert len(set(out[0, len(prompt) :].tolist())) >= 8, out
        changed += int((as_is != spread.argmax(-1)).sum())
        total += len(prompt)
    assert changed >= total // 2, f"{changed} of {total} next tokens moved with the positions"


# sha256 of model.safetensors and of config.json without transformers' version, as first built.
FIRST_BUILDS = {
    ("llama", False): (
        "ec699a9da9bac765a653b08a5b543fc2a678d2f156b3fa0400921b3b0adf21e4",
        "2b8957bcdaa8b6f3d29e490bac0ef6edc0ede0eb2f6738b838fd50eecb260569",
    ),
    ("llama", True): (
        "b5c6cf9c31e10e57ab1a975cede5939d585646af4985f8595ec31a6090924209",
        "2975702cce7cb28fc370cd3f0a62ed0adf4905a0c93954368409792017a455b1",
    ),
    ("qwen3", None): (
        "70ec3727fe318bb525f59da504b2d33af9d746db6d1b035abdad31dee3cfcb54",
        "348a7162126b3fba3285d00b968fc7719c6df4dfe47a4c6717a73e98dab47574",
    ),
}


def _digests(info: ModelInfo) -> tuple[str, str]:
    cfg = _config(info)
    cfg.pop("transformers_version", None)
    weights = hashlib.sha256((info.path / "model.safetensors").read_bytes()).hexdigest()
    return weights, hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def test_the_first_builds_keep_their_bytes(tmp_path: Path) -> None:
    for (arch, tied), want in FIRST_BUILDS.items():
        info = build_model(tmp_path / f"{arch}-{tied}", arch, "tiny", 0, tied=tied)
        assert _digests(info) == want, (arch, tied)


@pytest.mark.parametrize(
    ("arch", "size", "tied", "field"),
    [
        ("qwen3", "tiny", False, "tied=False"),
        ("gemma2", "tiny", False, "tied=False"),
        ("mistral", "tiny", True, "tied=True"),
        ("phi3", "small", None, "size 'small'"),
        ("qwen2moe", "8g", None, "size '8g'"),
    ],
)
def test_a_build_an_architecture_does_not_have_is_refused_naming_the_field(
    tmp_path: Path, arch: str, size: str, tied: bool | None, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        build_model(tmp_path / "m", arch, size, 0, tied=tied)
    assert not (tmp_path / "m").exists()
