"""The final storages of a model and their layout: which named tensors view which storage, with
what dtype, shape, stride and offset. Both providers describe destinations this way, and the
layout digest an identity binds is computed here."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from attrs import field, frozen

from coldsnap.artifacts import validate

from ._errors import LayoutMismatch

if TYPE_CHECKING:
    import torch

    Tensors = Mapping[str, torch.Tensor] | torch.nn.Module
else:
    Tensors = Any  # torch is imported where tensors are handled, not to read an index

DTYPE_SIZES: dict[str, int] = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex32": 4, "complex64": 8, "complex128": 16,
    "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2fnuz": 1, "float8_e4m3fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "bits1x8": 1, "bits2x4": 1, "bits4x2": 1, "bits8": 1, "bits16": 2,
    "uint1": 1, "uint2": 1, "uint3": 1, "uint4": 1, "uint5": 1, "uint6": 1, "uint7": 1,
    "int1": 1, "int2": 1, "int3": 1, "int4": 1, "int5": 1, "int6": 1, "int7": 1,
}  # fmt: skip
"""torch's dtypes by the name a pack index writes (`str(dtype)` without `torch.`) and their
element size in bytes. A table, not torch's own: reading and verifying a pack (a restore's
stage, in the orchestrator) needs no torch, whose import costs 1.5-2 s. A test checks that it
names every dtype of the installed torch with its size."""
_NAME = re.compile(r"[A-Za-z0-9_:+-]+(\.[A-Za-z0-9_:+-]+)*")


def name_problem(value: object) -> str | None:
    """Tensor names are dotted attribute paths: no `/`, no empty or `..` segment."""
    if not isinstance(value, str):
        return f"a tensor name is a string, got {type(value).__name__}"
    if len(value) > 1024 or not _NAME.fullmatch(value):
        return f"{value!r} is not a tensor name (dotted segments of [A-Za-z0-9_:+-])"
    return None


def _dtype_problem(value: object) -> str | None:
    return None if value in DTYPE_SIZES else f"unknown dtype {value!r}"


_dims = attrs.validators.deep_iterable(validate.count, attrs.validators.max_len(64))


@frozen
class TensorView:
    """One named tensor as a view of its storage (`storage_offset` in elements)."""

    name: str = field(validator=validate.problem(name_problem))
    dtype: str = field(validator=validate.problem(_dtype_problem))
    shape: tuple[int, ...] = field(converter=tuple, validator=_dims)
    stride: tuple[int, ...] = field(converter=tuple, validator=_dims)
    storage_offset: int = field(validator=validate.count)

    def __attrs_post_init__(self) -> None:
        if len(self.shape) != len(self.stride):
            raise ValueError(
                f"{self.name}: shape {self.shape} and stride {self.stride} differ in rank"
            )

    @property
    def end_byte(self) -> int:
        """One past the last byte of the storage this view touches (0 for an empty view)."""
        if any(s == 0 for s in self.shape):
            return 0
        last = self.storage_offset + sum(
            (s - 1) * st for s, st in zip(self.shape, self.stride, strict=False)
        )
        return (last + 1) * DTYPE_SIZES[self.dtype]


def view_of(name: str, tensor: torch.Tensor) -> TensorView:
    return TensorView(
        name=name,
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        storage_offset=tensor.storage_offset(),
    )


@frozen
class StorageGroup:
    """One storage of the destination and every name that views it (sorted by name)."""

    nbytes: int
    device: torch.device
    views: tuple[TensorView, ...]
    tensor: torch.Tensor = field(eq=False, repr=False)

    @property
    def name(self) -> str:
        return self.views[0].name

    def data_ptr(self) -> int:
        return self.tensor.untyped_storage().data_ptr()

    def bytes_view(self) -> torch.Tensor:
        """A flat uint8 tensor over the whole storage, on its device (no copy)."""
        import torch

        storage = self.tensor.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8, device=storage.device)
        return flat.set_(storage, 0, (storage.nbytes(),), (1,))


def final_tensors(
    module: torch.nn.Module, *, non_persistent: bool = False
) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers of `module` under every name they have (a tied weight
    appears under each of its names). With non_persistent=True, buffers the state dict leaves
    out (rotary `inv_freq` and the like) are included too."""
    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        out[name] = param
    for name, buffer in module.named_buffers(remove_duplicate=False):
        if buffer is None:
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        if non_persistent or leaf not in owner._non_persistent_buffers_set:
            out[name] = buffer
    return out


def as_mapping(tensors: Tensors) -> dict[str, torch.Tensor]:
    """A name -> tensor mapping from a module (its final tensors) or a mapping (checked)."""
    import torch

    if isinstance(tensors, torch.nn.Module):
        return final_tensors(tensors)
    problems = []
    for name, tensor in tensors.items():
        if problem := name_problem(name):
            problems.append(problem)
        elif not isinstance(tensor, torch.Tensor):
            problems.append(f"{name}: not a tensor ({type(tensor).__name__})")
        elif tensor.layout != torch.strided or tensor.is_quantized or tensor.device.type == "meta":
            problems.append(f"{name}: only dense strided tensors with storage can be exported")
    if problems:
        raise LayoutMismatch("the tensors cannot be described:", problems)
    return dict(tensors)


def group_storages(mapping: Mapping[str, torch.Tensor]) -> list[StorageGroup]:
    """The storages behind `mapping`, each once, with all its names; sorted by first name.
    Distinct storages must not overlap in memory (they would be written twice)."""
    groups: dict[tuple[str, int], list[tuple[str, torch.Tensor]]] = {}
    for name in sorted(mapping):
        tensor = mapping[name]
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        # empty storages all have address 0: each one is its own group
        key = (str(tensor.device), ptr if storage.nbytes() else -len(groups) - 1)
        groups.setdefault(key, []).append((name, tensor))
    out = []
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for (device, ptr), members in groups.items():
        tensor = members[0][1]
        nbytes = tensor.untyped_storage().nbytes()
        out.append(
            StorageGroup(
                nbytes=nbytes,
                device=tensor.device,
                views=tuple(view_of(n, t) for n, t in members),
                tensor=tensor,
            )
        )
        if nbytes:
            spans.setdefault(device, []).append((ptr, ptr + nbytes, members[0][0]))
    overlaps = []
    for device_spans in spans.values():
        device_spans.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(device_spans):
            if start < end:
                overlaps.append(f"{a} and {b}: distinct storages overlap in memory")
    if overlaps:
        raise LayoutMismatch("the tensors cannot be described:", overlaps)
    out.sort(key=lambda g: g.name)
    return out


def layout_of(views_and_sizes: Iterable[tuple[Iterable[TensorView], int]]) -> list[Any]:
    """The canonical layout: per storage its size and sorted views, storages sorted by name."""
    rows = []
    for views, nbytes in views_and_sizes:
        ordered = sorted(views, key=lambda v: v.name)
        rows.append(
            [
                nbytes,
                [
                    [v.name, v.dtype, list(v.shape), list(v.stride), v.storage_offset]
                    for v in ordered
                ],
            ]
        )
    rows.sort(key=lambda row: row[1][0][0] if row[1] else "")
    return rows


def layout_digest(tensors: Tensors | list[StorageGroup]) -> str:
    """The tensor layout digest (names, dtypes, shapes, strides, offsets, storage sizes and
    aliasing) an identity binds; equal for equal layouts whatever the tensors hold."""
    groups = tensors if isinstance(tensors, list) else group_storages(as_mapping(tensors))
    rows = layout_of((g.views, g.nbytes) for g in groups)
    return digest_of_rows(rows)


def digest_of_rows(rows: list[Any]) -> str:
    text = json.dumps(rows, separators=(",", ":"), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(text).hexdigest()
