"""Helpers for the provider tests: tiny Llama and Qwen3 models built at test time (random
weights, tied embeddings, derived buffers, bf16 + fp32 + int8), and storage-byte snapshots."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import torch


def _transformers():
    """Imports transformers. On a CPU torch, the PyPI torchvision (built against CUDA torch)
    loads only once SGLang's CPU support declared its ops: the same activation every SGLang test
    in this process makes (hiding torchvision instead broke later imports of SGLang here)."""
    if not torch.cuda.is_available():
        from coldsnap.engines.sglang import cpu

        cpu.activate()
    return importlib.import_module("transformers")


def build_model(arch: str, *, seed: int, tied: bool = True) -> torch.nn.Module:
    transformers = _transformers()
    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif arch == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    else:
        raise ValueError(arch)
    model = model.to(torch.bfloat16)
    # mixed dtypes as quantized checkpoints have them: int8 codes with fp32 scales
    mlp = model.model.layers[0].mlp
    mlp.register_buffer("codes_int8", torch.randint(-128, 128, (32, 16), dtype=torch.int8))
    mlp.register_buffer("scales_fp32", torch.rand(32, dtype=torch.float32))
    # derived, non-persistent buffers get values that depend on the seed too
    for module in model.modules():
        if hasattr(module, "inv_freq"):
            module.inv_freq.mul_(1.0 + seed / 100.0)
    return model


def storage_bytes(mapping: Mapping[str, torch.Tensor]) -> dict[str, bytes]:
    """The whole storage behind each name, as bytes (NaN-safe comparison)."""
    out = {}
    for name, tensor in mapping.items():
        storage = tensor.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
            storage, 0, (storage.nbytes(),), (1,)
        )
        out[name] = flat.cpu().numpy().tobytes()
    return out


def data_ptrs(mapping: Mapping[str, torch.Tensor]) -> dict[str, int]:
    return {name: t.data_ptr() for name, t in mapping.items()}


def block_tensors(seed: int) -> dict[str, torch.Tensor]:
    """A small model's tensors laid out across 8 KiB pack blocks: a tied bf16 embedding (5120 B,
    one short block), a 36000 B float tensor (four blocks and a short fifth), int8 codes and a
    norm."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(40, 64, generator=g).to(torch.bfloat16)
    return {
        "embed.weight": emb,
        "head.weight": emb,  # tied: one storage, two names
        "mlp.w": torch.randn(9000, generator=g),
        "mlp.codes": torch.randint(-128, 128, (3000,), generator=g, dtype=torch.int8),
        "norm.weight": torch.rand(64, generator=g),
    }


def old_block_tensors() -> dict[str, torch.Tensor]:
    """block_tensors' layout with other bytes: the contents a refused hydration must keep."""
    emb = torch.full((40, 64), 0.5, dtype=torch.bfloat16)
    return {
        "embed.weight": emb,
        "head.weight": emb,
        "mlp.w": torch.full((9000,), -1.0),
        "mlp.codes": torch.full((3000,), 3, dtype=torch.int8),
        "norm.weight": torch.full((64,), 2.0),
    }
