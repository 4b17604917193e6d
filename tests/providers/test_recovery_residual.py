"""The residual state of a recovery, as the plugin keeps it for SGLang's models: host copies of
what the model's checkpoint does not hold, taken at release and written back after the reload.
The model here is shaped like SGLang's: fused parameters named through its own
`stacked_params_mapping`, an LM head tied to the embedding module, a non-persistent rotary
cache shared by the layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from coldsnap.plugin._payload import (
    PayloadRefused,
    check_load_format,
    keep_residual,
    restore_residual,
)
from coldsnap.providers import CheckpointError
from coldsnap.providers.recovery import recovery_tensors, residual_names, safetensors_keys


class Rotary(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        cache = torch.arange(64, dtype=torch.float32).reshape(16, 4).cos()
        self.register_buffer("cos_sin_cache", cache, persistent=False)


class Attention(torch.nn.Module):
    def __init__(self, rotary: Rotary) -> None:
        super().__init__()
        self.qkv_proj = torch.nn.Linear(4, 12, bias=False)
        self.rotary_emb = rotary


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(10, 4)
        rotary = Rotary()  # one module for every layer, as SGLang's get_rope caches it
        self.layers = torch.nn.ModuleList([Attention(rotary), Attention(rotary)])


class SGLangLike(torch.nn.Module):
    def __init__(self, *, mapping: bool = True) -> None:
        super().__init__()
        self.model = Inner()
        self.lm_head = self.model.embed_tokens  # tie_word_embeddings
        if mapping:
            self.stacked_params_mapping = [
                (".qkv_proj", ".q_proj", "q"),
                (".qkv_proj", ".k_proj", "k"),
                (".qkv_proj", ".v_proj", "v"),
            ]


def _checkpoint(directory: Path, model: SGLangLike) -> Path:
    """The checkpoint a Hugging Face save would write: unfused shards, no lm_head, no cache."""
    directory.mkdir()
    tensors = {"model.embed_tokens.weight": model.model.embed_tokens.weight.detach().clone()}
    for i, layer in enumerate(model.model.layers):
        q, k, v = layer.qkv_proj.weight.detach().split(4)
        for name, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            tensors[f"model.layers.{i}.{name}.weight"] = t.contiguous()
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def _release(model: torch.nn.Module) -> None:
    """What a release leaves: every registered storage reads zero."""
    with torch.no_grad():
        for t in recovery_tensors(model).values():
            t.zero_()


def _reload(model: SGLangLike, checkpoint: Path) -> None:
    """What SGLang's update_weights_from_disk writes: the checkpoint's parameters, fused."""
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f, torch.no_grad():
        model.model.embed_tokens.weight.copy_(f.get_tensor("model.embed_tokens.weight"))
        for i, layer in enumerate(model.model.layers):
            parts = [f.get_tensor(f"model.layers.{i}.{n}_proj.weight") for n in "qkv"]
            layer.qkv_proj.weight.copy_(torch.cat(parts))


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in recovery_tensors(model).items()}


def test_the_residual_is_what_the_checkpoint_does_not_hold(tmp_path: Path) -> None:
    model = SGLangLike()
    ckpt = _checkpoint(tmp_path / "ckpt", model)
    kept = keep_residual("target", model, str(ckpt))
    assert kept.error is None
    # the cache under every layer's name, stored once; the tied head and fused qkv are covered
    assert set(kept.names) == {f"model.layers.{i}.rotary_emb.cos_sin_cache" for i in (0, 1)}
    assert len(kept.copies) == 1 and kept.nbytes == 16 * 4 * 4


def test_release_reload_restore_is_bit_exact_and_in_place(tmp_path: Path) -> None:
    model = SGLangLike()
    ckpt = _checkpoint(tmp_path / "ckpt", model)
    before = _state(model)
    ptrs = {n: t.data_ptr() for n, t in recovery_tensors(model).items()}
    kept = keep_residual("target", model, str(ckpt))
    _release(model)
    _reload(model, ckpt)
    rotary = model.model.layers[0].rotary_emb
    assert not rotary.cos_sin_cache.any()  # the reload alone leaves the cache zero
    summary = restore_residual(model, kept)
    after = _state(model)
    assert all(torch.equal(after[n], before[n]) for n in before)
    assert {n: t.data_ptr() for n, t in recovery_tensors(model).items()} == ptrs
    assert summary["tensors"] == 2 and summary["error"] is None


def test_a_model_without_a_fused_table_keeps_its_fused_parameters_too(tmp_path: Path) -> None:
    model = SGLangLike(mapping=False)
    ckpt = _checkpoint(tmp_path / "ckpt", SGLangLike())
    kept = keep_residual("target", model, str(ckpt))
    assert {n for n in kept.names if "qkv_proj" in n} == {
        f"model.layers.{i}.qkv_proj.weight" for i in (0, 1)
    }  # kept twice, never lost


def test_an_unreadable_checkpoint_keeps_the_buffers_and_names_why(tmp_path: Path) -> None:
    model = SGLangLike()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"")
    kept = keep_residual("target", model, str(tmp_path / "bin"))
    assert kept.error and "no *.safetensors" in kept.error
    assert all(n.endswith("cos_sin_cache") for n in kept.names)


def test_a_residual_that_no_longer_fits_is_refused(tmp_path: Path) -> None:
    model = SGLangLike()
    kept = keep_residual("target", model, str(_checkpoint(tmp_path / "ckpt", model)))
    model.model.layers[0].rotary_emb.cos_sin_cache = torch.zeros(8, 4)
    with pytest.raises(PayloadRefused, match="no longer fits"):
        restore_residual(model, kept)


def test_a_buffer_the_checkpoint_names_is_still_residual_when_only_parameters_load() -> None:
    mapping = {"w": torch.zeros(2), "buf": torch.zeros(2)}
    assert residual_names(mapping, {"w", "buf"}) == set()
    assert residual_names(mapping, {"w", "buf"}, loadable={"w"}) == {"buf"}


def test_safetensors_keys_needs_safetensors_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        safetensors_keys(tmp_path)
    save_file({"a.q_proj.weight": torch.zeros(1)}, str(tmp_path / "m.safetensors"))
    assert safetensors_keys(tmp_path, lambda k: k.replace("q_proj", "qkv")) == {"a.qkv.weight"}


@pytest.mark.parametrize(
    ("files", "load_format", "ok"),
    [
        (["model.safetensors"], "safetensors", True),
        (["model.safetensors"], "auto", True),
        (["model.safetensors"], "pt", False),
        (["pytorch_model.bin"], "pt", True),
        (["pytorch_model.bin"], "safetensors", False),
        (["config.json"], "auto", False),
    ],
)
def test_the_load_format_must_match_the_checkpoint(
    tmp_path: Path, files: list[str], load_format: str, ok: bool
) -> None:
    for name in files:
        (tmp_path / name).write_bytes(b"x")
    if ok:
        check_load_format(tmp_path, load_format)
    else:
        with pytest.raises(PayloadRefused, match=f"for load format '{load_format}'"):
            check_load_format(tmp_path, load_format)
