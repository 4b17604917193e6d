"""A test-only SGLang plugin, loaded beside coldsnap's by the plugin tests (PYTHONPATH holds
this directory, whose dist-info names the entry point; SGLANG_PLUGINS names it). It makes a
CPU server do three things the plugin must cope with:

- The rotary cache is recast to the activation dtype at its first use, after the model was
  loaded and registered. SGLang itself does this where its kernels read the cache in the
  activation dtype: during CUDA-graph capture in its CUDA fallback for head sizes its fused
  kernel does not take (Qwen2, Phi-3), where the cache is made in float32. On CPU SGLang makes
  it in the model's dtype unless SGLANG_ROPE_CACHE_FP32 is set, which the tests set.
- A release fails part way, once, when the test asks: with the file named by PAUSE_FAULT_VAR
  present, SGLang's memory saver raises when the release pauses the region the file names
  (after SGLang has marked every asked region released), and the file is removed.
- A refill from a payload leaves weights other than those exported, once, when the test asks:
  with the file named by HYDRATE_FAULT_VAR present, the first hydration after it appeared
  shifts the token embeddings by one row (every token then reads its neighbour's), and the
  file is removed. A reload from the checkpoint is left alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROTARY = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward"
PAUSE = "sglang.srt.utils.torch_memory_saver_adapter._TorchMemorySaverAdapterNoop.pause"
PAUSE_FAULT_VAR = "TEST_PLUGIN_PAUSE_FAULT"
HYDRATE = "coldsnap.plugin._payload.hydrate"
HYDRATE_FAULT_VAR = "TEST_PLUGIN_HYDRATE_FAULT"


class PauseFault(RuntimeError):
    """The fault a test armed."""


def recast_then_forward(original: Any, rotary: Any, *args: Any, **kwargs: Any) -> Any:
    query = args[1] if len(args) > 1 else kwargs["query"]  # forward(positions, query, key, ...)
    cache = rotary.cos_sin_cache
    if cache.dtype != query.dtype:
        rotary.cos_sin_cache = cache.to(query.dtype)  # a new storage, as SGLang's recast
    return original(rotary, *args, **kwargs)


def pause_or_fail(original: Any, adapter: Any, tag: str, *args: Any, **kwargs: Any) -> Any:
    armed = Path(os.environ[PAUSE_FAULT_VAR]) if os.environ.get(PAUSE_FAULT_VAR) else None
    if armed is not None and armed.is_file() and armed.read_text().strip() == tag:
        armed.unlink()
        raise PauseFault(f"the test's fault: pause({tag}) failed")
    return original(adapter, tag, *args, **kwargs)


def hydrate_then_shift(result: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    armed = Path(os.environ[HYDRATE_FAULT_VAR]) if os.environ.get(HYDRATE_FAULT_VAR) else None
    if armed is not None and armed.is_file():
        armed.unlink()
        import torch

        embedding = model.get_input_embeddings().weight
        with torch.no_grad():
            embedding.copy_(embedding.roll(1, dims=0))
    return result


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(ROTARY, recast_then_forward, HookType.AROUND)
    HookRegistry.register(PAUSE, pause_or_fail, HookType.AROUND)
    HookRegistry.register(HYDRATE, hydrate_then_shift, HookType.AFTER)
