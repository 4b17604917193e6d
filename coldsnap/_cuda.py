"""This host's CUDA devices and the NCCL library torch loads, asked of the CUDA driver
(cuda-bindings) and of NCCL itself, without importing torch.

A `coldsnap restore` in a new process needs these answers before anything starts: whether SGLang
serves on CUDA here, and the platform a capsule binds (compute capability, memory class, NCCL
version). Importing torch for them costs about 5 s on the H200 (the import and CUDA's
initialisation), more than the rest of the restore. The driver answers in milliseconds, and
`cuInit` makes no context (the orchestrator calls it anyway for the checkpoint API). Where
cuda-bindings is not installed, torch is asked: the same answers, the slow way.

The NCCL version is the one of the library the engine's torch loads (its wheel's
`nvidia/nccl/lib`, else the dynamic linker's `libnccl.so.2`), as NCCL reports it.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

from coldsnap._errors import OperationError

_NCCL = "libnccl.so.2"


def device_count() -> int:
    """How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 where the
    driver is missing or finds none, as `torch.cuda.is_available()` would say."""
    driver = _driver()
    if driver is None:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    (err,) = _tuple(driver.cuInit(0))
    if int(err) != 0:
        return 0
    err, count = _tuple(driver.cuDeviceGetCount())
    return int(count) if int(err) == 0 else 0


def device_properties(index: int) -> tuple[str, int]:
    """(`major.minor` compute capability, total memory in bytes) of device `index`."""
    driver = _driver()
    if driver is None:
        import torch

        major, minor = torch.cuda.get_device_capability(index)
        return f"{major}.{minor}", int(torch.cuda.get_device_properties(index).total_memory)
    attr = driver.CUdevice_attribute
    _check(driver, driver.cuInit(0), "cuInit")
    device = _check(driver, driver.cuDeviceGet(index), "cuDeviceGet")
    major = _check(
        driver,
        driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
        "cuDeviceGetAttribute",
    )
    minor = _check(
        driver,
        driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
        "cuDeviceGetAttribute",
    )
    total = _check(driver, driver.cuDeviceTotalMem(device), "cuDeviceTotalMem")
    return f"{int(major)}.{int(minor)}", int(total)


def nccl_version() -> str | None:
    """`major.minor.patch` of the NCCL library torch loads here; None where there is none."""
    library = _nccl_library()
    if library is None:
        return None
    code = ctypes.c_int(0)
    if library.ncclGetVersion(ctypes.byref(code)) != 0:
        return None
    value = code.value  # NCCL >= 2.9 encodes major*10000 + minor*100 + patch
    if value >= 10000:
        return f"{value // 10000}.{value // 100 % 100}.{value % 100}"
    return f"{value // 1000}.{value // 100 % 10}.{value % 100}"


def _nccl_library() -> ctypes.CDLL | None:
    for entry in sys.path:
        candidate = Path(entry or ".") / "nvidia" / "nccl" / "lib" / _NCCL
        if candidate.is_file():
            return ctypes.CDLL(str(candidate))
    try:
        return ctypes.CDLL(_NCCL)
    except OSError:
        return None


def _driver() -> Any:
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]
    except ImportError:
        return None
    return driver


def _tuple(result: Any) -> tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


class CudaQueryError(OperationError):
    """The CUDA driver refused a question about a device it listed."""


def _check(driver: Any, result: Any, call: str) -> Any:
    err, *values = _tuple(result)
    if int(err) != 0:
        raise CudaQueryError(f"{call} failed: {driver.CUresult(int(err)).name}")
    return values[0] if values else None


__all__ = ["CudaQueryError", "device_count", "device_properties", "nccl_version"]
