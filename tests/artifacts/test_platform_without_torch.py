"""The platform a capsule binds is read from the CUDA driver and NCCL, not through torch: a
fresh `coldsnap restore` on a GPU host paid about 5 s importing torch for it."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

import coldsnap._cuda as cuda
from coldsnap.artifacts import _collect

MAJOR, MINOR = 1, 2  # the fake's attribute codes for compute capability major and minor


class FakeDriver:
    """cuda.bindings.driver's calls that coldsnap._cuda makes, on one fake H200."""

    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=MINOR,
    )

    def __init__(self, devices: int = 1, init: int = 0) -> None:
        self.devices, self.init = devices, init

    def CUresult(self, code: int) -> Any:
        return SimpleNamespace(name=f"CUDA_ERROR_{code}")

    def cuInit(self, flags: int) -> tuple[int]:
        return (self.init,)

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return (0, self.devices)

    def cuDeviceGet(self, index: int) -> tuple[int, int]:
        return (0, index) if index < self.devices else (101, 0)

    def cuDeviceGetAttribute(self, attr: int, device: int) -> tuple[int, int]:
        return (0, {MAJOR: 9, MINOR: 0}[attr])

    def cuDeviceTotalMem(self, device: int) -> tuple[int, int]:
        return (0, 150_049_841_152)


def test_the_platform_of_a_cuda_build_comes_from_the_driver(monkeypatch):
    monkeypatch.setattr(_collect, "gpu_build", lambda: "cuda 12.9")
    monkeypatch.setattr(cuda, "_driver", lambda: FakeDriver())
    monkeypatch.setattr(_collect, "nccl_version", lambda: "2.27.3")
    monkeypatch.setattr(_collect, "_driver_major", lambda: 580)
    platform = _collect.collect_platform()
    assert platform.cuda_runtime == "12.9"
    assert platform.compute_capability == "9.0"
    assert platform.capacity_gib == 140
    assert platform.driver_major == 580
    assert platform.nccl_version == "2.27.3"


def test_a_host_whose_driver_finds_no_device_binds_the_runtime_only(monkeypatch):
    monkeypatch.setattr(_collect, "gpu_build", lambda: "cuda 12.9")
    monkeypatch.setattr(cuda, "_driver", lambda: FakeDriver(init=100))  # CUDA_ERROR_NO_DEVICE
    monkeypatch.setattr(_collect, "nccl_version", lambda: None)
    platform = _collect.collect_platform()
    assert (platform.cuda_runtime, platform.compute_capability) == ("12.9", None)


def test_a_device_the_driver_refuses_is_an_error_naming_the_call(monkeypatch):
    monkeypatch.setattr(cuda, "_driver", lambda: FakeDriver(devices=1))
    with pytest.raises(cuda.CudaQueryError, match="cuDeviceGet failed: CUDA_ERROR_101"):
        cuda.device_properties(3)


@pytest.mark.parametrize(
    ("code", "version"), [(22703, "2.27.3"), (21903, "2.19.3"), (2804, "2.8.4")]
)
def test_nccl_versions_are_decoded_as_nccl_encodes_them(monkeypatch, code, version):
    class Library:
        def ncclGetVersion(self, out: Any) -> int:
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int)).contents.value = code
            return 0

    monkeypatch.setattr(cuda, "_nccl_library", lambda: Library())
    assert cuda.nccl_version() == version


def test_the_platform_is_read_without_importing_torch(tmp_path):
    """In a fresh interpreter whose torch claims a CUDA build, reading the platform and asking
    whether SGLang serves on CUDA leave torch unimported."""
    code = textwrap.dedent(
        """
        import sys
        import coldsnap._cuda as cuda
        from coldsnap.artifacts import _collect
        import coldsnap.engines.sglang as sglang
        from tests.artifacts.test_platform_without_torch import FakeDriver
        _collect.gpu_build = sglang.gpu_build = lambda: "cuda 12.9"
        cuda._driver = lambda: FakeDriver()
        cuda._nccl_library = lambda: None
        assert _collect.collect_platform().compute_capability == "9.0"
        assert sglang.cuda_host() is True
        print("torch" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr
