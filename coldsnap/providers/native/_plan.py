"""Matching a pack index against the destination tensors, before anything is read or written:
every name present on both sides, the same dtype, shape, stride, offset and storage size, and
the same aliasing. Any difference is reported, one line each, and nothing is copied."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from attrs import frozen

from .._errors import LayoutMismatch
from .._layout import StorageGroup, group_storages
from ._index import Extent, PackIndex

if TYPE_CHECKING:
    import torch


@frozen
class Job:
    """One extent and the destination storage it fills."""

    extent: Extent
    group: StorageGroup


def plan(index: PackIndex, mapping: Mapping[str, torch.Tensor]) -> list[Job]:
    groups = group_storages(mapping)
    by_name = {view.name: group for group in groups for view in group.views}
    wanted = set(index.names())
    lines = [
        f"{name}: in the pack, missing from the destination"
        for name in sorted(wanted - set(by_name))
    ]
    lines += [
        f"{name}: in the destination, not in the pack" for name in sorted(set(by_name) - wanted)
    ]
    jobs = []
    for extent in index.extents:
        targets = {id(by_name[v.name]): by_name[v.name] for v in extent.views if v.name in by_name}
        if not targets:
            continue
        if len(targets) > 1:
            names = ", ".join(v.name for v in extent.views)
            lines.append(
                f"{extent.name}: aliasing changed: {names} share one storage in the pack, "
                "not in the destination"
            )
            continue
        group = next(iter(targets.values()))
        names_here = {v.name for v in group.views}
        names_there = {v.name for v in extent.views}
        if names_here != names_there:
            lines.append(
                f"{extent.name}: aliasing changed: the pack's storage is viewed by "
                f"{sorted(names_there)}, the destination's by {sorted(names_here)}"
            )
            continue
        if group.nbytes != extent.nbytes:
            lines.append(
                f"{extent.name}: storage nbytes: expected {extent.nbytes}, found {group.nbytes}"
            )
        mine = {v.name: v for v in group.views}
        for view in extent.views:
            have = mine[view.name]
            for attr in ("dtype", "shape", "stride", "storage_offset"):
                want, found = getattr(view, attr), getattr(have, attr)
                if want != found:
                    lines.append(f"{view.name}: {attr}: expected {want}, found {found}")
        if group.device.type not in ("cpu", "cuda"):
            lines.append(f"{extent.name}: cannot hydrate a storage on device {group.device}")
        jobs.append(Job(extent, group))
    if lines:
        raise LayoutMismatch(
            "the destination does not match the pack (nothing was written):", lines
        )
    return jobs
