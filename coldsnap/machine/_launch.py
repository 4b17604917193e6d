"""What a driver needs from the engine adapter to start the engine (a command line, the modules
a template should import first), and what the engine must start with (a weight source the
provider chose): never the engine's internals, nor a provider's name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from attrs import asdict, field, frozen
from attrs.validators import in_, instance_of, optional

from ._errors import DefinitionError, RequestError
from ._steps import WEIGHT_SOURCE


def _as_tuple(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


def _as_env(value: Mapping[str, str]) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()}


@frozen(kw_only=True)
class LaunchCommand:
    """How to start an engine: argv and the environment it adds, and the URL it will serve."""

    argv: tuple[str, ...] = field(converter=_as_tuple)
    env: dict[str, str] = field(factory=dict, converter=_as_env)
    url: str
    cwd: str | None = None


PAYLOAD = "payload"
CHECKPOINT = "checkpoint"
SOURCES = (PAYLOAD, CHECKPOINT)

_path = optional(instance_of(str))


class WeightSourceError(DefinitionError, ValueError):
    """A weight source that is malformed; the message names the field."""


@frozen(kw_only=True)
class WeightSource:
    """What the engine starts with, as the provider chose it (fact `weight_source`).

    payload: the engine's own final storages. At capture the engine exports them on release
        into a directory it picks (`payload_dir` None); at restore it refills them from
        `payload_dir`, which `preverified` says the provider verified block by block.
    checkpoint: the engine loads `checkpoint` (and a speculative draft model from its own
        `draft_checkpoint`) through its ordinary loader.
    """

    source: Literal["payload", "checkpoint"] = field(validator=in_(SOURCES))
    payload_dir: str | None = field(default=None, validator=_path)
    checkpoint: str | None = field(default=None, validator=_path)
    draft_checkpoint: str | None = field(default=None, validator=_path)
    preverified: bool = field(default=False, validator=instance_of(bool))

    def __attrs_post_init__(self) -> None:
        if self.source == CHECKPOINT and not self.checkpoint:
            raise WeightSourceError("weight source field 'checkpoint': required for a checkpoint")
        if self.source == PAYLOAD and (self.checkpoint or self.draft_checkpoint):
            raise WeightSourceError(
                "weight source field 'checkpoint': a payload source names no checkpoint"
            )
        if self.payload_dir and not os.path.isabs(self.payload_dir):
            raise WeightSourceError(
                f"weight source field 'payload_dir': {self.payload_dir!r} is not an absolute path"
            )

    @property
    def payload(self) -> bool:
        return self.source == PAYLOAD

    def to_fact(self) -> dict[str, Any]:
        """The JSON-able form the journal keeps."""
        return asdict(self)

    @classmethod
    def from_fact(cls, data: Any) -> WeightSource:
        """The record a `to_fact()` wrote; WeightSourceError naming an unknown, missing or
        mistyped field."""
        if isinstance(data, WeightSource):
            return data
        if not isinstance(data, Mapping):
            raise WeightSourceError(f"weight source: expected an object, got {type(data).__name__}")
        try:
            return cls(**{str(k): v for k, v in data.items()})
        except (TypeError, ValueError) as exc:
            if isinstance(exc, WeightSourceError):
                raise
            raise WeightSourceError(f"weight source is malformed: {exc}") from None


class CommandLineError(RequestError):
    """A launch command line coldsnap cannot capture; each problem names the flag (or the
    command) and why."""


@frozen(kw_only=True)
class LaunchLine:
    """What a user's launch command line asks for, in a capture request's terms (the engine
    adapter reads it: `Engine.parse_command_line`)."""

    model_path: str
    tp: int
    engine_args: tuple[str, ...] = field(converter=_as_tuple)
    host: str | None
    """The user's listening host, which coldsnap does not use at capture (None: not given)."""
    port: int | None
    """The user's port, which coldsnap does not use at capture (None: not given)."""
    program: str
    """How the command started, as the engine spells it."""
    owned: tuple[str, ...] = field(converter=_as_tuple)
    """The engine's flags coldsnap sets itself (where it listens), as the user would write them."""
    draft_path: str | None = None
    """The speculative draft model, if any."""
    draft_revision: str | None = None


@frozen(kw_only=True)
class InstalledBuild:
    """What the engine adapter says about the engine installed here, by value: everything the
    store binds into a capsule and checks on admit (`Engine.build()`)."""

    engine: str
    version: str
    contract: str
    """Digest of the runtime contract the adapter relies on in this build."""
    plugin_digest: str
    """Digest of the code coldsnap runs inside the engine, with the contract variants in use."""
    variants: dict[str, str] = field(factory=dict)
    """contract -> the variant of it this build uses (what `contract` and `plugin_digest` fold
    in)."""
    sources: dict[str, str] = field(factory=dict)
    """source file -> its sha256 digest: the files `contract` and `plugin_digest` are read
    from, each named relative to the folder the import path finds its top-level package in
    (`sglang/srt/managers/scheduler.py`). An engine that records them can check a capsule's
    build against the install by hashing those files, without importing the engine
    (`Engine.build(recorded)`); empty for one that does not."""


@runtime_checkable
class Launcher(Protocol):
    """Builds the engine's command for an operation. `workdir` is the operation's folder;
    `weights` is what the engine must start with (the provider chose it: fact `weight_source`).

    `template_preload` lists the modules an n580 template imports before it is dumped;
    `forkserver_preload` those its forkserver imports so the engine's children start warm (None:
    the engine starts no children, no forkserver).

    `runtime_dir`: the engine's runtime dir (COLDSNAP_RUNTIME_DIR) when the driver has one
    already, made by the driver; None: a fresh one the launcher makes. A process keeps the
    environment it was started with, so an engine built inside a process started earlier (an
    n580 template) must use the runtime dir that process carries: it is what tells its
    processes apart (status, stop) and where its plugin writes its files."""

    template_preload: tuple[str, ...]
    forkserver_preload: tuple[str, ...] | None

    def command(
        self,
        request: Any,
        workdir: Path,
        *,
        weights: WeightSource,
        runtime_dir: Path | None = None,
    ) -> LaunchCommand: ...


def launch_weights(ctx: Any) -> WeightSource:
    """The weight source a driver's launch step hands the launcher: the step's `weight_source`
    fact (made by the provider's `launch_weights` at capture, by its `stage` at restore)."""
    return WeightSource.from_fact(ctx.facts[WEIGHT_SOURCE.name])
