"""Recovery: refill a model from its pinned checkpoint, then restore the residual state, the
tensors a checkpoint does not hold (rotary `inv_freq`, an untied `lm_head` the checkpoint
omits, other derived buffers), which were captured as a small native pack at capture time.

Names map identically by default (Hugging Face models); `rename` maps a checkpoint key to a
destination name, or to None to skip it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path

import torch
from attrs import frozen
from safetensors import safe_open

from coldsnap.artifacts import Store

from .._errors import CheckpointError
from .._layout import Tensors, as_mapping, final_tensors
from ..native import ExportResult, PackSource, export_pack, hydrate_pack
from ._checkpoint import PinnedCheckpoint

Rename = Callable[[str], str | None]

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@frozen
class RecoveryReport:
    files: int
    loaded: int
    residual: int
    verify_seconds: float
    load_seconds: float


def recovery_tensors(tensors: Tensors) -> dict[str, torch.Tensor]:
    """The destination of a recovery: a module's parameters and all its buffers (persistent or
    not: derived buffers are part of the residual state), or the given mapping."""
    if isinstance(tensors, torch.nn.Module):
        return final_tensors(tensors, non_persistent=True)
    return as_mapping(tensors)


def checkpoint_keys(
    directory: str | os.PathLike[str], checkpoint: PinnedCheckpoint, rename: Rename | None = None
) -> dict[str, tuple[str, str]]:
    """destination name -> (file, key) for every tensor of the checkpoint's safetensors files."""
    out: dict[str, tuple[str, str]] = {}
    for f in checkpoint.weight_files:
        for target, key in _renamed_keys(Path(directory) / f.name, rename):
            out[target] = (f.name, key)
    return out


def _renamed_keys(path: Path, rename: Rename | None) -> Iterator[tuple[str, str]]:
    """(destination name, key) for every tensor of one safetensors file (its header only); a
    key `rename` maps to None is left out."""
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
            target = rename(key) if rename else key
            if target is not None:
                yield target, key


def view_key(t: torch.Tensor) -> tuple[object, ...]:
    """What makes two tensors the very same view of the same storage (a tied weight under its
    second name)."""
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())


def _covered(mapping: Mapping[str, torch.Tensor], loaded: set[str]) -> set[str]:
    """Names filled by loading `loaded`: those names, and every other name that is the very
    same view of the same storage."""
    keys = {view_key(mapping[n]) for n in loaded if n in mapping}
    return {n for n, t in mapping.items() if n in loaded or view_key(t) in keys}


def safetensors_keys(directory: str | os.PathLike[str], rename: Rename | None = None) -> set[str]:
    """Destination names of every tensor in the `*.safetensors` files of `directory` (headers
    only). For an engine that loaded an unpinned directory; CheckpointError when it holds none
    (a `.bin` checkpoint's names cannot be read without loading it)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"checkpoint {directory}", ["holds no *.safetensors file to read tensor names from"]
        )
    return {target for path in files for target, _ in _renamed_keys(path, rename)}


def residual_names(
    mapping: Mapping[str, torch.Tensor],
    keys: Iterable[str],
    *,
    loadable: Collection[str] | None = None,
) -> set[str]:
    """Names of `mapping` a load of the checkpoint `keys` leaves as they were: those it does not
    name, unless they are the very same view as a name it fills (a tied head). `loadable`
    limits which names a load can fill (an engine whose loader writes parameters only:
    a buffer is then residual even when the checkpoint names it)."""
    filled = {k for k in keys if k in mapping and (loadable is None or k in loadable)}
    return set(mapping) - _covered(mapping, filled)


def capture_residual(
    tensors: Tensors,
    directory: str | os.PathLike[str],
    checkpoint: PinnedCheckpoint,
    target: Store | str | os.PathLike[str],
    *,
    rename: Rename | None = None,
) -> ExportResult:
    """At capture: exports (as a native pack) every destination tensor the checkpoint does not
    fill, so a recovery can restore it after loading."""
    mapping = recovery_tensors(tensors)
    names = residual_names(mapping, checkpoint_keys(directory, checkpoint, rename))
    return export_pack({n: mapping[n] for n in names}, target)


def load_recovery(
    tensors: Tensors,
    directory: str | os.PathLike[str],
    checkpoint: PinnedCheckpoint,
    *,
    residual: PackSource | None = None,
    rename: Rename | None = None,
    verify: bool = True,
) -> RecoveryReport:
    """Verifies the pinned files, checks that checkpoint plus residual cover every destination
    tensor with the right shape and dtype (CheckpointError, nothing loaded, otherwise), copies
    the checkpoint tensors in place, then hydrates the residual pack. Post-load processing,
    if the engine has any, comes after this call."""
    start = time.perf_counter()
    if verify:
        checkpoint.verify(directory)
    verify_seconds = time.perf_counter() - start
    mapping = recovery_tensors(tensors)
    keys = checkpoint_keys(directory, checkpoint, rename)
    residual_names = set(residual.index.names()) if residual is not None else set()
    lines = [f"{n}: in the checkpoint, not in the model" for n in sorted(set(keys) - set(mapping))]
    lines += [
        f"{n}: in the residual state, not in the model"
        for n in sorted(residual_names - set(mapping))
    ]
    both = sorted(set(keys) & residual_names)
    lines += [f"{n}: in both the checkpoint and the residual state" for n in both]
    covered = _covered(mapping, set(keys) & set(mapping)) | residual_names
    lines += [
        f"{n}: not in the checkpoint and no residual state holds it"
        for n in sorted(set(mapping) - covered)
    ]
    plan: dict[str, list[tuple[str, str]]] = {}
    for name, (file, key) in sorted(keys.items()):
        if name not in mapping:
            continue
        with safe_open(str(Path(directory) / file), framework="pt") as handle:
            piece = handle.get_slice(key)
            shape, dtype = tuple(piece.get_shape()), _SAFETENSORS_DTYPES.get(piece.get_dtype())
        dest = mapping[name]
        if shape != tuple(dest.shape):
            lines.append(f"{name}: shape: expected {tuple(dest.shape)}, found {shape} in {file}")
        if dtype != dest.dtype:
            lines.append(
                f"{name}: dtype: expected {dest.dtype}, found {piece.get_dtype()} in {file}"
            )
        plan.setdefault(file, []).append((key, name))
    if lines:
        raise CheckpointError("the checkpoint does not fit the model (nothing was loaded):", lines)
    loaded = 0
    with torch.no_grad():
        for file, pairs in plan.items():
            with safe_open(str(Path(directory) / file), framework="pt") as handle:
                for key, name in pairs:
                    mapping[name].copy_(handle.get_tensor(key))
                    loaded += 1
    if residual is not None:
        hydrate_pack({n: mapping[n] for n in residual_names}, residual)
    return RecoveryReport(
        files=len(plan),
        loaded=loaded,
        residual=len(residual_names),
        verify_seconds=verify_seconds,
        load_seconds=time.perf_counter() - start - verify_seconds,
    )
