"""Export then hydrate is bit-exact and in place, for tiny Llama and Qwen3 models and for
hand-made mappings with shared storages."""

from __future__ import annotations

import pytest
import torch

from coldsnap.artifacts import Capsule, Store
from coldsnap.providers import (
    PREVERIFIED_ENV,
    Hydrator,
    PackDamaged,
    PackDirectory,
    StorePack,
    export_pack,
    final_tensors,
    hydrate_pack,
    import_pack,
    layout_digest,
    pack_members,
    verify_pack,
)

from .provider_helpers import data_ptrs, storage_bytes


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_model_round_trip_is_bit_exact_and_in_place(tmp_path, make_model, arch):
    source = make_model(arch, seed=1)
    dest = make_model(arch, seed=2)
    src_tensors, dst_tensors = final_tensors(source), final_tensors(dest)
    assert storage_bytes(src_tensors) != storage_bytes(dst_tensors)
    assert layout_digest(source) == layout_digest(dest)

    result = export_pack(source, tmp_path / "pack", block_bytes=16 << 10)
    index = result.index
    assert "lm_head.weight" in index.names()
    tied = [e for e in index.extents if len(e.views) > 1]
    assert [sorted(v.name for v in e.views) for e in tied] == [
        ["lm_head.weight", "model.embed_tokens.weight"]
    ]
    assert all(e.offset % 4096 == 0 for e in index.extents)
    assert {v.dtype for e in index.extents for v in e.views} == {"bfloat16", "float32", "int8"}
    assert not any("inv_freq" in name for name in index.names())  # non-persistent: excluded

    before = data_ptrs(dst_tensors)
    report = hydrate_pack(dest, PackDirectory(tmp_path / "pack"))
    assert report.verified and report.extents == len(index.extents)
    assert report.cuda_path == ""  # no CUDA storage: nothing went through the GPU path
    assert report.nbytes == sum(
        t.untyped_storage().nbytes()
        for t in {t.untyped_storage().data_ptr(): t for t in dst_tensors.values()}.values()
    )
    assert data_ptrs(dst_tensors) == before
    assert storage_bytes(dst_tensors) == storage_bytes(src_tensors)
    assert dest.lm_head.weight is dest.model.embed_tokens.weight
    # non-persistent buffers live in the process image, not in the pack: copy them to compare
    for name, buffer in final_tensors(dest, non_persistent=True).items():
        if name not in dst_tensors:
            buffer.copy_(final_tensors(source, non_persistent=True)[name])
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(source(ids).logits, dest(ids).logits)


def shared_mapping(seed: int) -> dict[str, torch.Tensor]:
    """Names that alias one storage in several ways: a fused buffer with q/k/v views, a
    transposed view, a tied pair, an int8 tensor, and an empty tensor."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(3, 16, 8, generator=g, dtype=torch.float32)
    emb = torch.randn(32, 8, generator=g).to(torch.bfloat16)
    return {
        "attn.qkv": fused,
        "attn.q": fused[0],
        "attn.k": fused[1],
        "attn.v_t": fused[2].t(),
        "embed.weight": emb,
        "head.weight": emb,
        "codes": torch.randint(-128, 128, (100,), generator=g, dtype=torch.int8),
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(3.5, dtype=torch.float32),
    }


def test_shared_storages_are_written_once_with_every_alias(tmp_path):
    src = shared_mapping(1)
    index = export_pack(src, tmp_path / "p").index
    by_name = {e.name: e for e in index.extents}
    assert sorted(v.name for v in by_name["attn.k"].views) == [
        "attn.k",
        "attn.q",
        "attn.qkv",
        "attn.v_t",
    ]
    assert len(index.extents) == 5
    v_t = next(v for v in by_name["attn.k"].views if v.name == "attn.v_t")
    assert v_t.stride == (1, 8) and v_t.storage_offset == 256
    dst = shared_mapping(2)
    before = data_ptrs(dst)
    hydrate_pack(dst, PackDirectory(tmp_path / "p"))
    assert data_ptrs(dst) == before
    assert storage_bytes(dst) == storage_bytes(src)
    assert torch.equal(dst["attn.v_t"], src["attn.v_t"])


def test_store_export_publish_and_hydrate(tmp_path, make_model):
    store = Store(tmp_path / "store")
    source, dest = make_model("llama", seed=3), make_model("llama", seed=4)
    result = export_pack(source, store)
    assert result.index_digest is not None and result.directory is None
    members = pack_members(store, result.index_digest)
    capsule_digest = store.publish(Capsule(members=members), tag="tiny-llama")
    assert store.verify().ok
    capsule = store.capsule("tiny-llama")
    index_member = capsule.by_role("pack-index")[0]
    report = hydrate_pack(dest, StorePack(store, index_member.digest))
    assert storage_bytes(final_tensors(dest)) == storage_bytes(final_tensors(source))
    assert report.nbytes == result.nbytes
    assert store.resolve("tiny-llama") == capsule_digest


def test_import_pack_adopts_an_export_directory(tmp_path, make_model):
    source = make_model("qwen3", seed=5)
    export_pack(source, tmp_path / "exp")
    store = Store(tmp_path / "store")
    index_digest = import_pack(store, tmp_path / "exp")
    assert not list((tmp_path / "exp").glob("*.pack"))  # moved, not copied
    dest = make_model("qwen3", seed=6)
    hydrate_pack(dest, StorePack(store, index_digest))
    assert storage_bytes(final_tensors(dest)) == storage_bytes(final_tensors(source))


def test_multiple_packs_and_a_reused_hydrator(tmp_path):
    src = {f"layer.{i}.w": torch.randn(1000 + i) for i in range(6)}
    index = export_pack(src, tmp_path / "p", pack_bytes=8 << 10).index
    assert len(index.packs) == 3
    written = {p.digest.removeprefix("sha256:") + ".pack" for p in index.packs}
    assert {p.name for p in (tmp_path / "p").iterdir()} == written | {"index.json"}  # no temps
    with Hydrator(threads=3, slot_bytes=4096) as hydrator:
        for seed in (1, 2):
            torch.manual_seed(seed)
            dst = {name: torch.randn_like(t) for name, t in src.items()}
            hydrator.hydrate(dst, PackDirectory(tmp_path / "p"))
            assert all(torch.equal(dst[n], src[n]) for n in src)
        hydrator.verify(PackDirectory(tmp_path / "p"))


def test_packs_written_in_parallel_equal_those_written_one_by_one(tmp_path):
    src = {f"layer.{i}.w": torch.randn(3000 + 7 * i) for i in range(9)}
    one = export_pack(src, tmp_path / "one", pack_bytes=16 << 10, threads=1).index
    many = export_pack(src, tmp_path / "many", pack_bytes=16 << 10, threads=4).index
    assert len(many.packs) > 2
    assert many == one  # same packs, same extents, in the same order


def test_preverified_skips_verification_only_when_asked(tmp_path, monkeypatch):
    src = {"w": torch.arange(4096, dtype=torch.float32)}
    index = export_pack(src, tmp_path / "p").index
    pack = tmp_path / "p" / (index.packs[0].digest.removeprefix("sha256:") + ".pack")
    with open(pack, "r+b") as handle:
        handle.seek(8)
        handle.write(b"\x7f")
    dst = {"w": torch.zeros(4096)}
    monkeypatch.setenv(PREVERIFIED_ENV, "1")  # read by the plugin's settings only, not here
    with pytest.raises(PackDamaged, match="checksum"):
        hydrate_pack(dst, PackDirectory(tmp_path / "p"))
    report = hydrate_pack(dst, PackDirectory(tmp_path / "p"), verify=False)
    assert not report.verified and report.verify_seconds == 0.0
    assert not torch.equal(dst["w"], src["w"])  # the flipped byte went through unchecked
    monkeypatch.delenv(PREVERIFIED_ENV)
    with pytest.raises(PackDamaged, match="checksum"):
        verify_pack(PackDirectory(tmp_path / "p"))


def test_layout_digest_sees_aliasing():
    a = {"x": torch.zeros(4), "y": torch.zeros(4)}
    shared = torch.zeros(4)
    b = {"x": shared, "y": shared}
    assert layout_digest(a) != layout_digest(b)
    assert layout_digest(a) == layout_digest({"x": torch.ones(4), "y": torch.ones(4)})
