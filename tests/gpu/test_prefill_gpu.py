"""The prefill helper on a GPU: a real helper process puts a pack on the device, the consumer
copies it device to device into storages at their own addresses, bit for bit, and the helper
exits once its memory was taken."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from coldsnap.plugin import _payload
from coldsnap.providers import PackDirectory, export_pack
from coldsnap.providers.native import _prefill

pytestmark = pytest.mark.gpu


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(3, 512, 256, generator=g)
    return {
        "qkv": fused.cuda(),
        "emb": torch.randn(1000, 64, generator=g).to(torch.bfloat16).cuda(),
        "big": torch.randn(40_000_000, generator=g).cuda(),  # 160 MB
    }


def test_a_prefilled_pack_lands_device_to_device(tmp_path: Path) -> None:
    src = _tensors(1)
    export_pack(src, tmp_path / "payload" / "tp0" / "target", pack_bytes=64 << 20)
    roles = _prefill.rank_roles(tmp_path / "payload")[0]
    out = tmp_path / "prefill" / "tp0"
    helper = subprocess.Popen(_prefill.command(roles, out, 0, 60.0))
    try:
        dst = _tensors(2)
        before = {n: t.data_ptr() for n, t in dst.items()}
        summary = _payload.hydrate(dst, PackDirectory(roles["target"]), out / "target")
        assert summary["cuda_path"] == "prefill", summary
        assert summary["prefill"] == "consumed"
        torch.cuda.synchronize()
        assert all(torch.equal(dst[n], src[n]) for n in src)
        assert {n: t.data_ptr() for n, t in dst.items()} == before
        assert helper.wait(timeout=30) == 0  # its memory taken, it ends by itself
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
