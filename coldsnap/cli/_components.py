"""Builds the real components a request names (drivers, providers, engine adapter, store)."""

from __future__ import annotations

from typing import Any

from coldsnap.assembly import components


def sglang_host_settings() -> tuple[tuple[str, ...], dict[str, str]]:
    """SGLang's extra arguments and environment on this host: on a CPU-only host, the CPU
    platform and the test support stand-ins (coldsnap.testing.sglang_cpu)."""
    import torch

    if torch.cuda.is_available():
        return (), {}
    from coldsnap.testing.sglang_cpu import CPU_ARGS, activate, cpu_env

    # This process imports SGLang too: the artifact identity hashes its contract sources.
    activate()

    args = (*CPU_ARGS, "--max-total-tokens", "2048", "--mem-fraction-static", "0.05")
    env = cpu_env({})
    return args, env


def real_components(request: Any) -> dict[str, Any]:
    if request.engine != "sglang":
        return components(request)
    args, env = sglang_host_settings()
    return components(request, sglang_args=args, sglang_env=env)
