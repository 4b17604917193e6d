"""Which of an n580 template's imports touch CUDA on a GPU host (bench only).

An n580 template must hold no CUDA/NVIDIA driver state when it is dumped, yet on the H200 the
template of SGLang 0.5.17 maps /dev/nvidia0 after its imports. This imports the template's
modules one by one (coldsnap.engines.sglang.SGLangLauncher's preloads), with torch's CUDA entry
points wrapped to print the Python stack of their first call, and after each import lists the
NVIDIA device files the process maps or holds open.

    python3 bench/gpu/template_probe.py [MODULE ...]

MODULEs, when named, are imported instead of the template's preloads (for instance
`sglang.launch_server`, to see which call of SGLang's import makes the CUDA context).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback


def nvidia_state() -> list[str]:
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/nvidia" in line:
                found.add("map " + line.split()[-1])
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "nvidia" in target:
            found.add("fd " + target)
    return sorted(found)


def wrap_torch_cuda() -> None:
    import torch
    import torch.cuda

    seen: set[str] = set()

    def wrap(owner: object, name: str) -> None:
        inner = getattr(owner, name, None)
        if inner is None:
            return

        def wrapper(*args: object, **kwargs: object) -> object:
            if name not in seen:
                seen.add(name)
                print(f"--- first call of {name}; nvidia before: {nvidia_state()}", flush=True)
                traceback.print_stack(limit=12, file=sys.stdout)
            return inner(*args, **kwargs)

        setattr(owner, name, wrapper)

    for name in ("is_available", "device_count", "_lazy_init", "init", "current_device",
                 "get_device_capability", "get_device_properties", "get_device_name",
                 "mem_get_info", "set_device", "synchronize"):  # fmt: skip
        wrap(torch.cuda, name)
    wrap(torch._C, "_cuda_getDeviceCount")
    wrap(torch._C, "_cuda_init")


def main() -> int:
    print("PYTORCH_NVML_BASED_CUDA_CHECK =", os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))
    import torch

    print("after torch:", nvidia_state())
    wrap_torch_cuda()
    from coldsnap.engines.sglang import SGLangLauncher

    names = tuple(sys.argv[1:]) or (
        *SGLangLauncher.template_preload,
        *(SGLangLauncher.forkserver_preload or ()),
    )
    for name in names:
        t = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"import {name} failed: {exc!r}")
        print(f"after {name} ({time.perf_counter() - t:.1f} s):", nvidia_state(), flush=True)
    del torch
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
