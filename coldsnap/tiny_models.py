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

Besides Llama and Qwen3, the architectures people serve, each in the form whose traits matter
to a snapshot (tensors the engine rebuilds, recasts or fuses after load):

    llama3    Llama with Llama 3's `rope_scaling` (rope type "llama3", theta 500000)
    qwen2     q/k/v biases, tied by default; at size tiny its head size is 16, which SGLang's
              CUDA rotary kernel does not take: its fallback recasts the rotary cache to the
              activations' dtype on the first forward, after the model was loaded
    mistral   a sliding window (32), head size 128
    gemma2    head size 256, alternating sliding-window layers, soft-capped logits, tied
    phi3      head size 96 (Phi-3 mini's), fused qkv and gate/up projections in the checkpoint
    qwen2moe  8 experts, 2 per token, a shared expert; experts named one by one as the hub's
              checkpoints name them (transformers 5 fuses them in memory)

The four last are built at size "tiny" only, in shapes that SGLang 0.5.17 serves on the H200.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

__all__ = ["ARCHS", "SIZES", "ModelInfo", "build_model"]


@attrs.frozen
class _Size:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int | None = None  # None: hidden // heads


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

# The tiny shapes of the architectures built only tiny: head sizes as the real models have them
# where SGLang's CUDA kernels care (its fused rotary kernel takes 64, 128, 256 and 512; Phi-3
# mini's 96 is what it is), widths no larger than that needs.
_MISTRAL_TINY = _Size(hidden=512, intermediate=1024, layers=2, heads=4, kv_heads=2, vocab=1000,
                      head_dim=128)  # fmt: skip
_GEMMA2_TINY = _Size(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=1000,
                     head_dim=256)  # fmt: skip
_PHI3_TINY = _Size(hidden=384, intermediate=768, layers=2, heads=4, kv_heads=4, vocab=1000)
_QWEN2MOE_TINY = _Size(hidden=512, intermediate=1024, layers=2, heads=4, kv_heads=2, vocab=1000)


@attrs.frozen
class _Arch:
    """How one architecture is built: its Hugging Face class, whether its LM head is tied to
    the embedding (by default, and which choices exist), the shapes it is built in, and the
    standard deviation of its random matrices, untied and tied (and of its embedding, where it
    differs: Gemma multiplies the embedding by the square root of the width)."""

    hf_class: str
    tied_default: bool
    tied_choices: frozenset[bool]
    sizes: dict[str, _Size]
    scale: tuple[float, float]
    config: Callable[[_Size, dict[str, Any], bool], Any]
    embedding_scale: float | None = None


def _llama(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(tie_word_embeddings=tied, **common)


def _qwen3(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import Qwen3Config

    # Qwen3 small checkpoints tie the embedding and the LM head; keep that here so the
    # shared-storage path is exercised.
    return Qwen3Config(head_dim=s.hidden // s.heads, tie_word_embeddings=True, **common)


def _llama3(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import LlamaConfig

    # Llama 3.1/3.2's scaling, on a shorter original context than theirs (8192) so that it stays
    # below these models' 4096 positions and so the rotary cache stays small.
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    return LlamaConfig(tie_word_embeddings=tied, rope_parameters=rope, **common)


def _qwen2(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(tie_word_embeddings=tied, **common)  # q/k/v always have biases


def _mistral(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import MistralConfig

    # A window shorter than the test prompts plus their answers, so that it changes them.
    return MistralConfig(head_dim=s.head_dim, sliding_window=32, tie_word_embeddings=tied,
                         **common)  # fmt: skip


def _gemma2(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import Gemma2Config

    cfg = Gemma2Config(
        head_dim=s.head_dim,
        query_pre_attn_scalar=s.head_dim,
        sliding_window=32,
        tie_word_embeddings=True,
        **common,
    )
    # Gemma 2 checkpoints on the hub name the activation twice; transformers 5 writes only
    # hidden_activation, and SGLang's Gemma 2 reads hidden_act.
    cfg.hidden_act = cfg.hidden_activation
    return cfg


def _phi3(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import Phi3Config

    # No long-context scaling (Phi-3 mini 4k): the original context is the whole context.
    return Phi3Config(
        original_max_position_embeddings=common["max_position_embeddings"],
        tie_word_embeddings=tied,
        **common,
    )


def _qwen2moe(s: _Size, common: dict[str, Any], tied: bool) -> Any:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        moe_intermediate_size=s.intermediate // 4,
        shared_expert_intermediate_size=s.intermediate // 2,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        tie_word_embeddings=tied,
        **common,
    )


_ONLY_TIED, _ONLY_UNTIED, _EITHER = frozenset({True}), frozenset({False}), frozenset({False, True})

# Scales: at 0.02 a random model's attention is nearly uniform, so its answers hardly depend on
# positions (and so on the rotary cache a restore must bring back); the newer builds draw their
# matrices larger, as far as their greedy answers stay varied. The first two keep theirs.
_ARCH: dict[str, _Arch] = {
    "llama": _Arch("LlamaForCausalLM", False, _EITHER, SIZES, (0.02, 0.2), _llama),
    "qwen3": _Arch("Qwen3ForCausalLM", True, _ONLY_TIED, SIZES, (0.02, 0.02), _qwen3),
    "llama3": _Arch("LlamaForCausalLM", False, _EITHER, SIZES, (0.2, 0.2), _llama3),
    "qwen2": _Arch("Qwen2ForCausalLM", True, _EITHER, SIZES, (0.2, 0.2), _qwen2),
    "mistral": _Arch("MistralForCausalLM", False, _ONLY_UNTIED, {"tiny": _MISTRAL_TINY},
                     (0.1, 0.1), _mistral),
    "gemma2": _Arch("Gemma2ForCausalLM", True, _ONLY_TIED, {"tiny": _GEMMA2_TINY},
                    (0.1, 0.1), _gemma2, embedding_scale=0.02),
    "phi3": _Arch("Phi3ForCausalLM", False, _ONLY_UNTIED, {"tiny": _PHI3_TINY},
                  (0.1, 0.1), _phi3),
    "qwen2moe": _Arch("Qwen2MoeForCausalLM", False, _ONLY_UNTIED, {"tiny": _QWEN2MOE_TINY},
                      (0.1, 0.1), _qwen2moe),
}  # fmt: skip
ARCHS = tuple(_ARCH)
# Builds whose bytes other code depends on (tests, the demo): their configs keep exactly the
# fields they were first written with.
_FIRST_ARCHS = ("llama", "qwen3")

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
    dest: str | Path,
    arch: str = "llama",
    size: str = "tiny",
    seed: int = 0,
    *,
    tied: bool | None = None,
) -> ModelInfo:
    """Writes a random checkpoint to `dest` (created; must be empty or hold the same build).
    `tied` ties the LM head to the embedding; None takes the architecture's own choice (tied
    for qwen3, qwen2 and gemma2, which is also the only one qwen3 and gemma2 have)."""
    if arch not in _ARCH:
        raise ValueError(f"arch {arch!r} is not one of {', '.join(ARCHS)}")
    spec = _ARCH[arch]
    if size not in spec.sizes:
        raise ValueError(f"size {size!r} is not one of {', '.join(spec.sizes)} (arch {arch!r})")
    if tied is None:
        tied = spec.tied_default
    elif tied not in spec.tied_choices:
        raise ValueError(f"tied={tied}: arch {arch!r} is built only with tied={spec.tied_default}")
    dest = Path(dest)
    cached = _read_info(dest)
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
    shape = spec.sizes[size]
    # Everything is built in memory first, then written to a sibling temporary directory that
    # is renamed into place: a failed build leaves nothing behind.
    tokenizer = _train_tokenizer(shape.vocab)
    config = _config(
        arch,
        shape,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tied=tied,
    )
    # Tied to a 0.02-scale embedding, the LM head would pick the last input token again and
    # again, whatever attention (and so the rotary cache) did: a tied build's matrices are drawn
    # larger, so that the layers decide the answer (Qwen3's are not, as first built).
    scale = spec.scale[1] if tied else spec.scale[0]
    tensors = _random_weights(config, seed, scale=scale, embedding_scale=spec.embedding_scale)
    tensors = _hub_names(tensors)
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


def _config(
    arch: str, s: _Size, *, eos_token_id: int, bos_token_id: int, pad_token_id: int, tied: bool
) -> Any:
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
    if arch not in _FIRST_ARCHS:
        # The defaults of some configs name a padding id beyond this vocabulary (Phi-3's).
        common["pad_token_id"] = pad_token_id
    spec = _ARCH[arch]
    cfg = spec.config(s, common, tied)
    cfg.architectures = [spec.hf_class]  # what SGLang's model registry looks up
    return cfg


def _random_weights(
    config: Any, seed: int, *, scale: float = 0.02, embedding_scale: float | None = None
) -> dict[str, Any]:
    """Draws every tensor from one seeded generator, in sorted name order (matrices with
    standard deviation `scale`, the input embedding with `embedding_scale` where given)."""
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
        elif name == "model.embed_tokens.weight" and embedding_scale is not None:
            t = embedding_scale * torch.randn(shape, generator=gen)
        else:
            t = scale * torch.randn(shape, generator=gen)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def _hub_names(tensors: dict[str, Any]) -> dict[str, Any]:
    """The tensors as checkpoints on the hub name them. transformers 5 holds a mixture of
    experts' projections as two 3-D tensors per layer (`experts.gate_up_proj`, the gate's rows
    first, and `experts.down_proj`); checkpoints, and the engines' loaders, name each expert's
    projections apart. Every other tensor keeps its name."""
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        base, _, leaf = name.rpartition(".")
        if not (base.endswith(".experts") and leaf in ("gate_up_proj", "down_proj")):
            out[name] = t
            continue
        for e in range(t.shape[0]):
            if leaf == "gate_up_proj":
                gate, up = t[e].chunk(2, dim=0)
                out[f"{base}.{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{base}.{e}.up_proj.weight"] = up.contiguous()
            else:
                out[f"{base}.{e}.down_proj.weight"] = t[e].contiguous()
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
