"""The KV cache region on CPU: host tensors allocated inside `region(kv_cache)` give their pages
back at pause(kv_cache) and come back zero-filled; nothing else is touched."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import torch

from coldsnap._wire import KV_CACHE, WEIGHTS
from coldsnap.plugin import ColdsnapMemorySaverAdapter, HostDiscardBackend, StorageRegistry

MB = 1 << 20


class _Saver:
    """SGLang's adapter on CPU: the memory saver disabled, regions are plain blocks."""

    enabled = False

    @contextmanager
    def region(self, tag: str, enable_cpu_backup: bool = False) -> Iterator[None]:
        yield

    def pause(self, tag: str) -> None:
        pass

    def resume(self, tag: str) -> None:
        pass


def _adapter(live_backing: str = "discard") -> ColdsnapMemorySaverAdapter:
    return ColdsnapMemorySaverAdapter(
        _Saver(), live_backing=live_backing, host=HostDiscardBackend(StorageRegistry())
    )


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def test_kv_pools_give_their_pages_back_and_come_back_zero() -> None:
    adapter = _adapter()
    outside = torch.ones(4 * MB, dtype=torch.uint8)
    with adapter.region(KV_CACHE):
        k = [torch.zeros(8 * MB, dtype=torch.uint8) for _ in range(2)]  # like SGLang's k_buffer
        flat = k[0].view(-1)  # a view allocates nothing
        outside.add_(1)  # in place on a tensor from outside: not an allocation
    for buffer in k:
        buffer.fill_(7)  # served requests wrote the pool
    pointers = [b.data_ptr() for b in k]
    before = _rss()
    adapter.pause(KV_CACHE)
    freed = adapter.host.region_bytes[KV_CACHE]
    assert 2 * 8 * MB - 4 * 4096 <= freed <= 2 * 8 * MB
    assert before - _rss() >= freed // 2  # the pages are gone (others may allocate meanwhile)
    assert [b.data_ptr() for b in k] == pointers  # same addresses
    adapter.resume(KV_CACHE)
    inner = slice(4096, 8 * MB - 4096)  # whole pages inside each storage
    assert all(int(b[inner].max()) == 0 for b in k)
    assert int(flat[inner].max()) == 0
    assert bool((outside == 2).all())  # allocated outside the region: kept


def test_other_regions_backups_and_kept_backings_record_nothing() -> None:
    for live_backing, tag, backup in [
        ("discard", WEIGHTS, False),  # weights go through the storage registry
        ("discard", KV_CACHE, True),  # a region with a CPU backup keeps its bytes
        ("cpu", KV_CACHE, False),  # the cpu backing keeps host memory resident
    ]:
        adapter = _adapter(live_backing)
        with adapter.region(tag, enable_cpu_backup=backup):
            pool = torch.full((4 * MB,), 5, dtype=torch.uint8)
        adapter.pause(tag)
        assert bool((pool == 5).all()), (live_backing, tag, backup)
        assert adapter.host.region_bytes.get(tag, 0) == 0, (live_backing, tag, backup)


def test_a_pool_that_died_is_skipped() -> None:
    adapter = _adapter()
    with adapter.region(KV_CACHE):
        pool = torch.zeros(4 * MB, dtype=torch.uint8)
    del pool
    adapter.pause(KV_CACHE)
    assert adapter.host.region_bytes[KV_CACHE] == 0
