"""The registry of final model storages (target and drafts) in one scheduler process.

A model is registered right after SGLang's loader returns it, i.e. after post-load processing.
SGLang may still replace tensors after that while it serves: a rotary `cos_sin_cache` recast to
the activation dtype on first use (at the first forward, or during CUDA-graph capture), a cache
grown for longer positions. So a release registers the model again as it serves then
(`refresh`, which names what moved), and exports and frees that. Between a release and the
hydration that refills it nothing may move: there, and at a restore's start-up hydration, the
live model is checked against the registration, so a tensor replaced meanwhile fails closed
instead of hydrating the wrong memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from coldsnap._errors import PluginError


class RegistryError(PluginError, RuntimeError):
    """The live model no longer matches its registration (or nothing was registered)."""


@attrs.frozen
class TensorRecord:
    name: str
    kind: str  # parameter | buffer | nonpersistent_buffer
    device: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_ptr: int
    storage_nbytes: int
    offset_bytes: int
    nbytes: int


def _named_state(model: Any) -> Iterator[tuple[str, str, Any]]:
    """Parameters and buffers, each once (tied weights appear under their first name)."""
    nonpersistent: set[str] = set()
    for module_name, module in model.named_modules():
        for buf in getattr(module, "_non_persistent_buffers_set", ()):
            nonpersistent.add(f"{module_name}.{buf}" if module_name else buf)
    for name, p in model.named_parameters():
        yield name, "parameter", p
    for name, b in model.named_buffers():
        yield name, ("nonpersistent_buffer" if name in nonpersistent else "buffer"), b


def _record(name: str, kind: str, t: Any) -> TensorRecord:
    storage = t.untyped_storage()
    return TensorRecord(
        name=name,
        kind=kind,
        device=str(t.device),
        dtype=str(t.dtype).removeprefix("torch."),
        shape=tuple(t.shape),
        stride=tuple(t.stride()),
        storage_ptr=int(storage.data_ptr()),
        storage_nbytes=int(storage.nbytes()),
        offset_bytes=int(t.storage_offset() * t.element_size()),
        nbytes=int(t.numel() * t.element_size()),
    )


@attrs.define
class RegisteredModel:
    role: str  # "target", or "draft" (+ index when a spec worker has several)
    model: Any
    records: tuple[TensorRecord, ...]

    def live_records(self) -> tuple[TensorRecord, ...]:
        return tuple(_record(n, k, t) for n, k, t in _named_state(self.model))

    def check_live(self) -> None:
        """Raises naming the first tensor whose storage, shape or dtype moved since registration."""
        live = {r.name: r for r in self.live_records()}
        known = {r.name: r for r in self.records}
        for name in sorted(set(live) ^ set(known)):
            where = "appeared" if name in live else "disappeared"
            raise RegistryError(f"{self.role} model: tensor '{name}' {where} after registration")
        for name, rec in known.items():
            if live[name] != rec:
                raise RegistryError(
                    f"{self.role} model: tensor '{name}' changed after registration "
                    f"(registered {rec}, live {live[name]})"
                )

    def refresh(self) -> tuple[str, ...]:
        """Registers the live model as it is now (what the engine serves with); returns one
        line per tensor that appeared, disappeared or moved (storage, dtype, shape) since the
        previous registration, empty when none did."""
        live = self.live_records()
        before = {r.name: r for r in self.records}
        after = {r.name: r for r in live}
        changes = [f"'{n}' appeared" for n in sorted(set(after) - set(before))]
        changes += [f"'{n}' disappeared" for n in sorted(set(before) - set(after))]
        changes += [
            f"'{n}' {_moved(before[n], after[n])}"
            for n in sorted(set(before) & set(after))
            if before[n] != after[n]
        ]
        self.records = live
        return tuple(changes)

    def tensors(self, *, persistent_only: bool = True) -> dict[str, Any]:
        """name -> live tensor: parameters and (persistent) buffers, the export/hydrate set."""
        return {
            n: t
            for n, k, t in _named_state(self.model)
            if not (persistent_only and k == "nonpersistent_buffer")
        }

    def storages(self) -> dict[int, tuple[Any, list[tuple[int, int]]]]:
        """storage ptr -> (one tensor on it, byte extents covered by registered tensors)."""
        out: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        for _n, _k, t in _named_state(self.model):
            if t.numel() == 0:
                continue
            s = t.untyped_storage()
            start = int(t.storage_offset() * t.element_size())
            extent = (start, start + _span_bytes(t))
            entry = out.setdefault(int(s.data_ptr()), (t, []))
            entry[1].append(extent)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of all registered storages (parameters and buffers), each storage once."""
        return _storage_bytes(self.records)

    @property
    def parameter_nbytes(self) -> int:
        return _storage_bytes(r for r in self.records if r.kind == "parameter")

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "tensors": len(self.records),
            "storages": len({r.storage_ptr for r in self.records}),
            "nbytes": self.nbytes,
            "parameter_nbytes": self.parameter_nbytes,
            "devices": sorted({r.device for r in self.records}),
        }


def _moved(old: TensorRecord, new: TensorRecord) -> str:
    """What differs between two records of one tensor, e.g. `float32 -> bfloat16, storage
    0x7f.. -> 0x7e..`."""
    parts = [
        f"{field} {getattr(old, field)} -> {getattr(new, field)}"
        for field in ("dtype", "shape", "device")
        if getattr(old, field) != getattr(new, field)
    ]
    if old.storage_ptr != new.storage_ptr:
        parts.append(f"storage {old.storage_ptr:#x} -> {new.storage_ptr:#x}")
    elif (old.offset_bytes, old.stride) != (new.offset_bytes, new.stride):
        parts.append("view moved within its storage")
    return ", ".join(parts) or "changed"


def _storage_bytes(records: Any) -> int:
    seen: dict[int, int] = {}
    for r in records:
        seen[r.storage_ptr] = r.storage_nbytes
    return sum(seen.values())


def _span_bytes(t: Any) -> int:
    """Bytes from the first to one past the last element (strided views included)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


class StorageRegistry:
    """Per-process registry; one entry per role."""

    def __init__(self) -> None:
        self._models: dict[str, RegisteredModel] = {}

    def register(self, role: str, model: Any) -> RegisteredModel:
        records = tuple(_record(n, k, t) for n, k, t in _named_state(model))
        entry = RegisteredModel(role=role, model=model, records=records)
        self._models[role] = entry
        return entry

    def get(self, role: str) -> RegisteredModel:
        try:
            return self._models[role]
        except KeyError:
            raise RegistryError(f"no {role} model was registered in this process") from None

    def roles(self) -> tuple[str, ...]:
        return tuple(self._models)

    def models(self) -> tuple[RegisteredModel, ...]:
        return tuple(self._models.values())

    def clear(self) -> None:
        self._models.clear()


REGISTRY = StorageRegistry()
