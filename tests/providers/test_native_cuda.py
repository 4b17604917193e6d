"""The CUDA path of the native provider (the registered mapping; the pinned ring where registration
is refused). Runs only on a GPU."""

from __future__ import annotations

import pytest
import torch

from coldsnap.providers import (
    Hydrator,
    LayoutMismatch,
    PackDamaged,
    PackDirectory,
    export_pack,
    hydrate_pack,
)

from .provider_helpers import data_ptrs, storage_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.xdist_group("host"),
]


def cuda_mapping(seed: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(3, 256, 64, generator=g).to(device)
    emb = torch.randn(1000, 64, generator=g).to(torch.bfloat16).to(device)
    return {
        "attn.qkv": fused,
        "attn.q": fused[0],
        "attn.v_t": fused[2].t(),
        "embed.weight": emb,
        "head.weight": emb,
        "codes": torch.randint(-128, 128, (12345,), generator=g, dtype=torch.int8).to(device),
        "big": torch.randn(5_000_000, generator=g).to(device),  # 20 MB: several ring slots
    }


def test_cuda_round_trip_is_bit_exact_and_in_place(tmp_path):
    src = cuda_mapping(1)
    export_pack(src, tmp_path / "p")
    dst = cuda_mapping(2)
    before = data_ptrs(dst)
    with Hydrator(threads=4, slot_bytes=1 << 20, cuda_slots=6) as hydrator:
        report = hydrator.hydrate(dst, PackDirectory(tmp_path / "p"))
        assert report.verified
        assert report.cuda_path == "registered"  # the GPU read the pack's pages itself
        assert data_ptrs(dst) == before
        assert storage_bytes(dst) == storage_bytes(src)
        again = cuda_mapping(3)
        hydrator.hydrate(again, PackDirectory(tmp_path / "p"))  # the ring is reused
        assert storage_bytes(again) == storage_bytes(src)


def test_a_refused_registration_copies_through_the_ring_and_says_so(tmp_path, monkeypatch):
    from coldsnap.providers.native import _cuda

    def refuse(self, i):
        raise _cuda.RegistrationRefused(f"cudaHostRegister of window {i}: refused by the test")

    monkeypatch.setattr(_cuda.RegisteredFile, "register", refuse)
    src = cuda_mapping(6)
    export_pack(src, tmp_path / "p")
    dst = cuda_mapping(7)
    before = data_ptrs(dst)
    report = hydrate_pack(dst, PackDirectory(tmp_path / "p"), verify=False)
    assert report.cuda_path.startswith("ring: cudaHostRegister of window 0")
    assert data_ptrs(dst) == before
    assert storage_bytes(dst) == storage_bytes(src)


def test_cpu_export_hydrates_into_cuda(tmp_path):
    src = cuda_mapping(4, device="cpu")
    export_pack(src, tmp_path / "p")
    dst = cuda_mapping(5)
    hydrate_pack(dst, PackDirectory(tmp_path / "p"))
    assert storage_bytes(dst) == storage_bytes(src)


def test_cuda_damage_and_mismatch_write_nothing(tmp_path):
    src = cuda_mapping(6)
    index = export_pack(src, tmp_path / "p").index
    dst = cuda_mapping(7)
    dst["head.weight"] = dst["head.weight"].clone()
    before = storage_bytes(dst)
    with pytest.raises(LayoutMismatch, match="aliasing"):
        hydrate_pack(dst, PackDirectory(tmp_path / "p"))
    assert storage_bytes(dst) == before
    dst = cuda_mapping(7)
    before = storage_bytes(dst)
    pack = tmp_path / "p" / (index.packs[0].digest.removeprefix("sha256:") + ".pack")
    with open(pack, "r+b") as handle:
        handle.seek(pack.stat().st_size - 10)
        handle.write(b"\x01\x02\x03")
    with pytest.raises(PackDamaged, match="checksum"):
        hydrate_pack(dst, PackDirectory(tmp_path / "p"))
    assert storage_bytes(dst) == before
