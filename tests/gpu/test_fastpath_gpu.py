"""The registered-mapping hydration of the native provider's CUDA module: bit-exact, in place,
and a damaged block is caught while copying."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("host")]


def mapping(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(3000, 512, generator=g).to(torch.bfloat16).cuda()
    fused = torch.randn(3, 1024, 512, generator=g).cuda()
    return {
        "embed.weight": emb,
        "head.weight": emb,
        "qkv": fused,
        "q": fused[0],
        "big": torch.randn(80_000_000, generator=g).cuda(),  # 320 MB: several windows
    }


def raw(m: dict[str, torch.Tensor]) -> list[bytes]:
    seen, out = set(), []
    for t in m.values():
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            flat = torch.empty(0, dtype=torch.uint8, device="cuda").set_(s, 0, (s.nbytes(),), (1,))
            out.append(flat.cpu().numpy().tobytes())
    return out


@pytest.mark.parametrize("verify", [False, True])
def test_registered_hydration_is_bit_exact_and_in_place(tmp_path, verify):
    from coldsnap.providers import PackDirectory, export_pack
    from coldsnap.providers.native import _cuda as fastpath

    src = mapping(1)
    export_pack(src, tmp_path / "p")
    dst = mapping(2)
    ptrs = {n: t.data_ptr() for n, t in dst.items()}
    report = fastpath.hydrate_registered(
        dst, PackDirectory(tmp_path / "p"), verify=verify, window_bytes=64 << 20
    )
    assert report.windows > 1
    assert {n: t.data_ptr() for n, t in dst.items()} == ptrs
    assert raw(dst) == raw(src)


def test_a_damaged_block_fails_the_hydration(tmp_path):
    from coldsnap.providers import HydrationFailed, PackDirectory, export_pack
    from coldsnap.providers.native import _cuda as fastpath

    index = export_pack(mapping(3), tmp_path / "p").index
    pack = tmp_path / "p" / (index.packs[0].digest.removeprefix("sha256:") + ".pack")
    with open(pack, "r+b") as handle:
        handle.seek(pack.stat().st_size // 2)
        handle.write(b"\xff\x00\xff")
    with pytest.raises(HydrationFailed, match="checksum"):
        fastpath.hydrate_registered(mapping(4), PackDirectory(tmp_path / "p"), verify=True)
