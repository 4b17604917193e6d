"""Tiny random checkpoints for tests and the demo, built locally (no hub access).

A checkpoint is a Hugging Face directory: `config.json`, one bf16 `model.safetensors` and a
byte-level BPE tokenizer trained here on a fixed corpus. Everything is a pure function of
(arch, size, seed), so two builds with the same arguments are byte-identical and a server
started on either gives the same tokens.

    info = build_model(tmp_path / "m", arch="llama", size="tiny", seed=0)

`tied=True` builds a Llama whose LM head is its embedding (`tie_word_embeddings`): the
checkpoint then has no `lm_head.weight`, and besides it the model holds tensors no checkpoint
has (SGLang's rotary `cos_sin_cache`, a non-persistent buffer) that must come back after a
recovery. Its matrices are drawn larger so that its greedy answers depend on attention, and so
on that cache (Qwen3 builds are always tied, and unchanged).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs

__all__ = ["ARCHS", "SIZES", "ModelInfo", "build_model"]

ARCHS = ("llama", "qwen3")


@attrs.frozen
class _Size:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int


SIZES: dict[str, _Size] = {
    # hidden 64, 2 layers: starts fast, weights are negligible.
    "tiny": _Size(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=1000),
    # ~127 M parameters = ~254 MB of bf16: weights dominate the scheduler's memory.
    "small": _Size(hidden=1024, intermediate=4096, layers=8, heads=16, kv_heads=8, vocab=1000),
    # ~1.26 G parameters = ~2.35 GiB of bf16: the GPU qualification's model of "at least 2 GiB".
    "2g": _Size(hidden=2048, intermediate=8192, layers=20, heads=16, kv_heads=8, vocab=1000),
    # ~4.26 G parameters = ~7.94 GiB of bf16: the "about 8 GiB of weights" restored on the H200.
    "8g": _Size(hidden=4096, intermediate=11008, layers=24, heads=32, kv_heads=8, vocab=1000),
}

_FORMAT = 1
_KIND = "coldsnap.test-model"
_INFO_FILE = "coldsnap-test-model.json"


@attrs.frozen
class ModelInfo:
    """What a test needs to know about a built checkpoint."""

    path: Path
    arch: str
    size: str
    seed: int
    architecture: str  # the HF class name, e.g. "LlamaForCausalLM"
    num_parameters: int
    weight_bytes: int  # bytes of tensor data in model.safetensors
    vocab_size: int
    eos_token_id: int
    tied: bool = False  # the LM head is the embedding; the checkpoint omits lm_head.weight


def build_model(
    dest: str | Path, arch: str = "llama", size: str = "tiny", seed: int = 0, *, tied: bool = False
) -> ModelInfo:
    """Writes a random checkpoint to `dest` (created; must be empty or hold the same build).
    `tied` ties a Llama's LM head to its embedding (Qwen3 is always tied)."""
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} is not one of {', '.join(ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {', '.join(SIZES)}")
    dest = Path(dest)
    cached = _read_info(dest)
    tied = tied or arch == "qwen3"
    if cached is not None and (cached.arch, cached.size, cached.seed, cached.tied) == (
        arch,
        size,
        seed,
        tied,
    ):
        return cached
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(
            f"{dest} is not empty and holds no build of ({arch}, {size}, {seed}, tied={tied})"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)

    _ready_cpu_imports()
    shape = SIZES[size]
    # Everything is built in memory first, then written to a sibling temporary directory that
    # is renamed into place: a failed build leaves nothing behind.
    tokenizer = _train_tokenizer(shape.vocab)
    config = _config(
        arch,
        shape,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tied=tied,
    )
    # Tied to a 0.02-scale embedding, the LM head would pick the last input token again and
    # again, whatever attention (and so the rotary cache) did: draw a tied Llama's matrices
    # larger, so that the layers decide the answer. Other builds are unchanged.
    scale = 0.2 if arch == "llama" and tied else 0.02
    tensors = _random_weights(config, seed, scale=scale)
    info = ModelInfo(
        path=dest,
        arch=arch,
        size=size,
        seed=seed,
        architecture=config.architectures[0],
        num_parameters=sum(t.numel() for t in tensors.values()),
        weight_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        vocab_size=shape.vocab,
        eos_token_id=int(tokenizer.eos_token_id),
        tied=tied,
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    tmp.chmod(0o755)
    try:
        tokenizer.save_pretrained(str(tmp))
        config.save_pretrained(str(tmp))
        _save_safetensors(tmp / "model.safetensors", tensors)
        _write_info(info, tmp)
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def _ready_cpu_imports() -> None:
    """On a CPU torch, transformers imports torchvision, which needs the op declarations."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        from coldsnap.engines.sglang.cpu import activate

        activate()


def _config(arch: str, s: _Size, *, eos_token_id: int, bos_token_id: int, tied: bool) -> Any:
    common: dict[str, Any] = dict(
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        vocab_size=s.vocab,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        dtype="bfloat16",
    )
    if arch == "llama":
        from transformers import LlamaConfig

        cfg = LlamaConfig(tie_word_embeddings=tied, **common)
        cfg.architectures = ["LlamaForCausalLM"]
    else:
        from transformers import Qwen3Config

        # Qwen3 small checkpoints tie the embedding and the LM head; keep that here so the
        # shared-storage path is exercised.
        cfg = Qwen3Config(head_dim=s.hidden // s.heads, tie_word_embeddings=True, **common)
        cfg.architectures = ["Qwen3ForCausalLM"]
    return cfg


def _random_weights(config: Any, seed: int, *, scale: float = 0.02) -> dict[str, Any]:
    """Draws every tensor from one seeded generator, in sorted name order (matrices with
    standard deviation `scale`)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(p.shape) for name, p in skeleton.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            # RMSNorm gains near 1 keep activations in range through the layers.
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            t = scale * torch.randn(shape, generator=gen)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def _save_safetensors(path: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


_CORPUS_WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
    "wizards", "quietly", "hex", "every", "jolly", "box", "of", "pickled", "grapes", "and",
    "the", "sun", "rises", "in", "the", "east", "over", "mountains", "rivers", "cities",
    "servers", "snapshots", "weights", "tokens", "memory", "restore", "capture", "process",
    "kernel", "engine", "model", "cold", "start", "warm", "cache", "hello", "world", "one",
    "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "zero",
)  # fmt: skip


def _corpus() -> list[str]:
    """A fixed, varied text so BPE learns merges up to the target vocabulary."""
    lines = []
    n = len(_CORPUS_WORDS)
    for i in range(4000):
        words = [_CORPUS_WORDS[(i * 7 + j * 13 + (i // n) * j) % n] for j in range(12)]
        lines.append(" ".join(words) + f" {i} {i * 31 % 997}.")
    return lines


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|bos|>", "<|eos|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=4096,
    )
    # A minimal chat template so /v1/chat/completions works on these models.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return fast


def _write_info(info: ModelInfo, directory: Path) -> None:
    record = {"format": _FORMAT, "kind": _KIND, **attrs.asdict(info)}
    del record["path"]  # the directory may move; the reader fills it in
    (directory / _INFO_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))


def _read_info(dest: Path) -> ModelInfo | None:
    try:
        record = json.loads((dest / _INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    if record.get("format") != _FORMAT or record.get("kind") != _KIND:
        return None
    fields = {f.name for f in attrs.fields(ModelInfo)}
    data = {k: v for k, v in record.items() if k in fields}
    data.setdefault("tied", data.get("arch") == "qwen3")  # builds from before the field
    data["path"] = dest
    return ModelInfo(**data)
