"""An empty stand-in for DeepSeek's `deep_gemm` kernel library, which the H200's SGLang 0.5.17
bundle does not hold (bench only, never the product).

SGLang 0.5.17's speculative worker imports its DeepSeek sparse-attention backend at CUDA graph
capture, only to list it among the backends that support graphs, and that module imports
`deep_gemm` at import time. A Llama target and draft on the triton backend never call it. The
harness puts this folder on PYTHONPATH for the speculative entry alone, with
SGLANG_ENABLE_JIT_DEEPGEMM=0 so that SGLang's own "is deep_gemm there" check enables nothing.
Anything that does reach for a kernel fails loudly here.
"""

from typing import NoReturn


def __getattr__(name: str) -> NoReturn:
    raise AttributeError(f"deep_gemm.{name}: the bench's empty stand-in has no kernels")
