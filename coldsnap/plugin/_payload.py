"""Native payload export and hydration, through coldsnap's native weight provider.

The provider owns the pack format and decides which tensors make up a model's final state
(parameters and persistent buffers, every alias named); the plugin hands it the registered
module and a directory. A payload root holds one pack per rank and role:
`<root>/tp<rank>/<role>/` (index.json and the pack files).

Hydration is split so that everything that can refuse does so before the engine's memory is
touched: `prepare` reads the index, compares layouts and (unless preverified) checks every
block checksum; only then is the weights region resumed and `hydrate` copies, unverified.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from coldsnap._errors import PluginError

logger = logging.getLogger("coldsnap.plugin")

Rename = Callable[[str], str | None]


class PayloadRefused(PluginError, RuntimeError):
    """The payload cannot fill this model (missing, damaged, other layout); nothing changed."""


def pack_dir(root: Path | str, tp_rank: int, role: str) -> Path:
    return Path(root) / f"tp{tp_rank}" / role


def export(model: Any, dest: Path) -> dict[str, Any]:
    from coldsnap.providers.native import export_pack

    result = export_pack(model, dest)
    return {"path": str(dest), "nbytes": int(result.nbytes), "seconds": float(result.seconds)}


def prepare(model: Any, src: Path, *, verify: bool) -> tuple[Any, float]:
    """Opens and checks a pack for `model`; returns (source, verify seconds)."""
    from coldsnap.providers import ProviderError, layout_digest
    from coldsnap.providers.native import PackDirectory, verify_pack

    try:
        source = PackDirectory(src)
        want, have = source.index.layout_digest, layout_digest(model)
        if want != have:
            raise PayloadRefused(
                f"pack {src} was exported from another tensor layout ({want}; this model: {have})"
            )
        seconds = verify_pack(source) if verify else 0.0
    except ProviderError as exc:
        raise PayloadRefused(f"pack {src}: {exc}") from exc
    return source, seconds


def hydrate(model: Any, source: Any) -> dict[str, Any]:
    """Copies a prepared pack into the model's storages in place (already verified)."""
    from coldsnap.providers.native import hydrate_pack

    report = hydrate_pack(model, source, verify=False)
    return {
        "path": str(getattr(source, "path", "")),
        "nbytes": int(report.nbytes),
        "extents": int(report.extents),
        "copy_seconds": float(report.copy_seconds),
        "cuda_path": report.cuda_path,
    }


@attrs.frozen
class Residual:
    """Host copies of what a model's checkpoint does not hold (rotary caches and other buffers,
    parameters it omits), taken while the weights are intact and restored after every refill:
    a release leaves them zero (CPU pages returned, CUDA regions freed) and neither a recovery
    reload nor a native pack (persistent tensors only) writes them. (SGLang's release stashes
    the target's buffers itself; a draft model's buffers and parameters no checkpoint holds
    are only here.) The copies live in the scheduler's memory, so an n610 image carries them.

    `error` says why the checkpoint's names could not be read; a recovery is then refused.
    """

    role: str
    checkpoint: str
    copies: dict[str, Any] = attrs.field(eq=False, repr=False)  # one name per distinct view
    names: tuple[str, ...] = ()
    nbytes: int = 0
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "tensors": len(self.names),
            "names": list(self.names),
            "copies": len(self.copies),
            "nbytes": self.nbytes,
            "error": self.error,
        }


def _stacked_rename(model: Any) -> Rename | None:
    """Checkpoint name -> model name through the model's own fused-parameter table (SGLang's
    `stacked_params_mapping`: (fused param, checkpoint shard, shard id) rows, e.g. q_proj into
    qkv_proj, or the same table as `bitsandbytes_stacked_params_mapping`), the way its
    `load_weights` renames. None when the model has no such table: its
    fused parameters then count as residual (kept twice, never lost)."""
    rows = getattr(model, "stacked_params_mapping", None)
    if rows:
        pairs = [(str(row[1]), str(row[0])) for row in rows]
    else:  # the same table as {checkpoint shard: (fused param, shard index)}
        table = getattr(model, "bitsandbytes_stacked_params_mapping", None) or {}
        pairs = [(str(shard), str(row[0])) for shard, row in table.items()]
    if not pairs:
        return None

    def rename(key: str) -> str:
        for shard, fused in pairs:
            if shard in key:
                return key.replace(shard, fused)
        return key

    return rename


def keep_residual(role: str, model: Any, checkpoint: str) -> Residual:
    """Copies to host every tensor of `model` a reload of `checkpoint` would not write."""
    from coldsnap.providers import CheckpointError
    from coldsnap.providers.recovery import (
        recovery_tensors,
        residual_names,
        safetensors_keys,
        view_key,
    )

    mapping = recovery_tensors(model)
    try:
        keys = safetensors_keys(checkpoint, _stacked_rename(model))
        error = None
    except CheckpointError as exc:
        keys, error = set(), str(exc)
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    names = residual_names(mapping, keys, loadable=params)
    if error is not None:
        names -= params  # the parameters' coverage is unknown: a recovery is refused instead
    copies: dict[str, Any] = {}
    seen: set[tuple[object, ...]] = set()
    for name in sorted(names):
        tensor = mapping[name]
        key = view_key(tensor)
        if key in seen:
            continue
        seen.add(key)
        copies[name] = tensor.detach().to("cpu", copy=True)
    nbytes = sum(int(c.numel() * c.element_size()) for c in copies.values())
    return Residual(role, checkpoint, copies, tuple(sorted(names)), nbytes, error)


def restore_residual(model: Any, residual: Residual) -> dict[str, Any]:
    """Writes the kept copies back into the model's tensors, in place."""
    import torch

    from coldsnap.providers.recovery import recovery_tensors

    mapping = recovery_tensors(model)
    with torch.no_grad():
        for name, copy in residual.copies.items():
            live = mapping.get(name)
            if live is None or live.shape != copy.shape or live.dtype != copy.dtype:
                raise PayloadRefused(
                    f"residual tensor {name} of the {residual.role} model no longer fits "
                    f"(kept {tuple(copy.shape)} {copy.dtype})"
                )
            live.copy_(copy)
    return residual.summary()


# SGLang load format -> the checkpoint files it reads (LoadFormat: auto takes either).
_FORMAT_FILES = {
    "safetensors": ("*.safetensors",),
    "pt": ("*.bin", "*.pt"),
    "auto": ("*.safetensors", "*.bin", "*.pt"),
}


def check_load_format(checkpoint: str | Path, load_format: str) -> None:
    """Refuses (before any memory changes) a recovery whose checkpoint holds no file SGLang's
    `load_format` would read: the reload would fail after the weights region was resumed."""
    patterns = _FORMAT_FILES.get(load_format)
    if patterns is None:
        raise PayloadRefused(
            f"load format {load_format!r} is not one of: {', '.join(_FORMAT_FILES)}"
        )
    if not any(next(Path(checkpoint).glob(p), None) for p in patterns):
        raise PayloadRefused(
            f"checkpoint {checkpoint} holds no {' or '.join(patterns)} file for load format "
            f"{load_format!r}"
        )
