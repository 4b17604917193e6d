"""The identity an artifact is bound to: what must be the same at restore for the captured
process to be valid. Only portable facts: never a hostname, address, GPU UUID, PID or host path,
so the same capture restores on any host of the same build and shape."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from attrs import field, frozen

from . import _validate as v
from ._names import digest_problem, member_name_problem

IDENTITY_FORMAT = 2
IDENTITY_READS = (1, 2)
"""Format 2 adds the engine's source digests (`EngineBuild.sources`); a format-1 identity has
none, and its engine build is taken again from the engine on admit."""


def _source_digests(_: object, attribute: Any, value: object) -> None:
    """file (a relative POSIX name) -> `sha256:` digest, every entry checked by name."""
    if not isinstance(value, dict):
        raise ValueError(f"{attribute.name}: a mapping of file to digest is required")
    for name, digest in value.items():
        why = member_name_problem(name) or digest_problem(digest)
        if why is not None:
            raise ValueError(f"{attribute.name}[{name}]: {why}")


@frozen
class EngineBuild:
    """The engine and the digest of the engine sources and signatures the plugin relies on.

    sources: the digest of each source file that digest (and the plugin's) is read from, named
    relative to the folder holding its top-level package: what lets admit check the install
    without importing the engine. Empty where the engine records none."""

    name: str = field(validator=v.text)
    version: str = field(validator=v.text)
    contract_digest: str = field(validator=v.text)
    sources: dict[str, str] = field(factory=dict, validator=_source_digests)


@frozen
class FileDigest:
    """One checkpoint file by its name relative to the checkpoint root, its sha256 and size.
    An identity binds the digest; a recovery pin also needs the size (a cheap first check),
    which identities written before it was recorded lack (None)."""

    name: str = field(validator=v.member_name)
    sha256: str = field(validator=v.digest)
    size: int | None = field(default=None, validator=v.optional(v.count))


@frozen
class ModelBinding:
    """The weights the process was built from, and the layout of its final tensors."""

    model_id: str = field(validator=v.portable)
    revision: str = field(validator=v.portable)
    checkpoint: tuple[FileDigest, ...] = field(converter=v.unique_names("checkpoint", sort=True))
    dtype: str = field(validator=v.text)
    quantization: str = field(validator=v.text)
    layout_digest: str = field(validator=v.text)


@frozen
class Topology:
    """How the engine is spread: tensor and pipeline parallel sizes, this rank, the world."""

    tp: int = field(validator=v.positive)
    pp: int = field(validator=v.positive)
    rank: int = field(validator=v.count)
    world_size: int = field(validator=v.positive)

    def __attrs_post_init__(self) -> None:
        if self.rank >= self.world_size:
            raise ValueError(f"rank: {self.rank} is not below world_size {self.world_size}")


@frozen
class Platform:
    """The accelerator stack, None where there is none (a CPU host)."""

    cuda_runtime: str | None = field(default=None, validator=v.optional(v.text))
    driver_major: int | None = field(default=None, validator=v.optional(v.positive))
    compute_capability: str | None = field(default=None, validator=v.optional(v.text))
    capacity_gib: int | None = field(default=None, validator=v.optional(v.positive))
    nccl_version: str | None = field(default=None, validator=v.optional(v.text))


@frozen
class SnapshotDriver:
    """The driver that made the capture, by its registered name (n580, n610 or a third party's):
    a record names the driver, it does not know how processes are snapshotted."""

    name: str = field(validator=v.matches(re.compile(r"[a-z][a-z0-9_]*"), "a driver's name"))
    version: str = field(validator=v.text)


def _sizes(value: object) -> tuple[int, ...]:
    """Sorted positive integers; ValueError naming the field otherwise."""
    items = tuple(value) if isinstance(value, list | tuple) else None
    if items is None or not all(type(n) is int and n > 0 for n in items):
        raise ValueError(f"shapes: expected a list of positive integers, got {value!r}")
    return tuple(sorted(items))


@frozen
class PhaseCoverage:
    """One graph phase of a capture: SGLang's backend and the shapes warmed before the snapshot
    (decode: batch sizes; prefill: token counts); none when the phase runs eagerly."""

    backend: str = field(validator=v.text)
    shapes: tuple[int, ...] = field(converter=_sizes)


@frozen
class ShapeCoverage:
    """The graph shapes the captured process holds warm, as the engine's plugin published them
    (each phase's warmed shapes equal to the engine's own plan, or the capture failed)."""

    device: str = field(validator=v.text)
    decode: PhaseCoverage
    prefill: PhaseCoverage


@frozen
class Identity:
    """Everything a capture binds. Compare two with `check_compatible`.

    draft: the speculative decoding draft model the engine serves with (None without one);
    shapes: the graph shapes warmed before the snapshot (None where the engine published none).
    """

    KIND: ClassVar[str] = "coldsnap.identity"

    engine: EngineBuild
    plugin_digest: str = field(validator=v.text)
    model: ModelBinding
    topology: Topology
    platform: Platform
    snapshot: SnapshotDriver
    draft: ModelBinding | None = None
    shapes: ShapeCoverage | None = None
    format: int = field(default=IDENTITY_FORMAT, validator=v.one_of(IDENTITY_READS))
    kind: str = field(default=KIND, validator=v.exactly(KIND))

    def __attrs_post_init__(self) -> None:
        if self.format < 2 and self.engine.sources:
            raise ValueError(f"engine.sources: a format-{self.format} identity cannot carry them")
