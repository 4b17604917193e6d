"""The identity an artifact is bound to: what must be the same at restore for the captured
process to be valid. Only portable facts: never a hostname, address, GPU UUID, PID or host path,
so the same capture restores on any host of the same build and shape."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

import attrs
from attrs import field, frozen

from ._names import digest_problem, exactly, member_name_problem

IDENTITY_FORMAT = 1
_HOST_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")


def _text(_: Any, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{attribute.name}: a non-empty string is required, got {value!r}")


def _portable(inst: Any, attribute: attrs.Attribute, value: object) -> None:
    """Rejects strings that would bind the artifact to one host's file system."""
    _text(inst, attribute, value)
    if _HOST_PATH.match(value):  # type: ignore[arg-type]
        raise ValueError(
            f"{attribute.name}: {value!r} is a host path; bind the hub id (org/name) instead"
        )


def _positive(_: Any, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name}: a positive integer is required, got {value!r}")


def _optional_positive(inst: Any, attribute: attrs.Attribute, value: object) -> None:
    if value is not None:
        _positive(inst, attribute, value)


def _optional_text(inst: Any, attribute: attrs.Attribute, value: object) -> None:
    if value is not None:
        _text(inst, attribute, value)


@frozen
class EngineBuild:
    """The engine and the digest of the engine sources and signatures the plugin relies on."""

    name: str = field(validator=_text)
    version: str = field(validator=_text)
    contract_digest: str = field(validator=_text)


@frozen
class FileDigest:
    """One checkpoint file by its name relative to the checkpoint root."""

    name: str = field()
    sha256: str = field()

    @name.validator
    def _check_name(self, _: attrs.Attribute, value: str) -> None:
        problem = member_name_problem(value)
        if problem:
            raise ValueError(f"name: {problem}")

    @sha256.validator
    def _check_sha(self, _: attrs.Attribute, value: str) -> None:
        problem = digest_problem(value)
        if problem:
            raise ValueError(f"sha256: {problem}")


def _files(value: object) -> tuple[FileDigest, ...]:
    files = tuple(sorted(value, key=lambda f: f.name))  # type: ignore[union-attr]
    names = [f.name for f in files]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"checkpoint: duplicate file names {duplicates}")
    return files


@frozen
class ModelBinding:
    """The weights the process was built from, and the layout of its final tensors."""

    model_id: str = field(validator=_portable)
    revision: str = field(validator=_portable)
    checkpoint: tuple[FileDigest, ...] = field(converter=_files)
    dtype: str = field(validator=_text)
    quantization: str = field(validator=_text)
    layout_digest: str = field(validator=_text)


@frozen
class Topology:
    """How the engine is spread: tensor and pipeline parallel sizes, this rank, the world."""

    tp: int = field(validator=_positive)
    pp: int = field(validator=_positive)
    rank: int = field()
    world_size: int = field(validator=_positive)

    @rank.validator
    def _check_rank(self, _: attrs.Attribute, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"rank: a non-negative integer is required, got {value!r}")
        if isinstance(self.world_size, int) and value >= self.world_size:
            raise ValueError(f"rank: {value} is not below world_size {self.world_size}")


@frozen
class Platform:
    """The accelerator stack, None where there is none (a CPU host)."""

    cuda_runtime: str | None = field(default=None, validator=_optional_text)
    driver_major: int | None = field(default=None, validator=_optional_positive)
    compute_capability: str | None = field(default=None, validator=_optional_text)
    capacity_gib: int | None = field(default=None, validator=_optional_positive)
    nccl_version: str | None = field(default=None, validator=_optional_text)


@frozen
class SnapshotDriver:
    """The driver that made the capture: n580 (pre-exec template) or n610 (process capsule)."""

    name: Literal["n580", "n610"] = field()
    version: str = field(validator=_text)

    @name.validator
    def _check_name(self, _: attrs.Attribute, value: str) -> None:
        if value not in ("n580", "n610"):
            raise ValueError(f"name: expected 'n580' or 'n610', found {value!r}")


@frozen
class Identity:
    """Everything a capture binds. Compare two with `check_compatible`."""

    KIND: ClassVar[str] = "coldsnap.identity"

    engine: EngineBuild
    plugin_digest: str = field(validator=_text)
    model: ModelBinding
    topology: Topology
    platform: Platform
    snapshot: SnapshotDriver
    format: int = field(default=IDENTITY_FORMAT, validator=exactly(IDENTITY_FORMAT))
    kind: str = field(default=KIND, validator=exactly(KIND))
