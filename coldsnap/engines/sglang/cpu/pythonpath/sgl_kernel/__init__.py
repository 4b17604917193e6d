"""A stand-in for `sgl_kernel` on CPU hosts (no CPU build of sgl-kernel is on PyPI).

With SGLANG_USE_CPU_ENGINE=1, SGLang imports these eight names at module load. None of them
runs on plain (non-speculative) serving with the torch_native attention backend. Each one
raises if it is ever called: a run must fail loudly, never compute with a fake kernel.
No torch ops are registered, so SGLang's AMX backend stays off.
"""

STANDIN = True

_NAMES = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
    "build_tree_kernel_efficient_cpu",
)


class KernelNotAvailable(NotImplementedError):
    """A CPU kernel of sgl_kernel was called, but this is coldsnap's CPU stand-in."""


def _missing(name):
    def kernel(*args, **kwargs):
        raise KernelNotAvailable(
            f"sgl_kernel.{name} was called, but sgl_kernel here is coldsnap's CPU "
            "stand-in (coldsnap/engines/sglang/cpu): this code path needs the real kernel"
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


for _name in _NAMES:
    globals()[_name] = _missing(_name)
del _name

__all__ = list(_NAMES)
